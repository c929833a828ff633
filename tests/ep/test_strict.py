"""Provider option ``strict`` (env HINAMOE_STRICT): with strict=1 a MoE,
MatMulNBits or GroupQueryAttention node HinaMoE does not run fails session creation with
the node and the reason, even where the CPU EP fallback is allowed; with
strict=0 (the default) the node goes to the CPU EP. Supported nodes run on
HinaMoE either way."""

from __future__ import annotations

import numpy as np
import pytest

from hinamoe.models import (
    GQAConfig,
    KVCache,
    MatMulNBitsConfig,
    MoEConfig,
    build_gqa_model,
    build_matmul_nbits_model,
    build_moe_model,
    random_input,
    random_logits,
    random_step,
    run_gqa,
    run_moe,
)

from support.gqa_cases import check_close
from support.moe_reference import reference_for
from support.sessions import cpu_session, error_text, hina_session


def _unsupported_models(rng):
    moe, _ = build_moe_model(MoEConfig(hidden=32, inter=16, experts=8, k=2, activation="relu", use_sparse_mixer=1),
                             rng=rng)
    gqa = build_gqa_model(GQAConfig(num_heads=4, kv_num_heads=2, head_dim=64, extra_attrs={"causal": 0}))
    mmnb, _ = build_matmul_nbits_model(MatMulNBitsConfig(K=64, N=16, bits=2), rng)
    return {"MoE": (moe, "use_sparse_mixer=1"), "GroupQueryAttention": (gqa, "causal=0"),
            "MatMulNBits": (mmnb, "bits=2")}


@pytest.mark.parametrize("op", ["MoE", "GroupQueryAttention", "MatMulNBits"])
def test_strict_refuses_fallback(op, rng):
    model, reason = _unsupported_models(rng)[op]
    name = model.graph.node[0].name
    with pytest.raises(Exception) as ei:
        hina_session(model, no_fallback=False, cpu_fallback_provider=True, extra_options={"strict": "1"})
    msg = error_text(ei.value)
    assert name in msg and op in msg and reason in msg and "strict=1" in msg, msg
    # strict=0: the CPU EP takes the node.
    sess = hina_session(model, no_fallback=False, cpu_fallback_provider=True, extra_options={"strict": "0"})
    assert sess.get_providers()[0] == "HinaMoE"


def test_strict_from_environment(rng, monkeypatch):
    model, reason = _unsupported_models(rng)["MoE"]
    monkeypatch.setenv("HINAMOE_STRICT", "1")
    with pytest.raises(Exception) as ei:
        hina_session(model, no_fallback=False, cpu_fallback_provider=True)
    assert reason in error_text(ei.value)


def test_strict_bad_value(rng):
    model, _ = _unsupported_models(rng)["MoE"]
    with pytest.raises(Exception) as ei:
        hina_session(model, no_fallback=True, extra_options={"strict": "yes"})
    msg = error_text(ei.value)
    assert "strict" in msg and "'yes'" in msg and "expected 0 or 1" in msg, msg


def test_strict_runs_supported_nodes(rng):
    """Nothing changes for nodes HinaMoE runs (CPU EP fallback forbidden)."""
    cfg = MoEConfig(hidden=32, inter=16, experts=8, k=2, activation="silu")
    model, weights = build_moe_model(cfg, rng=rng)
    sess = hina_session(model, no_fallback=True, extra_options={"strict": "1"})
    x, logits = random_input(cfg, 5, rng), random_logits(cfg, 5, rng)
    got = run_moe(sess, x, logits)
    want = reference_for(cfg, x, logits, weights)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
    gcfg = GQAConfig(num_heads=4, kv_num_heads=2, head_dim=64, local_window_size=4,
                     extra_attrs={"sliding_window_cache": 1})
    gs = hina_session(build_gqa_model(gcfg), no_fallback=True, extra_options={"strict": "1"})
    step, past = random_step(gcfg, rng, [5], 1), KVCache.empty(gcfg, 1, 6, rng=rng)
    out, _, _ = run_gqa(gs, gcfg, step, past)
    want, _, _ = run_gqa(cpu_session(build_gqa_model(gcfg)), gcfg, step, past)
    check_close(out, want, "strict GQA vs CPU EP")
