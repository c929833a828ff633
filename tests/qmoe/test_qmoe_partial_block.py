"""QMoE with block_size not dividing K (onnxruntime-genai's builder emits
such nodes, e.g. an intermediate size of 48 at block_size 32): scales
[E, N, ceil(K/block_size)], the last block covering the K % block_size
remaining elements. HinaMoE (strict: no CPU fallback, so every node ran on
it) against the float64 reference and ORT's CPU EP on the same model, on
every tier: ref, avx2 (float path and int8 tokens with a short last block)
and amx-emu (whose AMX block kernel hands such weights to the ref kernel)."""

from __future__ import annotations

import numpy as np
import pytest

from hinamoe.models import QMoEConfig, build_qmoe_model

from support.moe_reference import check_close
from support.qmoe_cases import int8_factor, qmoe_inputs, run_qmoe
from support.qmoe_reference import qmoe_reference
from support.runtime import require_isa
from support.sessions import cpu_session, hina_session

# (hidden, inter): K of fc1/fc3 is hidden, K of fc2 is inter.
SHAPES = [(48, 80), (80, 200), (200, 48), (64, 50)]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [16, 32, 64])
@pytest.mark.parametrize("accuracy_level", [None, 4])
@pytest.mark.parametrize("shape", SHAPES)
def test_partial_last_block_parity(bits, block, accuracy_level, shape, rng):
    hidden, inter = shape
    # A single (partial) block, K <= block_size, is row-wise here and its zero
    # points packed row-wise, unlike the CPU EP's [E, N, 1]: no zero points there.
    zp = min(hidden, inter) > block and bool(rng.integers(2))
    cfg = QMoEConfig(hidden=hidden, inter=inter, experts=4, k=2, bits=bits, block_size=block,
                     accuracy_level=accuracy_level, fc1_bias=True, fc2_bias=True,
                     zero_points=zp)
    model, w = build_qmoe_model(cfg, rng)
    x, lg, _ = qmoe_inputs(cfg, int(rng.integers(1, 10)), rng)
    ref = qmoe_reference(cfg, x, lg, w)
    # int8 tokens with random zero points (weights offset by up to 15 / 255
    # scales) at K this small: ~1.6% of the output scale, the same with
    # whole blocks (K=64); _int8_factor doubles its allowance for zero points.
    hina_factor = int8_factor(cfg, True)
    cpu = run_qmoe(cpu_session(model), cfg, x, lg)
    check_close(cpu, ref, "float32", "CPU EP vs float64", factor=int8_factor(cfg, False))
    for isa in ("ref", "avx2", "amx-emu"):
        try:
            require_isa(isa)
        except pytest.skip.Exception:
            continue
        out = run_qmoe(hina_session(model, isa=isa), cfg, x, lg)
        check_close(out, ref, "float32", f"HinaMoE {isa} vs float64", factor=hina_factor)
        check_close(out, cpu.astype(np.float64), "float32", f"HinaMoE {isa} vs CPU EP",
                    factor=max(hina_factor, int8_factor(cfg, False)) * 2)


def test_scales_must_have_ceil_blocks(rng):
    """K=48 at block_size 32 needs 2 scale blocks per row; 1 or 3 is an error naming the input."""
    from support.bad_input import expect_error, replace_init

    cfg = QMoEConfig(hidden=48, inter=32, experts=4, k=2, bits=4, block_size=32)
    x, lg, _ = qmoe_inputs(cfg, 3, rng)
    for bad in (lambda s: s[:, :, :1], lambda s: np.concatenate([s, s[:, :, :1]], axis=2)):
        model, w = build_qmoe_model(cfg, rng)
        assert w["fc1_scales"].shape[2] == 2
        replace_init(model, "fc1_scales", np.ascontiguousarray(bad(w["fc1_scales"])))
        expect_error(model, lambda: {"input": x, "router_probs": lg}, "fc1_scales", "ceil(K/block_size)")
