"""ctypes bindings to libhinamoe_kernels.so, the operator library's C ABI
(usable without ONNX Runtime: CPU tier detection, read-bandwidth and FMA-rate
probes, a persistent read probe, the NUMA segment planner)."""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path


@functools.lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    path = Path(__file__).resolve().parent / "libhinamoe_kernels.so"
    lib = ctypes.CDLL(str(path))
    lib.hinamoe_read_bandwidth_gbs.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_int]
    lib.hinamoe_read_bandwidth_gbs.restype = ctypes.c_double
    lib.hinamoe_read_probe_create.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                                              ctypes.c_char_p, ctypes.c_size_t]
    lib.hinamoe_read_probe_create.restype = ctypes.c_int
    lib.hinamoe_read_probe_pass_gbs.argtypes = [ctypes.c_void_p]
    lib.hinamoe_read_probe_pass_gbs.restype = ctypes.c_double
    lib.hinamoe_read_probe_bytes.argtypes = [ctypes.c_void_p]
    lib.hinamoe_read_probe_bytes.restype = ctypes.c_size_t
    lib.hinamoe_read_probe_free.argtypes = [ctypes.c_void_p]
    lib.hinamoe_read_probe_free.restype = None
    lib.hinamoe_tile_peak_per_s.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.hinamoe_tile_peak_per_s.restype = ctypes.c_double
    lib.hinamoe_fma_peak_per_s.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.hinamoe_fma_peak_per_s.restype = ctypes.c_double
    lib.hinamoe_best_tier.argtypes = []
    lib.hinamoe_best_tier.restype = ctypes.c_char_p
    lib.hinamoe_tier_unavailable_reason.argtypes = [ctypes.c_char_p]
    lib.hinamoe_tier_unavailable_reason.restype = ctypes.c_char_p
    lib.hinamoe_gqa_tier.argtypes = [ctypes.c_char_p]
    lib.hinamoe_gqa_tier.restype = ctypes.c_char_p
    return lib


def best_tier() -> str:
    """The kernel tier `isa=auto` picks on this CPU (e.g. "avx2")."""
    return _lib().hinamoe_best_tier().decode()


def gqa_tier(isa: str = "auto") -> str:
    """The GroupQueryAttention kernel tier option `isa` runs on this CPU ("" if
    it cannot run here). It can differ from the MoE tier: "auto" on an AMX
    CPU keeps GQA on "avx2", the faster measured there."""
    return _lib().hinamoe_gqa_tier(isa.encode()).decode()


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


class ReadProbe:
    """A read-bandwidth probe to sample many times: about `nbytes` are
    allocated and first touched once, split over `threads` reader threads
    that stay alive (asleep between passes). `pass_gbs()` times one pass of
    all threads over the whole buffer. A benchmark takes one pass after each
    timed run to compare the run with the bandwidth of the same moment.

        with hinamoe.ReadProbe(256 << 20, threads=2) as probe:
            gbs = probe.pass_gbs()

    `nbytes` is what one pass actually streams (the request rounded down to
    whole 256 B per thread, at least 4 KiB per thread)."""

    def __init__(self, nbytes: int, threads: int = 2):
        self._handle = None
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"ReadProbe: nbytes must be a positive int, got {nbytes!r}")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"ReadProbe: threads must be an int >= 1, got {threads!r}")
        lib = _lib()
        handle = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        rc = lib.hinamoe_read_probe_create(nbytes, threads, ctypes.byref(handle), err, len(err))
        if rc == 1:
            raise ValueError(f"ReadProbe: {err.value.decode().removeprefix('read probe: ')}")
        if rc != 0:
            raise MemoryError(err.value.decode())
        self._handle = handle
        self.threads = threads
        self.nbytes = int(lib.hinamoe_read_probe_bytes(handle))

    def pass_gbs(self) -> float:
        """One timed pass over the buffer by all threads, in GB/s (1e9 B/s)."""
        if self._handle is None:
            raise ValueError("ReadProbe is closed")
        gbs = _lib().hinamoe_read_probe_pass_gbs(self._handle)
        if not gbs > 0:
            raise RuntimeError("read-bandwidth probe pass failed")
        return float(gbs)

    def close(self) -> None:
        """Joins the reader threads and frees the buffer (idempotent)."""
        if self._handle is not None:
            _lib().hinamoe_read_probe_free(self._handle)
            self._handle = None

    def __enter__(self) -> "ReadProbe":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the library may be gone
            pass


def measure_tile_peak(threads: int = 2, kind: str = "bf16") -> float:
    """AMX multiply-adds per second that `threads` threads reach together
    with TDPBF16PS (kind "bf16") or TDPBUSD ("int8"): the compute roofline of
    the tile kernels. At n tokens per expert, weights cannot stream faster
    than this / n elements per second."""
    if kind not in ("bf16", "int8"):
        raise ValueError(f"kind={kind!r}: 'bf16' or 'int8'")
    rate = _lib().hinamoe_tile_peak_per_s(threads, 1 if kind == "int8" else 0)
    if not rate > 0:
        raise RuntimeError(f"tile-rate probe needs AMX ({tier_unavailable_reason('amx') or 'AMX-INT8'})")
    return float(rate)


def measure_fma_peak(threads: int = 2, bits: int = 256) -> float:
    """Float FMAs per second (counting each lane: a 256-bit FMA is 8) that
    `threads` threads reach together on `bits`-wide vectors (256: the avx2
    tier's, 512: the avx512 tier's): the compute roofline. At n tokens per
    expert, weights cannot stream faster than this / n elements per second."""
    if bits not in (256, 512):
        raise ValueError(f"bits={bits}: 256 or 512")
    rate = _lib().hinamoe_fma_peak_per_s(threads, bits)
    if not rate > 0:
        raise RuntimeError(f"FMA-rate probe needs {'AVX-512F' if bits == 512 else 'AVX2/FMA'}")
    return float(rate)


@dataclass(frozen=True)
class NumaPlan:
    """Which elements of a weight [rows, cols] each NUMA node holds under page
    interleaving, over one row period (the pattern repeats every
    `period_rows` rows). `segments[n]` lists node n's (row, k_start, k_end)
    half-open element ranges for rows 0..period_rows-1."""

    rows: int
    cols: int
    dtype: str
    nodes: int
    page_size: int
    offset: int
    period_rows: int
    segments: list[list[tuple[int, int, int]]]


def numa_plan(rows: int, cols: int, dtype: str, nodes: int, page_size: int = 4096,
              offset: int = 0) -> NumaPlan:
    """The segment table HinaMoE partitions a weight by (paper §5).

    dtype: "f32", "f16", "bf16", "int8" or "int4"; offset: bytes from the start
    of the buffer's first page (assumed on node 0) to the weight."""
    f = _lib().hinamoe_numa_plan
    f.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_char_p, ctypes.c_int, ctypes.c_int64,
                  ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64),
                  ctypes.POINTER(ctypes.c_int64), ctypes.c_int64, ctypes.c_char_p, ctypes.c_size_t]
    f.restype = ctypes.c_int
    if not 1 <= nodes <= 1024:
        raise ValueError(f"nodes={nodes} must be in [1, 1024]")
    period = ctypes.c_int64()
    counts = (ctypes.c_int64 * nodes)()
    err = ctypes.create_string_buffer(512)
    args = (rows, cols, dtype.encode(), nodes, page_size, offset, ctypes.byref(period), counts)
    if f(*args, None, 0, err, len(err)) != 0:
        raise ValueError(err.value.decode())
    total = sum(counts)
    segs = (ctypes.c_int64 * (3 * max(total, 1)))()
    if f(*args, segs, total, err, len(err)) != 0:
        raise ValueError(err.value.decode())
    out, i = [], 0
    for n in range(nodes):
        out.append([(segs[3 * j], segs[3 * j + 1], segs[3 * j + 2]) for j in range(i, i + counts[n])])
        i += counts[n]
    return NumaPlan(rows, cols, dtype, nodes, page_size, offset, period.value, out)


def numa_nodes(topology: str = "auto") -> int:
    """NUMA nodes of a topology as HinaMoE sees it: "auto"/"sysfs" (this
    machine), "fake:2|4|8" (simulated) or "off" (1)."""
    f = _lib().hinamoe_numa_nodes
    f.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    f.restype = ctypes.c_int
    err = ctypes.create_string_buffer(512)
    n = f(topology.encode(), err, len(err))
    if n < 0:
        raise ValueError(err.value.decode())
    return n
