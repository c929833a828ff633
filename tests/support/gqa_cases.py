"""Shared pieces of the GroupQueryAttention tests: random configurations, a
prompt-then-decode sequence run on a session with a shared KV cache (as
onnxruntime-genai runs it) next to the float64 reference, and comparisons."""

from __future__ import annotations

import numpy as np

from hinamoe.models import GQAConfig, KVCache, build_gqa_model, prompt_step, random_step, run_gqa, run_gqa_shared

from support.gqa_reference import gqa_reference

# (atol, rtol) against the float64 reference. float32: dot products over
# d <= 128 and sums over up to a few thousand keys leave errors of a few
# 1e-6; float16: inputs, rotated Q/K, the cache and the output are rounded to
# half (eps 1e-3), errors up to ~2e-3; bfloat16 the same with eps 8e-3
# (8x half's), errors up to ~1e-2 on outputs of size ~3 (MoE's bf16
# tolerance). All are far below what an indexing or masking mistake
# produces (O(1)).
TOLERANCES = {"float32": (1e-4, 1e-4), "float16": (4e-3, 4e-3), "bfloat16": (1.5e-2, 1e-2)}

# Every supported feature on its own (GQAConfig fields).
FEATURES = {
    "plain": {},
    "packed": dict(packed=True),
    "rotary": dict(do_rotary=True),
    "rotary_interleaved": dict(do_rotary=True, rotary_interleaved=True),
    "rotary_partial": dict(do_rotary=True, rotary_dim=32),
    "position_ids": dict(do_rotary=True, position_ids=True),
    "local_window": dict(local_window_size=5),
    "softcap": dict(softcap=2.0),
    "attention_bias": dict(attention_bias=True),
    "bias_broadcast": dict(attention_bias=True, bias_broadcast_batch=True, bias_broadcast_heads=True),
    "bias_and_softcap": dict(attention_bias=True, softcap=1.5),
    "head_sink": dict(head_sink=True),
    "smooth_softmax": dict(smooth_softmax=True),
    "scale": dict(scale=0.3),
}

GROUPS = (1, 2, 4, 8)
HEAD_DIMS = (64, 80, 128)


def random_config(rng: np.random.Generator, **overrides) -> GQAConfig:
    """A random supported configuration: G in GROUPS, d in HEAD_DIMS, and
    each optional feature on or off at random (``overrides`` win)."""
    g = int(rng.choice(GROUPS))
    nkv = int(rng.choice([1, 2, 3]))
    d = int(rng.choice(HEAD_DIMS))
    kw = dict(num_heads=g * nkv, kv_num_heads=nkv, head_dim=d,
              packed=bool(rng.integers(2)),
              do_rotary=bool(rng.integers(2)),
              attention_bias=bool(rng.integers(3) == 0),
              head_sink=bool(rng.integers(3) == 0),
              softcap=float(rng.choice([0.0, 0.0, 5.0])),
              scale=float(rng.choice([0.0, 0.0, 0.07])),
              local_window_size=int(rng.choice([-1, -1, 17, 200])))
    if kw["do_rotary"]:
        kw["rotary_interleaved"] = bool(rng.integers(2))
        # ORT wants R/2 a multiple of 8: half rotary only where d/4 is one
        kw["rotary_dim"] = int(rng.choice([0, d // 2])) if (d // 4) % 8 == 0 else 0
        kw["position_ids"] = bool(rng.integers(2))
    if not kw["head_sink"]:
        kw["smooth_softmax"] = bool(rng.integers(3) == 0)
    kw.update(overrides)
    return GQAConfig(**kw)


def check_close(got, want, what: str, valid=None, dtype: str = "float32", factor: float = 1.0) -> None:
    """A result in ``dtype`` vs the float64 reference on the valid rows; NaN
    in the compared part fails. ``factor`` widens the tolerances (sharp
    softmaxes of random fuzz cases)."""
    atol, rtol = (factor * t for t in TOLERANCES[dtype])
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if valid is not None:
        got, want = got[valid], want[valid]
    assert np.all(np.isfinite(got)), f"{what}: {np.sum(~np.isfinite(got))} non-finite values"
    err = np.abs(got - want)
    bad = err > atol + rtol * np.abs(want)
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} values off; max abs err "
                           f"{err.max():.3e}, max |want| {np.abs(want).max():.3e}")


def check_cache(got, want, what: str, dtype: str = "float32") -> None:
    """A whole KV cache: rows never written must hold what they held (NaN
    stays NaN), written rows must match."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    assert np.array_equal(nan_got, nan_want), (
        f"{what}: rows written that must not be, or not written that must be "
        f"({np.sum(nan_got != nan_want)} values)")
    check_close(np.where(nan_got, 0, got), np.where(nan_want, 0, want), what, dtype=dtype)


def run_sequence(sess, cfg: GQAConfig, rng: np.random.Generator, prompt_lens, decode_steps: int,
                 capacity: int, what: str, other=None, prefill: str = "prompt") -> KVCache:
    """A ragged first prompt then ``decode_steps`` single-token steps, the KV
    cache shared between past and present (IOBinding), checked against the
    reference at every step (output and the whole cache; unused cache rows
    hold NaN, so reading one shows). ``other``: a second session (e.g. the
    CPU EP) run on its own cache and compared too.

    prefill="random": no prompt call; row b of the cache starts with
    ``prompt_lens[b]`` random rows (long contexts without a long prompt,
    whose reference would be slow). Returns the final cache."""
    b = len(prompt_lens)
    cache = KVCache.empty(cfg, b, capacity)
    lens = list(prompt_lens)
    if prefill == "random":
        for r, n in enumerate(lens):
            cache.key[r, :, :n] = rng.standard_normal(cache.key[r, :, :n].shape)
            cache.value[r, :, :n] = rng.standard_normal(cache.value[r, :, :n].shape)
    ref_k, ref_v = cache.key.astype(np.float64), cache.value.astype(np.float64)
    other_cache = cache.copy() if other is not None else None
    offsets = rng.integers(0, 5, b)
    first = 0 if prefill == "prompt" else 1
    for i in range(first, decode_steps + 1):
        if i == 0:
            step = prompt_step(cfg, rng, lens, positions=capacity + 8, position_offsets=offsets)
        else:
            step = random_step(cfg, rng, lens, 1, positions=capacity + 8, position_offsets=offsets)
            lens = [x + 1 for x in lens]
        out = run_gqa_shared(sess, cfg, cache, step)
        want, ref_k, ref_v, valid = gqa_reference(cfg, step, ref_k, ref_v, shared=True)
        label = f"{what} step {i} (lens {lens})"
        check_close(out, want, label + " output", valid, cfg.dtype)
        check_cache(cache.key, ref_k, label + " present_key", cfg.dtype)
        check_cache(cache.value, ref_v, label + " present_value", cfg.dtype)
        if other is not None:
            out_o = run_gqa_shared(other, cfg, other_cache, step)
            check_close(out, out_o, label + " output vs other EP", valid, cfg.dtype)
    return cache


def run_separate(sess, cfg: GQAConfig, rng: np.random.Generator, past_lens, new_tokens: int,
                 past_capacity: int, what: str, other=None):
    """One call with separate past and present (plain ``run``), past filled
    with random values, checked against the reference."""
    b = len(past_lens)
    past = KVCache.empty(cfg, b, past_capacity, rng=rng) if cfg.with_past else None
    step = random_step(cfg, rng, past_lens, new_tokens)
    out, pk, pv = run_gqa(sess, cfg, step, past)
    want, ref_k, ref_v, valid = gqa_reference(
        cfg, step, None if past is None else past.key, None if past is None else past.value)
    check_close(out, want, what + " output", valid, cfg.dtype)
    if cfg.with_present:
        check_close(pk, ref_k, what + " present_key", dtype=cfg.dtype)
        check_close(pv, ref_v, what + " present_value", dtype=cfg.dtype)
    if other is not None:
        out_o, _, _ = run_gqa(other, cfg, step, past)
        check_close(out, out_o, what + " output vs other EP", valid, cfg.dtype)
    return out


def run_groups_and_head_dims(make_session, rng: np.random.Generator, what: str, dtype: str = "float32") -> None:
    """Every G in GROUPS and d in HEAD_DIMS: decode on a ragged batch with odd
    lengths (``make_session(model)`` gives the session to test)."""
    for g in GROUPS:
        for d in HEAD_DIMS:
            nkv = int(rng.integers(1, 3))
            cfg = GQAConfig(num_heads=g * nkv, kv_num_heads=nkv, head_dim=d, dtype=dtype,
                            do_rotary=bool(rng.integers(2)))
            hs = make_session(build_gqa_model(cfg))
            lens = [int(x) | 1 for x in rng.integers(1, 200, size=3)]
            run_sequence(hs, cfg, rng, lens, decode_steps=2, capacity=max(lens) + 3,
                         what=f"{what} [{cfg.describe()}]", prefill="random")


def check_same_nonfinite(got, want, what: str, valid=None, dtype: str = "float32", factor: float = 1.0) -> None:
    """``got`` vs ``want`` position by position: NaN where ``want`` has NaN,
    the same infinities, and the finite values close (TOLERANCES)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    if valid is not None:
        got, want = got[valid], want[valid]
    for name, test in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
        g, w = test(got), test(want)
        assert np.array_equal(g, w), (
            f"{what}: {name} at {np.sum(g & ~w)} positions where expected is not, missing at "
            f"{np.sum(w & ~g)} (of {g.size}; expected {np.sum(w)})")
    fin = np.isfinite(want)
    check_close(got[fin], want[fin], what + " (finite part)", dtype=dtype, factor=factor)
