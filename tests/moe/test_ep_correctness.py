"""HinaMoE against the float64 reference on random configurations.

Every session disables the CPU EP fallback, so a passing test ran the MoE
node on HinaMoE."""

from __future__ import annotations

import numpy as np
import pytest

from hinamoe.models import MoEConfig, RoutingPlan, build_moe_model, random_input, random_logits, run_moe, weight_feeds

from support.moe_cases import ACT_FUSION_IDS, ACT_FUSIONS, DTYPES, check_ep_against_reference, random_config
from support.moe_reference import check_close, reference_for
from support.runtime import ORT_HAS_LIMIT_AFTER_ACTIVATION, require_isa
from support.sessions import hina_session

ISAS = ["ref", "avx2", "avx512", "amx"]  # avx512 / amx skip where the CPU lacks them


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act_fusion", ACT_FUSIONS, ids=ACT_FUSION_IDS)
def test_random_configs(act_fusion, dtype, isa, rng, seed):
    require_isa(isa)
    act, fusion = act_fusion
    for trial in range(3):
        cfg = random_config(rng, act, fusion, dtype)
        tokens = [1, int(rng.integers(2, 71))]
        check_ep_against_reference(cfg, isa, rng, tokens, threads=int(rng.integers(1, 3)),
                                   what=f"seed {seed} trial {trial}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act,fusion", [("swiglu", 1), ("swiglu", 2), ("swiglu", 0),
                                        ("relu", 0), ("geglu", 1)])
def test_odd_sizes_many_experts(act, fusion, dtype, isa, rng, seed):
    """H=100, I=72 (not multiples of 8/16/32), E=64, k=8, up to 70 tokens."""
    require_isa(isa)
    cfg = MoEConfig(hidden=100, inter=72, experts=64, k=8, activation=act,
                    swiglu_fusion=fusion, dtype=dtype, fc1_bias=True, fc2_bias=True,
                    fc3_bias=True, normalize_routing_weights=1)
    check_ep_against_reference(cfg, isa, rng, [1, 7, 70], threads=2, what=f"seed {seed}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_gpt_oss_parameters(dtype, isa, rng, seed):
    """alpha=1.702, beta=1, limit=7 (gpt-oss), before and after activation,
    with inputs large enough that the clamps bite."""
    require_isa(isa)
    for after in (None, 1) if ORT_HAS_LIMIT_AFTER_ACTIVATION else (None,):
        for fusion in (0, 1, 2):
            cfg = MoEConfig(hidden=72, inter=40, experts=8, k=4, activation="swiglu",
                            swiglu_fusion=fusion, dtype=dtype, fc1_bias=True, fc2_bias=True,
                            fc3_bias=True, activation_alpha=1.702, activation_beta=1.0,
                            swiglu_limit=1.5 if dtype != "float32" else 0.75,
                            swiglu_limit_after_activation=after)
            check_ep_against_reference(cfg, isa, rng, [5, 33], what=f"seed {seed}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_input_3d_and_weights_as_inputs(dtype, isa, rng, seed):
    require_isa(isa)
    for rank in (2, 3):
        for as_inputs in (False, True):
            cfg = MoEConfig(hidden=37, inter=24, experts=5, k=2, activation="swiglu",
                            swiglu_fusion=1, dtype=dtype, fc1_bias=True,
                            input_rank=rank, weights_as_inputs=as_inputs)
            check_ep_against_reference(cfg, isa, rng, [1, 12, 30], what=f"seed {seed}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_crafted_tokens_per_expert(dtype, isa, rng, seed):
    """Exact tokens per expert (1..16), the benchmark's routing, rotating."""
    require_isa(isa)
    cfg = MoEConfig(hidden=130, inter=96, experts=16, k=4, activation="swiglu",
                    swiglu_fusion=1, dtype=dtype)
    model, w = build_moe_model(cfg, rng=rng)
    sess = hina_session(model, isa=isa, threads=2)
    for n in (1, 2, 4, 8, 16):
        plan = RoutingPlan(16, 4, n, 8, dtype=np.dtype(w["fc1"].dtype))
        for step in range(2):
            lg = plan.logits(step)
            x = random_input(cfg, plan.num_tokens, rng)
            check_close(run_moe(sess, x, lg), reference_for(cfg, x, lg, w), dtype,
                        f"seed {seed} n={n} step={step}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_tied_logits(dtype, isa, rng, seed):
    """Equal router logits: ties go to the higher expert index."""
    require_isa(isa)
    cfg = MoEConfig(hidden=40, inter=24, experts=6, k=2, activation="relu", dtype=dtype,
                    normalize_routing_weights=1)
    model, w = build_moe_model(cfg, rng=rng)
    lg = np.array([[1, 1, 1, 1, 1, 1], [0, 2, 2, 0, 2, 0], [3, 0, 0, 3, 0, 1],
                   [0, 0, 0, 0, 0, 0], [5, 4, 4, 1, 1, 1]], np.float32).astype(w["fc1"].dtype)
    x = random_input(cfg, 5, rng)
    out = run_moe(hina_session(model, isa=isa), x, lg)
    check_close(out, reference_for(cfg, x, lg, w), dtype, f"seed {seed} ties")


@pytest.mark.parametrize("isa", ISAS)
def test_same_session_many_runs_stable(isa, rng, seed):
    """Repeated runs and changing token counts on one session stay correct
    (no stale scratch state)."""
    require_isa(isa)
    cfg = MoEConfig(hidden=64, inter=48, experts=8, k=2, activation="swiglu", dtype="float32",
                    weights_as_inputs=True)
    model, w = build_moe_model(cfg, rng=rng)
    sess = hina_session(model, isa=isa, threads=2)
    feeds = weight_feeds(cfg, w)
    for t in (70, 1, 33, 2, 70, 1):
        x, lg = random_input(cfg, t, rng), random_logits(cfg, t, rng)
        out = run_moe(sess, x, lg, feeds)
        check_close(out, reference_for(cfg, x, lg, w), "float32", f"seed {seed} T={t}")
        out2 = run_moe(sess, x, lg, feeds)
        np.testing.assert_array_equal(out, out2)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_real_shape_slices(dtype, isa, rng, seed):
    """Real expert shapes (fewer experts): qwen3-30b-a3b H2048/I768 and
    gpt-oss-20b H2880/I2880 with its SwiGLU parameters (alpha 1.702, beta 1,
    limit 7)."""
    require_isa(isa)
    cases = [
        MoEConfig(hidden=2048, inter=768, experts=8, k=4, activation="swiglu",
                  swiglu_fusion=1, dtype=dtype, normalize_routing_weights=1),
        MoEConfig(hidden=2880, inter=2880, experts=2, k=2, activation="swiglu",
                  swiglu_fusion=1, dtype=dtype, fc1_bias=True, fc2_bias=True,
                  activation_alpha=1.702, activation_beta=1.0, swiglu_limit=7.0,
                  normalize_routing_weights=1),
    ]
    tokens = [1, 16, 37] if isa != "ref" else [1, 9]  # the scalar tier is slow
    for cfg in cases:
        check_ep_against_reference(cfg, isa, rng, tokens, threads=2, what=f"seed {seed}")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_mixtral_shape_slice(dtype, rng, seed):
    """Mixtral-8x7B expert shape (H4096, I14336), 2 experts, k=1 (slow: ~1.4 GB)."""
    require_isa("avx2")
    cfg = MoEConfig(hidden=4096, inter=14336, experts=2, k=1, activation="swiglu",
                    swiglu_fusion=1, dtype=dtype)
    check_ep_against_reference(cfg, "auto", rng, [1, 5], threads=2, what=f"seed {seed}")


@pytest.mark.slow
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act_fusion", ACT_FUSIONS, ids=ACT_FUSION_IDS)
def test_random_configs_long(act_fusion, dtype, isa, rng, seed):
    """The random sweep, 20 configurations each (slow)."""
    require_isa(isa)
    act, fusion = act_fusion
    for trial in range(20):
        cfg = random_config(rng, act, fusion, dtype)
        tokens = [1, int(rng.integers(2, 71)), int(rng.integers(2, 71))]
        check_ep_against_reference(cfg, isa, rng, tokens, threads=int(rng.integers(1, 3)),
                                   what=f"seed {seed} trial {trial}")


# Token counts around the AMX micro-kernel's m_r = 32 and its 16-row tiles.
AMX_TOKENS = [1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 64]


@pytest.mark.parametrize("act_fusion", ACT_FUSIONS, ids=ACT_FUSION_IDS)
def test_amx_emulated_bf16(act_fusion, rng, seed):
    """The AMX tier's kernel source, run through the software tile emulator
    inside an ONNX session (isa=amx-emu), against the float64 reference.
    Experts get crafted token counts so every m_r edge is hit."""
    act, fusion = act_fusion
    cfg = random_config(rng, act, fusion, "bfloat16", hidden=int(rng.choice([64, 100, 130])),
                        inter=int(rng.choice([48, 72, 40])), experts=4, k=1,
                        weights_as_inputs=False)
    model, w = build_moe_model(cfg, rng=rng)
    sess = hina_session(model, isa="amx-emu", threads=2)
    for step, n in enumerate(rng.choice(AMX_TOKENS, size=4, replace=False)):
        plan = RoutingPlan(cfg.experts, cfg.k, int(n), 2, dtype=np.dtype(w["fc1"].dtype))
        lg = plan.logits(step)
        x = random_input(cfg, plan.num_tokens, rng)
        check_close(run_moe(sess, x, lg), reference_for(cfg, x, lg, w), cfg.dtype,
                    f"seed {seed} amx-emu M={n} [{cfg.describe()}]")
