"""Where the MoE node runs: HinaMoE for what it claims, the CPU EP for
use_sparse_mixer=1; and HinaMoE against ORT's CPU EP on the same model."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from hinamoe.models import MoEConfig, build_moe_model, random_input, random_logits, run_moe, weight_feeds

from support.moe_reference import check_close, reference_for
from support.runtime import CPU_EP_F16_MOE_OK, require_isa
from support.sessions import cpu_session, hina_session, profile_node_providers


def _profile(sess, x, lg, feeds=None) -> dict:
    run_moe(sess, x, lg, feeds)
    path = sess.end_profiling()
    try:
        return profile_node_providers(path)
    finally:
        for p in glob.glob(path):
            os.remove(p)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_profile_shows_hinamoe(dtype, tmp_path, rng):
    cfg = MoEConfig(hidden=64, inter=32, experts=4, k=2, activation="swiglu", dtype=dtype)
    model, w = build_moe_model(cfg, rng=rng)
    sess = hina_session(model, profile_prefix=str(tmp_path / "hina"))
    assert sess.get_providers()[0] == "HinaMoE"
    x, lg = random_input(cfg, 4, rng), random_logits(cfg, 4, rng)
    provs = _profile(sess, x, lg)
    assert provs.get("MoE") == "HinaMoE", f"profile node providers: {provs}"


def test_profile_cpu_ep_baseline(tmp_path, rng):
    """Sanity of the profile parser: the CPU EP shows up as such."""
    cfg = MoEConfig(hidden=64, inter=32, experts=4, k=2, activation="swiglu")
    model, _ = build_moe_model(cfg, rng=rng)
    sess = cpu_session(model, profile_prefix=str(tmp_path / "cpu"))
    x, lg = random_input(cfg, 4, rng), random_logits(cfg, 4, rng)
    assert _profile(sess, x, lg).get("MoE") == "CPUExecutionProvider"


def test_sparse_mixer_not_claimed(tmp_path, rng):
    """use_sparse_mixer=1 stays on the CPU EP: with the fallback disabled the
    session cannot be created; with it allowed the profile shows the CPU EP."""
    cfg = MoEConfig(hidden=32, inter=16, experts=8, k=2, activation="relu", use_sparse_mixer=1)
    model, _ = build_moe_model(cfg, rng=rng)
    with pytest.raises(Exception):
        sess = hina_session(model, no_fallback=True)
        run_moe(sess, random_input(cfg, 3, rng), random_logits(cfg, 3, rng))
    sess = hina_session(model, no_fallback=False, cpu_fallback_provider=True,
                        profile_prefix=str(tmp_path / "sm"))
    provs = _profile(sess, random_input(cfg, 3, rng), random_logits(cfg, 3, rng))
    assert provs.get("MoE") == "CPUExecutionProvider", provs


@pytest.mark.parametrize("isa", ["ref", "avx2"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("act", ["relu", "gelu", "silu", "identity", "swiglu"])
def test_same_model_cpu_ep_vs_hinamoe(act, dtype, isa, rng, seed):
    """The very same model on both EPs (CPU EP-supported configurations)."""
    require_isa(isa)
    if dtype == "float16" and not CPU_EP_F16_MOE_OK:
        pytest.skip("this onnxruntime's CPU EP float16 MoE is wrong (fixed in 1.32)")
    for trial in range(2):
        cfg = MoEConfig(hidden=int(rng.choice([36, 100, 130])),
                        inter=int(rng.choice([24, 72])), experts=int(rng.integers(2, 33)),
                        k=2, activation=act, swiglu_fusion=1, dtype=dtype,
                        fc1_bias=bool(trial), fc2_bias=bool(trial),
                        normalize_routing_weights=trial, input_rank=2 + trial,
                        weights_as_inputs=bool(trial))
        if act == "swiglu" and trial:
            cfg.activation_alpha, cfg.activation_beta, cfg.swiglu_limit = 1.702, 1.0, 7.0
        model, w = build_moe_model(cfg, rng=rng)
        hs = hina_session(model, isa=isa, threads=2)
        cs = cpu_session(model, threads=2)
        feeds = weight_feeds(cfg, w) if cfg.weights_as_inputs else None
        for t in (1, 16, 45):
            batch = 1 if cfg.input_rank == 2 or t % 2 else 2
            x = random_input(cfg, t, rng, batch=batch)
            lg = random_logits(cfg, t, rng)
            oh, oc = run_moe(hs, x, lg, feeds), run_moe(cs, x, lg, feeds)
            ref = reference_for(cfg, x, lg, w)
            what = f"seed {seed} T={t} [{cfg.describe()}]"
            check_close(oc, ref, dtype, "CPU EP " + what)
            check_close(oh, ref, dtype, "HinaMoE " + what)
            check_close(oh, oc.astype(np.float64), dtype, "HinaMoE vs CPU EP " + what,
                        factor=2.0)


def test_cpu_ep_rejects_what_we_add(rng):
    """Documents why HinaMoE exists: bf16 / fc3 / stacked gate-up are refused by
    the stock CPU EP (if ORT learns them this test tells us)."""
    for cfg in (MoEConfig(hidden=16, inter=8, experts=2, k=1, dtype="bfloat16"),
                MoEConfig(hidden=16, inter=8, experts=2, k=1, activation="swiglu",
                          swiglu_fusion=0),
                MoEConfig(hidden=16, inter=8, experts=2, k=1, activation="swiglu",
                          swiglu_fusion=2)):
        model, _ = build_moe_model(cfg, rng=rng)
        with pytest.raises(Exception):
            cpu_session(model)
