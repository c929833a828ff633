"""ctypes bindings to libhinamoe_kernels.so, the operator library's C ABI
(usable without ONNX Runtime: CPU tier detection, a read-bandwidth probe)."""
from __future__ import annotations

import ctypes
import functools
from pathlib import Path


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    path = Path(__file__).resolve().parent / "libhinamoe_kernels.so"
    lib = ctypes.CDLL(str(path))
    lib.hinamoe_read_bandwidth_gbs.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    lib.hinamoe_read_bandwidth_gbs.restype = ctypes.c_double
    lib.hinamoe_best_tier.argtypes = []
    lib.hinamoe_best_tier.restype = ctypes.c_char_p
    lib.hinamoe_tier_unavailable_reason.argtypes = [ctypes.c_char_p]
    lib.hinamoe_tier_unavailable_reason.restype = ctypes.c_char_p
    return lib


def best_tier() -> str:
    """The kernel tier `isa=auto` picks on this CPU (e.g. "avx2")."""
    return _lib().hinamoe_best_tier().decode()


def tier_unavailable_reason(name: str) -> str:
    """Why tier `name` cannot run on this CPU; "" when it can."""
    return _lib().hinamoe_tier_unavailable_reason(name.encode()).decode()


def measure_read_bandwidth(threads: int = 2, nbytes: int = 1 << 30, repeats: int = 5) -> float:
    """Median memory read bandwidth in GB/s (1e9 B/s) over `repeats` passes of
    `nbytes`, streamed by `threads` threads with vector loads."""
    gbs = _lib().hinamoe_read_bandwidth_gbs(nbytes, threads, repeats)
    if not gbs > 0:
        raise RuntimeError("read-bandwidth probe failed")
    return float(gbs)
