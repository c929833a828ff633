"""The float64 GroupQueryAttention reference against ORT's CPU EP: the
reference is what the HinaMoE tests trust, so it must agree with ORT's own
kernel on every feature HinaMoE claims."""

from __future__ import annotations

import numpy as np
import pytest

from hinamoe.models import GQAConfig, KVCache, build_gqa_model, prompt_step, run_gqa_shared

from support.gqa_cases import FEATURES, check_close, random_config, run_separate, run_sequence
from support.gqa_reference import gqa_reference
from support.sessions import cpu_session


@pytest.mark.parametrize("feature", list(FEATURES))
def test_reference_matches_cpu_ep(feature, rng, seed):
    cfg = GQAConfig(num_heads=8, kv_num_heads=2, head_dim=64, **FEATURES[feature])
    sess = cpu_session(build_gqa_model(cfg))
    run_sequence(sess, cfg, rng, [13, 6, 10], decode_steps=3, capacity=40,
                 what=f"CPU EP seed {seed} [{cfg.describe()}]")
    run_separate(sess, cfg, rng, [9, 3, 14], 1, past_capacity=20,
                 what=f"CPU EP separate seed {seed} [{cfg.describe()}]")


def test_reference_matches_cpu_ep_random(rng, seed):
    for _ in range(3):
        cfg = random_config(rng)
        sess = cpu_session(build_gqa_model(cfg))
        lens = [int(x) for x in rng.integers(1, 90, size=int(rng.integers(1, 4)))]
        run_sequence(sess, cfg, rng, lens, decode_steps=2, capacity=max(lens) + 4,
                     what=f"CPU EP seed {seed} [{cfg.describe()}]")


def test_first_prompt_reads_only_first_position_id(rng):
    """ORT's quirk that the reference copies: on a first prompt, rotary uses
    position_ids[0, 0] + s for every row, not position_ids[b, s]."""
    cfg = GQAConfig(num_heads=4, kv_num_heads=2, head_dim=16, do_rotary=True, position_ids=True)
    sess = cpu_session(build_gqa_model(cfg))
    cache = KVCache.empty(cfg, 2, 16, fill=0.0)
    step = prompt_step(cfg, rng, [6, 6], positions=32)
    step.position_ids = np.array([[3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14]], dtype=np.int64)
    run_gqa_shared(sess, cfg, cache, step)
    _, want_k, _, _ = gqa_reference(cfg, step, np.zeros_like(cache.key), np.zeros_like(cache.value),
                                    shared=True)
    check_close(cache.key[:, :, :6], want_k[:, :, :6], "present_key with position_ids on a prompt")
