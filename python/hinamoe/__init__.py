"""HinaMoE: an ONNX Runtime execution provider for Mixture-of-Experts on CPUs.

    import onnxruntime as ort, hinamoe
    sess = ort.InferenceSession("model.onnx", providers=["HinaMoE"])

Importing the package registers the EP library with ONNX Runtime (once).
"""
from __future__ import annotations

import threading
from pathlib import Path

import onnxruntime as _ort

__version__ = "0.1.0"
__all__ = [
    "get_library_path", "get_ep_name", "get_ep_names", "register", "get_ep_devices",
    "best_tier", "gqa_tier", "tier_unavailable_reason", "measure_read_bandwidth", "ReadProbe", "measure_fma_peak",
    "measure_tile_peak",
    "numa_plan", "NumaPlan", "numa_nodes",
]

_EP_NAME = "HinaMoE"
_LIB_NAME = "libhinamoe_ep.so"
_lock = threading.Lock()
_registered = False


def get_library_path() -> str:
    """Absolute path of the plugin EP shared library."""
    path = Path(__file__).resolve().parent / _LIB_NAME
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: was hinamoe installed with `pip install .`?")
    return str(path)


def get_ep_name() -> str:
    """The name to put in `providers=[...]`."""
    return _EP_NAME


def get_ep_names() -> list[str]:
    """All EP names this library provides (one)."""
    return [_EP_NAME]


def register() -> None:
    """Registers the EP library with ONNX Runtime. Safe to call again."""
    global _registered
    with _lock:
        if _registered:
            return
        if any(d.ep_name == _EP_NAME for d in _ort.get_ep_devices()):
            _registered = True  # someone registered it already (e.g. another import path)
            return
        # Register under the factory's own name: that is the name providers=[...] matches.
        _ort.register_execution_provider_library(_EP_NAME, get_library_path())
        _registered = True


def get_ep_devices() -> list:
    """The OrtEpDevice entries of HinaMoE (their ep_metadata names the ISA tier)."""
    register()
    return [d for d in _ort.get_ep_devices() if d.ep_name == _EP_NAME]


from ._native import (NumaPlan, ReadProbe, best_tier, gqa_tier, measure_fma_peak, measure_tile_peak,  # noqa: E402
                      measure_read_bandwidth, numa_nodes, numa_plan, tier_unavailable_reason)

register()
