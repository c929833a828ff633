"""Bad GroupQueryAttention input gives an ORT error naming the op, the input
and the reason, never a crash or garbage. Sessions forbid the CPU EP
fallback, so the error is HinaMoE's (or ORT's own graph checks')."""

from __future__ import annotations

import numpy as np
import pytest

from hinamoe.models import GQAConfig, KVCache, build_gqa_model, random_step, run_gqa, run_gqa_shared

from support.bad_input import relax_inputs
from support.gqa_cases import check_close
from support.gqa_reference import gqa_reference
from support.sessions import error_text, hina_session

BASE = dict(num_heads=8, kv_num_heads=2, head_dim=64)


def _expect_error(sess_fn, run_fn=None) -> str:
    with pytest.raises(Exception) as ei:
        sess = sess_fn()
        if run_fn is not None:
            run_fn(sess)
    msg = error_text(ei.value)
    print(f"error message: {msg}")
    return msg


def test_heads_not_dividing():
    cfg = GQAConfig(num_heads=6, kv_num_heads=4, head_dim=32)
    msg = _expect_error(lambda: hina_session(build_gqa_model(cfg)))
    assert "GroupQueryAttention" in msg and "num_heads=6" in msg and "kv_num_heads=4" in msg, msg


@pytest.mark.parametrize("bad", [40, 16, -3])
def test_seqlens_beyond_buffer(bad, rng):
    """seqlens_k pointing past the shared cache's 16 rows (and past
    total_sequence_length), or negative."""
    cfg = GQAConfig(**BASE)
    sess = hina_session(build_gqa_model(cfg))
    cache = KVCache.empty(cfg, 2, 16, rng=rng)
    step = random_step(cfg, rng, [5, 15], 1)
    step.seqlens_k = np.array([5, bad], dtype=np.int32)
    msg = _expect_error(lambda: sess, lambda s: run_gqa_shared(s, cfg, cache, step))
    assert "GroupQueryAttention" in msg and "seqlens_k" in msg, msg
    # the session still works afterwards
    good = random_step(cfg, rng, [5, 9], 1)
    out = run_gqa_shared(sess, cfg, cache, good)
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("which", ["cos_rows", "cos_width", "sin_differs"])
def test_wrong_cos_sin_shape(which, rng):
    cfg = GQAConfig(**BASE, do_rotary=True)
    sess = hina_session(relax_inputs(build_gqa_model(cfg)))
    step = random_step(cfg, rng, [5, 9], 1)
    if which == "cos_rows":  # too few positions for the tokens' positions
        step.cos_cache, step.sin_cache = step.cos_cache[:4], step.sin_cache[:4]
    elif which == "cos_width":  # rotary dim larger than the head
        step.cos_cache = np.concatenate([step.cos_cache] * 3, axis=1)
        step.sin_cache = np.concatenate([step.sin_cache] * 3, axis=1)
    else:
        step.sin_cache = step.sin_cache[:, :8]
    msg = _expect_error(lambda: sess,
                        lambda s: run_gqa(s, cfg, step, KVCache.empty(cfg, 2, 12, rng=rng)))
    assert "GroupQueryAttention" in msg and ("cos_cache" in msg or "sin_cache" in msg), msg


@pytest.mark.parametrize("which", ["key_width", "past_heads", "bias_keys", "head_sink", "seqlens_len",
                                   "position_ids"])
def test_wrong_shapes(which, rng):
    cfg = GQAConfig(**BASE, attention_bias=True, head_sink=True, do_rotary=True, position_ids=True)
    sess = hina_session(relax_inputs(build_gqa_model(cfg)))
    step = random_step(cfg, rng, [5, 9], 1)
    past = KVCache.empty(cfg, 2, 12, rng=rng)
    name = {"key_width": "key", "past_heads": "past_key", "bias_keys": "attention_bias",
            "head_sink": "head_sink", "seqlens_len": "seqlens_k", "position_ids": "position_ids"}[which]
    if which == "key_width":
        step.key = step.key[:, :, :100]
    elif which == "past_heads":
        past = KVCache(past.key[:, :1].copy(), past.value[:, :1].copy())
    elif which == "bias_keys":
        step.attention_bias = step.attention_bias[..., :3]
    elif which == "head_sink":
        step.head_sink = step.head_sink[:5]
    elif which == "seqlens_len":
        step.seqlens_k = np.concatenate([step.seqlens_k, step.seqlens_k])
    else:
        step.position_ids = step.position_ids[:1]
    msg = _expect_error(lambda: sess, lambda s: run_gqa(s, cfg, step, past))
    assert "GroupQueryAttention" in msg and f"'{name}'" in msg, msg


def test_batch_prompt_after_past_rejected(rng):
    """S > 1 with a past and B > 1 is not allowed by the op."""
    cfg = GQAConfig(**BASE)
    sess = hina_session(build_gqa_model(cfg))
    step = random_step(cfg, rng, [5, 9], 3)
    msg = _expect_error(lambda: sess,
                        lambda s: run_gqa(s, cfg, step, KVCache.empty(cfg, 2, 16, rng=rng)))
    assert "GroupQueryAttention" in msg, msg


def test_empty_batch(rng):
    cfg = GQAConfig(**BASE)
    sess = hina_session(build_gqa_model(cfg))
    step = random_step(cfg, rng, [5], 1)
    empty = random_step(cfg, rng, [5], 1)
    empty.query = empty.query[:0]
    empty.key, empty.value = empty.key[:0], empty.value[:0]
    empty.seqlens_k = empty.seqlens_k[:0]
    out, pk, _ = run_gqa(sess, cfg, empty, KVCache.empty(cfg, 0, 8))
    assert out.shape == (0, 1, 8 * 64) and pk.shape[0] == 0
    past = KVCache.empty(cfg, 1, 8, rng=rng)
    out, _, _ = run_gqa(sess, cfg, step, past)
    want, _, _, valid = gqa_reference(cfg, step, past.key, past.value)
    check_close(out, want, "after an empty batch", valid)


@pytest.mark.parametrize("past_cap,new,seqlen,total", [(5, 2, 5, 6), (2, 3, 2, 3), (8, 3, 9, 10)])
def test_inconsistent_past_buffer_refused_as_ort_does(past_cap, new, seqlen, total, rng):
    """total_sequence_length must be past_key dim 2 + S (a growing cache) or
    at most past_key dim 2 (a preallocated one): ORT's CPU EP refuses the
    rest, and so does HinaMoE, naming the node and the inputs."""
    from support.sessions import cpu_session

    cfg = GQAConfig(num_heads=4, kv_num_heads=1, head_dim=16)
    model = build_gqa_model(cfg)
    step = random_step(cfg, rng, [max(seqlen + 1 - new, 0)], new)
    step.seqlens_k = np.array([seqlen], dtype=np.int32)
    step.total_sequence_length = total
    past = KVCache.empty(cfg, 1, past_cap, rng=rng)
    import onnxruntime as ort

    if tuple(int(v) for v in ort.__version__.split(".")[:2]) >= (1, 32):  # older CPU EPs let it through
        cpu_msg = _expect_error(lambda: cpu_session(model), lambda s: run_gqa(s, cfg, step, past))
        assert "total_sequence_length" in cpu_msg, cpu_msg
    msg = _expect_error(lambda: hina_session(model), lambda s: run_gqa(s, cfg, step, past))
    assert "HinaMoE GroupQueryAttention node 'gqa'" in msg, msg
    assert f"total_sequence_length ({total})" in msg and f"past_key dim 2 ({past_cap})" in msg, msg


def test_seqlens_beyond_shared_buffer_named(rng):
    """A shared past/present buffer of 16 rows and a step that needs 17:
    HinaMoE's message names seqlens_k (not only ORT's output-shape text)."""
    cfg = GQAConfig(**BASE)
    sess = hina_session(build_gqa_model(cfg))
    cache = KVCache.empty(cfg, 1, 16, rng=rng)
    step = random_step(cfg, rng, [16], 1)
    assert step.total_sequence_length == 17
    msg = _expect_error(lambda: sess, lambda s: run_gqa_shared(s, cfg, cache, step))
    assert "node 'gqa': input 'seqlens_k'" in msg and "16 rows" in msg, msg


@pytest.mark.parametrize("batch", [1, 2])
def test_bias_shape_message(batch, rng):
    cfg = GQAConfig(**BASE, attention_bias=True)
    sess = hina_session(relax_inputs(build_gqa_model(cfg)))
    step = random_step(cfg, rng, [5] * batch, 1)
    step.attention_bias = step.attention_bias[..., :3]
    msg = _expect_error(lambda: sess, lambda s: run_gqa(s, cfg, step, KVCache.empty(cfg, batch, 8, rng=rng)))
    want = "[1, 8 or 1, 1, 6]" if batch == 1 else "[2 or 1, 8 or 1, 1, 6]"
    assert want in msg and "1 or 1" not in msg, msg
