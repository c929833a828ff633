"""Where GroupQueryAttention runs: on HinaMoE when it claims the node
(proven by ORT profiling and by sessions that forbid the CPU EP fallback),
on the CPU EP for what HinaMoE does not implement."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from hinamoe.models import GQAConfig, KVCache, build_gqa_model, random_step, run_gqa

from support.runtime import ORT_GQA_INPUTS
from support.sessions import hina_session, profile_node_providers

BASE = dict(num_heads=8, kv_num_heads=2, head_dim=64)


def _providers_after_run(sess, cfg, rng) -> dict:
    step = random_step(cfg, rng, [5, 9], 1)
    run_gqa(sess, cfg, step, KVCache.empty(cfg, 2, 12, rng=rng))
    path = sess.end_profiling()
    try:
        return profile_node_providers(path)
    finally:
        for p in glob.glob(path):
            os.remove(p)


@pytest.mark.parametrize("extra", [{}, dict(dtype="float16"), dict(dtype="bfloat16"), dict(do_rotary=True, packed=True, attention_bias=True,
                                            head_sink=True, local_window_size=4, softcap=3.0),
                                   dict(do_rotary=True, packed=True, head_sink=True, local_window_size=4,
                                        extra_attrs={"sliding_window_cache": 1})])
def test_profile_shows_hinamoe(extra, tmp_path, rng):
    cfg = GQAConfig(**BASE, **extra)
    sess = hina_session(build_gqa_model(cfg), profile_prefix=str(tmp_path / "hina"))
    assert sess.get_providers()[0] == "HinaMoE"
    provs = _providers_after_run(sess, cfg, rng)
    assert provs.get("GroupQueryAttention") == "HinaMoE", provs


# What HinaMoE leaves to the CPU EP: (GQAConfig fields, why).
UNCLAIMED = {
    "causal_0": dict(extra_attrs={"causal": 0}),
    "qk_output": dict(extra_attrs={"qk_output": 1}, output_qk=True),
    "k_quant_type": dict(extra_attrs={"k_quant_type": "PER_TENSOR", "v_quant_type": "PER_TENSOR"},
                         extra_inputs=("k_scale", "v_scale")),
    "q_norm_weight": dict(extra_inputs=("q_norm_weight", "k_norm_weight")),
    "query_seqlens": dict(extra_inputs=("query_seqlens",)),
}


@pytest.mark.parametrize("case", list(UNCLAIMED))
def test_unsupported_left_to_cpu_ep(case):
    """With the CPU EP fallback forbidden the session cannot be created (the
    node is not ours); with it allowed, it is."""
    missing = set(UNCLAIMED[case].get("extra_inputs", ())) - ORT_GQA_INPUTS
    if missing:
        pytest.skip(f"this onnxruntime's GroupQueryAttention has no input {sorted(missing)}")
    cfg = GQAConfig(**BASE, **UNCLAIMED[case])
    model = build_gqa_model(cfg)
    with pytest.raises(Exception):
        hina_session(model, no_fallback=True)
    sess = hina_session(model, no_fallback=False, cpu_fallback_provider=True)
    assert sess.get_providers()[0] == "HinaMoE"


def test_unsupported_runs_on_cpu_ep(tmp_path, rng):
    """The profile of a node HinaMoE does not claim (qk_output=1) names the CPU EP."""
    cfg = GQAConfig(**BASE, **UNCLAIMED["qk_output"])
    sess = hina_session(build_gqa_model(cfg), no_fallback=False, cpu_fallback_provider=True,
                        profile_prefix=str(tmp_path / "qk"))
    provs = _providers_after_run(sess, cfg, rng)
    assert provs.get("GroupQueryAttention") == "CPUExecutionProvider", provs
