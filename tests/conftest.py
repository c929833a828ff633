"""Shared pytest setup for the HinaMoE Python tests.

* Makes ``hinamoe.models`` importable both when the package is installed
  (``pip install .``) and from a bare checkout (falls back to ``<repo>/models``).
* One random seed per run (``HINAMOE_TEST_SEED`` to replay); it is printed in
  the header and each test's rng is derived from it and the test id.
* ``ep`` fixture: skips EP tests when the HinaMoE library is not built, unless
  ``HINAMOE_REQUIRE_EP=1`` (then that is a failure).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import secrets
import sys
import types
import zlib
from pathlib import Path

import numpy as np
import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

# ------------------------------------------------------------ hinamoe import

_HINAMOE_IMPORT_ERROR: str | None = None


def _setup_models_import() -> None:
    """Make ``import hinamoe.models`` work and remember why the EP package
    ``hinamoe`` could not be imported, if it could not.

    The checkout's ``models/`` and ``python/hinamoe/bench/`` are preferred
    (pure Python: edits are tested without a reinstall);
    ``HINAMOE_TEST_INSTALLED_MODELS=1`` uses the installed copies.
    """
    global _HINAMOE_IMPORT_ERROR
    try:
        importlib.import_module("hinamoe")
    except Exception as exc:  # not built / not installed
        _HINAMOE_IMPORT_ERROR = f"{type(exc).__name__}: {exc}"
        sys.modules.pop("hinamoe", None)
        stub = types.ModuleType("hinamoe")
        stub.__path__ = []  # only .models inside
        stub.__hinamoe_stub__ = True
        sys.modules["hinamoe"] = stub
    use_installed = os.environ.get("HINAMOE_TEST_INSTALLED_MODELS") == "1"
    for sub, local in (("models", REPO_ROOT / "models" / "__init__.py"),
                       ("bench", REPO_ROOT / "python" / "hinamoe" / "bench" / "__init__.py")):
        name = f"hinamoe.{sub}"
        if local.exists() and not use_installed:
            spec = importlib.util.spec_from_file_location(
                name, local, submodule_search_locations=[str(local.parent)])
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
            setattr(sys.modules["hinamoe"], sub, mod)
        elif sub == "models":
            importlib.import_module(name)


_setup_models_import()

# ------------------------------------------------------------ seed


def _base_seed() -> int:
    env = os.environ.get("HINAMOE_TEST_SEED")
    if env:
        return int(env, 0)
    return secrets.randbits(32)


BASE_SEED = _base_seed()


def pytest_report_header(config):
    return [f"hinamoe test seed: {BASE_SEED} (replay: HINAMOE_TEST_SEED={BASE_SEED})"]


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running tests (deselected by default)")


def seed_for(nodeid: str) -> int:
    return (BASE_SEED ^ zlib.crc32(nodeid.encode())) & 0xFFFFFFFF


@pytest.fixture
def seed(request, record_property) -> int:
    s = seed_for(request.node.nodeid)
    record_property("seed", s)
    print(f"[seed] {request.node.nodeid}: base {BASE_SEED}, test {s}")
    return s


@pytest.fixture
def rng(seed) -> np.random.Generator:
    return np.random.default_rng(seed)


# ------------------------------------------------------------ EP availability

_EP_STATE: dict = {}


def ep_status() -> tuple[bool, str]:
    """(available, reason) for the HinaMoE EP, probed once per run."""
    if "ok" in _EP_STATE:
        return _EP_STATE["ok"], _EP_STATE["why"]
    ok, why = False, ""
    try:
        hinamoe = importlib.import_module("hinamoe")
        if getattr(hinamoe, "__hinamoe_stub__", False):
            raise ImportError(_HINAMOE_IMPORT_ERROR or "hinamoe is not installed")
        hinamoe.register()
        lib = hinamoe.get_library_path()
        if not os.path.exists(lib):
            raise FileNotFoundError(lib)
        import onnxruntime as ort
        from hinamoe.models import MoEConfig, build_moe_model

        model, _ = build_moe_model(MoEConfig(hidden=16, inter=8, experts=2, k=1,
                                             activation="relu"), seed=0)
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=[hinamoe.get_ep_name()])
        if sess.get_providers()[0] != "HinaMoE":
            raise RuntimeError(f"session providers are {sess.get_providers()}")
        ok = True
    except Exception as exc:  # noqa: BLE001 - report any reason
        why = f"HinaMoE EP not available: {type(exc).__name__}: {exc}"
    _EP_STATE.update(ok=ok, why=why)
    return ok, why


def require_ep():
    ok, why = ep_status()
    if not ok:
        if os.environ.get("HINAMOE_REQUIRE_EP") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return importlib.import_module("hinamoe")


@pytest.fixture
def hinamoe_mod():
    """The imported ``hinamoe`` package with a working EP (else skip)."""
    return require_ep()


def available_isas() -> list[str]:
    ok, _ = ep_status()
    if not ok:
        return ["ref", "avx2"]  # tests skip anyway
    hm = importlib.import_module("hinamoe")
    isas = ["ref"]
    reason = getattr(hm, "tier_unavailable_reason", None)
    if reason is not None:
        if not reason("avx2"):
            isas.append("avx2")
    elif hm.best_tier() in ("avx2", "avx512", "amx"):
        isas.append("avx2")
    return isas


def require_isa(isa: str) -> None:
    require_ep()
    if isa not in available_isas():
        pytest.skip(f"isa {isa} not available on this CPU")


# ------------------------------------------------------------ sessions


def session_options(threads: int = 1, no_fallback: bool = True, profile_prefix: str | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if no_fallback:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


def hina_session(model, isa: str = "auto", threads: int = 1, no_fallback: bool = True,
                 profile_prefix: str | None = None, cpu_fallback_provider: bool = False):
    """A session on HinaMoE (``model``: ModelProto, bytes or path)."""
    import onnxruntime as ort

    from hinamoe.models import model_source

    src = model_source(model) if hasattr(model, "graph") else model
    providers = [("HinaMoE", {"isa": isa})]
    if cpu_fallback_provider:
        providers.append("CPUExecutionProvider")
    so = session_options(threads, no_fallback, profile_prefix)
    sess = ort.InferenceSession(src, so, providers=providers)
    return sess


def cpu_session(model, threads: int = 1, profile_prefix: str | None = None):
    import onnxruntime as ort

    from hinamoe.models import model_source

    src = model_source(model) if hasattr(model, "graph") else model
    so = session_options(threads, no_fallback=False, profile_prefix=profile_prefix)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def profile_node_providers(path: str) -> dict[str, str]:
    """``{op_name: provider}`` from an ORT profiling JSON (kernel events)."""
    with open(path) as f:
        events = json.load(f)
    out: dict[str, str] = {}
    for ev in events:
        if ev.get("cat") != "Node":
            continue
        args = ev.get("args", {})
        if "provider" in args and "op_name" in args:
            out[args["op_name"]] = args["provider"]
    return out


def error_text(exc: BaseException) -> str:
    """The message of ``exc`` and of its causes. onnxruntime's Python wrapper
    retries a failed session creation on the CPU EP and raises the retry's
    error *from* the original one, so the EP's message is in ``__cause__``."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(parts)
