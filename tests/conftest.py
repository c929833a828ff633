"""Shared pytest setup for the HinaMoE Python tests.

* Tests run against the installed package (``pip install .``).
* One random seed per run (``HINAMOE_TEST_SEED`` to replay); it is printed in
  the header and each test's rng is derived from it and the test id.
* What tests import lives in the ``support`` package (tests/support/).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

# The tests run against the installed package (`pip install .`): its EP
# library, its models and its bench. A missing EP is a failure, never a skip.
import hinamoe  # noqa: E402  (registers the EP)

# The bf16 tile kernel (QMoE / MatMulNBits groups of >= 16 tokens on the amx
# tiers) rounds weights and tokens to bf16. Tests that check float32
# accuracy run with it off (also in their worker processes); the tile tests
# (test_qmoe_tiles.py, test_matmul_nbits.py) turn it on by provider option.
os.environ.setdefault("HINAMOE_BF16_TILES", "off")

from support.seeds import BASE_SEED, seed_for  # noqa: E402

# ------------------------------------------------------------ seed


def pytest_report_header(config):
    return [f"hinamoe test seed: {BASE_SEED} (replay: HINAMOE_TEST_SEED={BASE_SEED})"]


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running tests (deselected by default)")


@pytest.fixture
def seed(request, record_property) -> int:
    s = seed_for(request.node.nodeid)
    record_property("seed", s)
    print(f"[seed] {request.node.nodeid}: base {BASE_SEED}, test {s}")
    return s


@pytest.fixture
def rng(seed) -> np.random.Generator:
    return np.random.default_rng(seed)


# ------------------------------------------------------------ exports


@pytest.fixture(scope="session")
def tiny_export(tmp_path_factory):
    """Tiny HF checkpoints and their ONNX exports, built once per session:
    ``tiny_export("mixtral").model`` (unfused), ``tiny_export.fused("qwen3_moe")``,
    ``.checkpoint`` (HF folder), ``.torch_model()``. See export_fixtures.py."""
    from support.export_fixtures import TinyExports

    return TinyExports(tmp_path_factory.mktemp("tiny_exports"), seed=seed_for("tiny_exports"))
