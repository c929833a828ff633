"""QMoE on the bf16 tile kernel (amx tiers, experts with >= 16 tokens, where
accuracy_level allows bf16): against the float64 reference at bf16
accuracy, against the same tier's vector kernels (provider option
bf16_tiles=off), real AMX against the tile emulator, and accuracy_level 1
(float32 asked for) staying on the vector kernels."""

from __future__ import annotations

import numpy as np
import pytest

from hinamoe.models import QMoEConfig, build_qmoe_model, run_moe

from support.moe_reference import check_close
from support.qmoe_reference import qmoe_reference
from support.runtime import TILES_ON, require_isa
from support.sessions import error_text, hina_session

OFF = {"bf16_tiles": "off"}


def _case(rng, bits, block, accuracy_level=None, tokens=64, **kw):
    cfg = QMoEConfig(hidden=256, inter=96, experts=4, k=2, bits=bits, block_size=block, fc1_bias=True,
                     fc2_bias=True, accuracy_level=accuracy_level, zero_points=bool(rng.integers(2)),
                     activation_alpha=1.702, activation_beta=1.0, swiglu_limit=7.0, **kw)
    model, w = build_qmoe_model(cfg, rng)
    x = rng.standard_normal((tokens, cfg.hidden)).astype(np.float32)
    lg = rng.standard_normal((tokens, cfg.experts)).astype(np.float32)
    return cfg, model, w, x, lg


@pytest.mark.parametrize("isa", ["amx", "amx-emu"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [0, 32, 128])
def test_tiles_vs_reference_and_vector_kernels(isa, bits, block, rng):
    require_isa(isa)
    # ~tokens * k / experts per expert: above 16 (int4) or 32 (int8) tokens
    cfg, model, w, x, lg = _case(rng, bits, block, tokens=64 if bits == 4 else 160)
    tiles = run_moe(hina_session(model, isa=isa, threads=2, extra_options=TILES_ON), x, lg)
    vector = run_moe(hina_session(model, isa=isa, threads=2, extra_options=OFF), x, lg)
    ref = qmoe_reference(cfg, x, lg, w)
    check_close(vector, ref, "float32", "vector kernels vs float64")
    check_close(tiles, ref, "bfloat16", "tiles vs float64")
    # bf16 rounding of weights, tokens and activations: far from float32 ...
    assert np.abs(tiles - vector).max() > 1e-5 * np.abs(ref).max(), "the tile kernel did not run"


def test_amx_matches_emulator(rng):
    """Real tiles and the emulator: the same panels, the same products."""
    require_isa("amx")
    cfg, model, _, x, lg = _case(rng, 4, 32, tokens=96)
    amx = run_moe(hina_session(model, isa="amx", threads=2, extra_options=TILES_ON), x, lg)
    emu = run_moe(hina_session(model, isa="amx-emu", threads=2, extra_options=TILES_ON), x, lg)
    check_close(amx, emu.astype(np.float64), "float32", "amx vs amx-emu", factor=5.0)


@pytest.mark.parametrize("isa", ["amx", "amx-emu"])
def test_accuracy_level_1_stays_float32(isa, rng):
    require_isa(isa)
    cfg, model, w, x, lg = _case(rng, 4, 32, accuracy_level=1)
    out = run_moe(hina_session(model, isa=isa, threads=2, extra_options=TILES_ON), x, lg)
    check_close(out, qmoe_reference(cfg, x, lg, w), "float32", "accuracy_level=1")


def test_int8_accuracy_level_on_tiles(rng):
    """accuracy_level 4 allows int8 tokens, so bf16 too: the tile kernel runs
    the groups of 64 tokens and more and stays within bf16 accuracy of float64."""
    require_isa("amx-emu")
    cfg, model, w, x, lg = _case(rng, 4, 32, accuracy_level=4, tokens=400)
    out = run_moe(hina_session(model, isa="amx-emu", threads=2, extra_options=TILES_ON), x, lg)
    check_close(out, qmoe_reference(cfg, x, lg, w), "bfloat16", "accuracy_level=4 on tiles")


def test_bad_option_value(rng):
    _, model, _, _, _ = _case(rng, 4, 32, tokens=1)
    with pytest.raises(Exception) as exc:
        hina_session(model, extra_options={"bf16_tiles": "yes"})
    assert "bf16_tiles" in error_text(exc.value) and "'yes'" in error_text(exc.value)
