"""Shared pytest setup for the HinaMoE Python tests.

* Tests run against the installed package (``pip install .``).
* One random seed per run (``HINAMOE_TEST_SEED`` to replay); it is printed in
  the header and each test's rng is derived from it and the test id.
"""

from __future__ import annotations

import importlib
import json
import os
import secrets
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

# The tests run against the installed package (`pip install .`): its EP
# library, its models and its bench. A missing EP is a failure, never a skip.
import hinamoe  # noqa: E402  (registers the EP)

# The bf16 tile kernel (QMoE / MatMulNBits groups of >= 16 tokens on the amx
# tiers) rounds weights and tokens to bf16. Tests that check float32
# accuracy run with it off (also in their worker processes); the tile tests
# (test_qmoe_tiles.py, test_matmul_nbits.py) turn it on by provider option.
os.environ.setdefault("HINAMOE_BF16_TILES", "off")
TILES_ON = {"bf16_tiles": "auto"}

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


# ------------------------------------------------------------ onnxruntime version

def _ms_schema(op: str):
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    for schema in C.get_all_operator_schema():
        if schema.name == op and schema.domain == "com.microsoft":
            return schema
    return None


# swiglu_limit_after_activation entered the MoE schema in onnxruntime 1.32.
ORT_HAS_LIMIT_AFTER_ACTIVATION = "swiglu_limit_after_activation" in set(_ms_schema("MoE").attributes)
# Inputs of this onnxruntime's GroupQueryAttention (query_seqlens is 1.32+).
ORT_GQA_INPUTS = {i.name for i in _ms_schema("GroupQueryAttention").inputs}


def _ort_version() -> tuple[int, int]:
    import onnxruntime as ort

    major, minor = ort.__version__.split(".")[:2]
    return int(major), int(minor)


# Before 1.32 the CPU EP's float16 MoE returns zeros for some rows (seen on
# 1.30 and 1.31 with T=1): no reference to compare against there.
CPU_EP_F16_MOE_OK = _ort_version() >= (1, 32)


# ------------------------------------------------------------ EP and tiers


def available_isas() -> list[str]:
    """Kernel tiers this CPU runs (amx-emu always: it is the emulator)."""
    return [isa for isa in ("ref", "avx2", "avx512", "amx", "amx-emu") if not hinamoe.tier_unavailable_reason(isa)]


def tiles_in_effect(isa: str, tokens: int, accuracy_level: int | None = None, bits: int = 4) -> bool:
    """Whether QMoE / MatMulNBits run a group of `tokens` tokens on the bf16
    tile kernel (weights and tokens rounded to bf16): the amx tiers, from
    16 tokens for 4-bit weights and 32 for 8-bit (64 and 128 at
    accuracy_level 4, where the int8-token kernels run below), where
    accuracy_level allows bf16 (absent, 0, 3, 4)."""
    tier = hinamoe.best_tier() if isa == "auto" else isa
    level = accuracy_level or 0
    least = (64 if level == 4 else 16) * (2 if bits == 8 else 1)
    return tier in ("amx", "amx-emu") and tokens >= least and level not in (1, 2)


def require_isa(isa: str) -> None:
    if isa not in available_isas():
        pytest.skip(f"isa {isa} not available on this CPU: {hinamoe.tier_unavailable_reason(isa)}")


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
                 profile_prefix: str | None = None, cpu_fallback_provider: bool = False,
                 extra_options: dict | None = None):
    """A session on HinaMoE (``model``: ModelProto, bytes or path); provider
    options ``isa`` plus ``extra_options``."""
    import onnxruntime as ort

    from hinamoe.models import model_source

    src = model_source(model) if hasattr(model, "graph") else model
    providers = [("HinaMoE", {"isa": isa, **(extra_options or {})})]
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


# ------------------------------------------------------------ exports


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory):
    """Tiny HF checkpoints and their ONNX exports, built once per session:
    ``tiny_export("mixtral").model`` (unfused), ``tiny_export.fused("qwen3_moe")``,
    ``.checkpoint`` (HF folder), ``.torch_model()``. See export_fixtures.py."""
    from export_fixtures import TinyExports

    return TinyExports(tmp_path_factory.mktemp("tiny_exports"), seed=seed_for("tiny_exports"))
