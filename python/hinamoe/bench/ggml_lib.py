"""llama.cpp's ggml, loaded with ctypes: where the shared libraries are, and
the C functions ``hina-bench ffn``'s ggml column calls.

ggml is not a dependency: it comes with llama-cpp-python built from source
(its wheel directory ``llama_cpp/lib`` holds ``libggml-base.so``,
``libggml-cpu.so`` and ``libggml.so``), or from any llama.cpp build. Only
opaque pointers, ints and floats cross the boundary, plus the three-field
``struct ggml_init_params`` (passed by value); the signatures are those of
the ggml headers installed with llama-cpp-python 0.3.36 (``ggml.h``,
``ggml-cpu.h``, ``ggml-backend.h``, ``ggml-alloc.h``), which have been stable
for these functions since the CPU backend API (2024). ``ggml_swiglu_split``
and ``ggml_argsort_top_k`` are newer: without them the graph uses
``silu(gate) * up`` and ``ggml_top_k``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
from pathlib import Path

ENV_VAR = "HINAMOE_GGML_LIB"
HOW_TO_GET = (
    "build llama-cpp-python from source into this environment (several minutes):\n"
    "  CMAKE_ARGS=\"-DGGML_NATIVE=ON\" CMAKE_BUILD_PARALLEL_LEVEL=2 \\\n"
    "    pip install --no-binary llama-cpp-python llama-cpp-python\n"
    f"or point --ggml-lib (or {ENV_VAR}) at a directory holding libggml.so, libggml-base.so "
    "and libggml-cpu.so from a llama.cpp build")

# ggml_type values (ggml.h)
TYPE_F32, TYPE_F16, TYPE_I32, TYPE_BF16 = 0, 1, 26, 30
TYPES = {"f32": TYPE_F32, "f16": TYPE_F16, "bf16": TYPE_BF16}
STATUS_SUCCESS = 0
LIBS = ("libggml-base.so", "libggml-cpu.so", "libggml.so")  # load order: dependencies first


class GgmlUnavailable(RuntimeError):
    """libggml was not found or lacks a function the benchmark needs; the
    message says why, and HOW_TO_GET how to get it."""


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


def _llama_cpp_lib_dir() -> Path | None:
    """llama_cpp/lib of an installed llama-cpp-python, found without
    importing it (that would load libllama too)."""
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        d = Path(loc) / "lib"
        if (d / "libggml.so").exists():
            return d
    return None


def find_lib_dir(path: str | os.PathLike | None = None) -> tuple[Path | None, str]:
    """The directory of the ggml libraries and where it came from: `path`
    (a directory, or one of the .so files in it), else $HINAMOE_GGML_LIB,
    else an installed llama-cpp-python. (None, why) when none is found."""
    for given, what in ((path, "--ggml-lib"), (os.environ.get(ENV_VAR), ENV_VAR)):
        if given:
            d = Path(given)
            d = d.parent if d.is_file() else d
            missing = [name for name in LIBS if not (d / name).exists()]
            if missing:
                return None, f"{what}={given}: no {', '.join(missing)} in {d}"
            return d, f"{what} {d}"
    d = _llama_cpp_lib_dir()
    if d is not None:
        return d, f"llama-cpp-python ({d})"
    return None, "libggml not found (no --ggml-lib, no $%s, no llama-cpp-python with libggml.so)" % ENV_VAR


_P = ctypes.c_void_p
_I64 = ctypes.c_int64
# name: (restype, argtypes); every function the benchmark calls
_SIGNATURES = {
    "ggml_version": (ctypes.c_char_p, []),
    "ggml_commit": (ctypes.c_char_p, []),
    "ggml_init": (_P, [InitParams]),
    "ggml_free": (None, [_P]),
    "ggml_tensor_overhead": (ctypes.c_size_t, []),
    "ggml_graph_overhead_custom": (ctypes.c_size_t, [ctypes.c_size_t, ctypes.c_bool]),
    "ggml_new_graph_custom": (_P, [_P, ctypes.c_size_t, ctypes.c_bool]),
    "ggml_new_tensor_2d": (_P, [_P, ctypes.c_int, _I64, _I64]),
    "ggml_new_tensor_3d": (_P, [_P, ctypes.c_int, _I64, _I64, _I64]),
    "ggml_set_input": (None, [_P]),
    "ggml_set_output": (None, [_P]),
    "ggml_nbytes": (ctypes.c_size_t, [_P]),
    "ggml_soft_max": (_P, [_P, _P]),
    "ggml_reshape_2d": (_P, [_P, _P, _I64, _I64]),
    "ggml_reshape_3d": (_P, [_P, _P, _I64, _I64, _I64]),
    "ggml_get_rows": (_P, [_P, _P, _P]),
    "ggml_sum_rows": (_P, [_P, _P]),
    "ggml_clamp": (_P, [_P, _P, ctypes.c_float, ctypes.c_float]),
    "ggml_div": (_P, [_P, _P, _P]),
    "ggml_mul": (_P, [_P, _P, _P]),
    "ggml_add": (_P, [_P, _P, _P]),
    "ggml_silu": (_P, [_P, _P]),
    "ggml_cont": (_P, [_P, _P]),
    "ggml_view_2d": (_P, [_P, _P, _I64, _I64, ctypes.c_size_t, ctypes.c_size_t]),
    "ggml_mul_mat_id": (_P, [_P, _P, _P, _P]),
    "ggml_top_k": (_P, [_P, _P, ctypes.c_int]),
    "ggml_build_forward_expand": (None, [_P, _P]),
    "ggml_backend_cpu_init": (_P, []),
    "ggml_backend_cpu_set_n_threads": (None, [_P, ctypes.c_int]),
    "ggml_backend_free": (None, [_P]),
    "ggml_backend_graph_compute": (ctypes.c_int, [_P, _P]),
    "ggml_backend_cpu_buffer_from_ptr": (_P, [_P, ctypes.c_size_t]),
    "ggml_backend_cpu_buffer_type": (_P, []),
    "ggml_backend_tensor_alloc": (ctypes.c_int, [_P, _P, _P]),
    "ggml_backend_alloc_ctx_tensors_from_buft": (_P, [_P, _P]),
    "ggml_backend_buffer_free": (None, [_P]),
    "ggml_backend_tensor_set": (None, [_P, _P, ctypes.c_size_t, ctypes.c_size_t]),
    "ggml_backend_tensor_get": (None, [_P, _P, ctypes.c_size_t, ctypes.c_size_t]),
}
# newer functions, used when present
_OPTIONAL = {
    "ggml_swiglu_split": (_P, [_P, _P, _P]),
    "ggml_argsort_top_k": (_P, [_P, _P, ctypes.c_int]),
}


_CPU_FEATURES = ("avx2", "fma", "f16c", "avx512", "avx512_bf16", "avx512_vnni", "amx_int8")


class Ggml:
    """The loaded libraries: ``g.fn.<name>(...)`` calls a ggml function;
    ``g.has(name)`` says whether an optional one exists."""

    def __init__(self, lib_dir: Path, origin: str = ""):
        self.lib_dir, self.origin = Path(lib_dir), origin
        self._dlls = []
        try:
            for name in LIBS:  # RTLD_GLOBAL: libggml.so resolves the others' symbols
                self._dlls.append(ctypes.CDLL(str(self.lib_dir / name), mode=ctypes.RTLD_GLOBAL))
        except OSError as exc:
            raise GgmlUnavailable(f"cannot load ggml from {self.lib_dir}: {exc}") from exc
        self.fn = _Functions()
        missing = []
        for table, required in ((_SIGNATURES, True), (_OPTIONAL, False)):
            for name, (res, args) in table.items():
                f = self._lookup(name)
                if f is None:
                    if required:
                        missing.append(name)
                    continue
                f.restype, f.argtypes = res, args
                setattr(self.fn, name, f)
        if missing:
            raise GgmlUnavailable(f"ggml in {self.lib_dir} lacks {', '.join(missing)} (too old?)")
        self.version = (self.fn.ggml_version() or b"?").decode()
        self.commit = (self.fn.ggml_commit() or b"?").decode()
        self.cpu_features = self._cpu_features()

    def _cpu_features(self) -> list[str]:
        """The SIMD extensions this ggml build was compiled for and uses here
        (ggml_cpu_has_*): with -DGGML_NATIVE=ON on an AVX-512 machine ggml's
        bf16/f16/f32 dot products are AVX-512 code, as HinaMoE's avx512 tier
        is (not its avx2 tier)."""
        out = []
        for name in _CPU_FEATURES:
            f = self._lookup(f"ggml_cpu_has_{name}")
            if f is not None:
                f.restype, f.argtypes = ctypes.c_int, []
                if f():
                    out.append(name)
        return out

    def _lookup(self, name: str):
        for dll in reversed(self._dlls):
            try:
                return getattr(dll, name)
            except AttributeError:
                continue
        return None

    def has(self, name: str) -> bool:
        return hasattr(self.fn, name)

    def describe(self) -> str:
        return (f"ggml {self.version} ({self.commit}) from {self.origin or self.lib_dir}; "
                f"its CPU kernels use: {' '.join(self.cpu_features) or '-'}")


class _Functions:
    pass


_loaded: dict[Path, Ggml] = {}


def load(path: str | os.PathLike | None = None) -> Ggml:
    """The ggml libraries (see find_lib_dir), loaded once per directory;
    raises GgmlUnavailable with the reason."""
    d, origin = find_lib_dir(path)
    if d is None:
        raise GgmlUnavailable(origin)
    d = d.resolve()
    if d not in _loaded:
        _loaded[d] = Ggml(d, origin)
    return _loaded[d]
