"""GroupQueryAttention with ``sliding_window_cache=1`` (gpt-oss's sliding
layers as onnxruntime-genai builds and binds them): a window-sized KV buffer
shared by past and present, evicting internally. Every step is checked
against the float64 reference run on a full-length cache with the same
local window (outputs, and the window's rows against the newest positions of
the full cache) and against ORT's CPU EP on its own windowed buffer, from the
prompt on, well past the point where the window starts evicting. Sessions
disable the CPU EP fallback, so the results come from HinaMoE."""

from __future__ import annotations

import numpy as np
import pytest

from hinamoe.models import GQAConfig, KVCache, build_gqa_model, prompt_step, random_step, run_gqa, run_gqa_shared

from support.gqa_cases import check_close, check_same_nonfinite
from support.gqa_reference import gqa_reference
from support.runtime import require_isa
from support.sessions import cpu_session, error_text, hina_session

ISAS = ["ref", "avx2", "amx-emu"]


def resident(total: int, capacity: int, window: int) -> int:
    """Rows the op keeps after `total` tokens (the schema's L(T))."""
    if total <= capacity:
        return total
    g = capacity - window + 1
    return total - g * -(-(total - capacity) // g)


def window_config(dtype="float32", **kw) -> GQAConfig:
    base = dict(num_heads=8, kv_num_heads=2, head_dim=64, dtype=dtype, packed=True, do_rotary=True,
                head_sink=True, local_window_size=6, extra_attrs={"sliding_window_cache": 1})
    base.update(kw)
    return GQAConfig(**base)


def check_window(win: KVCache, ref_k, ref_v, lens, capacity, window, what, dtype):
    for b, total in enumerate(lens):
        n = resident(total, capacity, window)
        check_close(win.key[b, :, :n], ref_k[b, :, total - n:total], f"{what} row {b} present_key", dtype=dtype)
        check_close(win.value[b, :, :n], ref_v[b, :, total - n:total], f"{what} row {b} present_value", dtype=dtype)


def run_window_sequence(sess, cpu, cfg, rng, prompt_lens, steps, capacity, what, chunk=1, prefill="prompt"):
    """A first prompt, then `steps` calls of `chunk` new tokens, on windowed
    buffers shared by past and present (unused rows NaN).

    prefill="random": no prompt call; row b starts as the op leaves a row of
    ``prompt_lens[b]`` tokens, with random K/V (ragged batches: ORT refuses
    padded first-prompt rows with a windowed cache)."""
    B, W = len(prompt_lens), cfg.local_window_size
    full = max(prompt_lens) + steps * chunk + 1
    win = KVCache.empty(cfg, B, capacity)
    ref_k = np.full((B, cfg.kv_num_heads, full, cfg.head_dim), np.nan)
    ref_v = ref_k.copy()
    if prefill == "random":
        for b, total in enumerate(prompt_lens):
            n = resident(total, capacity, W)
            shape = win.key[b, :, :n].shape
            win.key[b, :, :n] = rng.standard_normal(shape)
            win.value[b, :, :n] = rng.standard_normal(shape)
            ref_k[b, :, total - n:total], ref_v[b, :, total - n:total] = win.key[b, :, :n], win.value[b, :, :n]
    win_cpu = win.copy()
    lens = list(prompt_lens)
    evicted = False
    for i in range(0 if prefill == "prompt" else 1, steps + 1):
        if i == 0:
            step = prompt_step(cfg, rng, lens, positions=full + 8)
        else:
            step = random_step(cfg, rng, lens, chunk, positions=full + 8)
            lens = [x + chunk for x in lens]
        label = f"{what} step {i} (lens {lens}, capacity {capacity}, window {W})"
        out = run_gqa_shared(sess, cfg, win, step)
        out_cpu = run_gqa_shared(cpu, cfg, win_cpu, step)
        want, ref_k, ref_v, valid = gqa_reference(cfg, step, ref_k, ref_v, shared=True)
        check_close(out, want, label + " output", valid, cfg.dtype)
        check_close(out, out_cpu, label + " output vs CPU EP", valid, cfg.dtype)
        check_window(win, ref_k, ref_v, lens, capacity, W, label, cfg.dtype)
        for b, total in enumerate(lens):
            n = resident(total, capacity, W)
            for got, cpu_rows, name in ((win.key, win_cpu.key, "key"), (win.value, win_cpu.value, "value")):
                check_close(got[b, :, :n], cpu_rows[b, :, :n], f"{label} row {b} present_{name} vs CPU EP",
                            dtype=cfg.dtype)
        evicted |= any(t > capacity for t in lens)
    assert evicted, f"{what}: the sequence never filled the window buffer"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("capacity", [6, 9])  # C == W (genai's default) and slack above it
def test_window_decode(isa, capacity, rng, seed):
    require_isa(isa)
    cfg = window_config()
    hs, cs = hina_session(build_gqa_model(cfg), isa=isa, threads=2), cpu_session(build_gqa_model(cfg))
    what = f"HinaMoE isa={isa} seed {seed} [{cfg.describe()}]"
    run_window_sequence(hs, cs, cfg, rng, [4], steps=14, capacity=capacity, what=what)
    # A prompt longer than the buffer, then decode.
    run_window_sequence(hs, cs, cfg, rng, [capacity + 5], steps=6, capacity=capacity, what=what + " long prompt")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("feature", [
    dict(packed=False),
    dict(attention_bias=True),
    dict(head_sink=False, smooth_softmax=True),
    dict(do_rotary=False, softcap=3.0),
    dict(rotary_interleaved=True, position_ids=True),
    dict(num_heads=6, kv_num_heads=3, head_dim=128, local_window_size=4),
], ids=["separate_qkv", "bias", "smooth_softmax", "softcap", "rotary_position_ids", "g2_d128"])
def test_window_features(isa, feature, rng, seed):
    require_isa(isa)
    cfg = window_config(**feature)
    hs, cs = hina_session(build_gqa_model(cfg), isa=isa, threads=2), cpu_session(build_gqa_model(cfg))
    what = f"HinaMoE isa={isa} seed {seed} [{cfg.describe()}]"
    cap = cfg.local_window_size + 2
    run_window_sequence(hs, cs, cfg, rng, [5], steps=12, capacity=cap, what=what)


@pytest.mark.parametrize("isa", ISAS)
def test_window_ragged_batch(isa, rng, seed):
    """Rows of different lengths evict at different steps."""
    require_isa(isa)
    cfg = window_config()
    hs, cs = hina_session(build_gqa_model(cfg), isa=isa, threads=2), cpu_session(build_gqa_model(cfg))
    run_window_sequence(hs, cs, cfg, rng, [9, 3, 6], steps=10, capacity=7,
                        what=f"HinaMoE isa={isa} seed {seed} ragged", prefill="random")
    run_window_sequence(hs, cs, cfg, rng, [5, 5], steps=6, capacity=7,
                        what=f"HinaMoE isa={isa} seed {seed} batch prompt")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("chunk", [3, 8])  # 8 > capacity: the step evicts keys its first queries read
def test_window_multi_token_steps(isa, chunk, rng, seed):
    """Batch-1 continued prompts of several tokens per call."""
    require_isa(isa)
    cfg = window_config()
    hs, cs = hina_session(build_gqa_model(cfg), isa=isa, threads=2), cpu_session(build_gqa_model(cfg))
    run_window_sequence(hs, cs, cfg, rng, [4], steps=5, capacity=7, chunk=chunk,
                        what=f"HinaMoE isa={isa} seed {seed} chunk {chunk}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_window_half_types(dtype, rng, seed):
    """float16 against the CPU EP too; bfloat16 (no CPU kernel) against the reference alone."""
    cfg = window_config(dtype=dtype)
    hs = hina_session(build_gqa_model(cfg), isa="avx2" if dtype == "float16" else "amx-emu", threads=2)
    if dtype == "float16":
        require_isa("avx2")
        run_window_sequence(hs, cpu_session(build_gqa_model(cfg)), cfg, rng, [5], steps=10, capacity=8,
                            what=f"{dtype} seed {seed}")
        return
    B, C, W = 1, 8, cfg.local_window_size
    win = KVCache.empty(cfg, B, C)
    ref_k = np.full((B, cfg.kv_num_heads, 32, cfg.head_dim), np.nan)
    ref_v = ref_k.copy()
    lens = [5]
    for i in range(11):
        step = prompt_step(cfg, rng, lens, positions=40) if i == 0 else random_step(cfg, rng, lens, 1, positions=40)
        lens = lens if i == 0 else [lens[0] + 1]
        out = run_gqa_shared(hs, cfg, win, step)
        want, ref_k, ref_v, valid = gqa_reference(cfg, step, ref_k, ref_v, shared=True)
        check_close(out, want, f"{dtype} step {i} output", valid, dtype)
        check_window(win, ref_k, ref_v, lens, C, W, f"{dtype} step {i}", dtype)


def test_window_separate_buffers(rng, seed):
    """past and present as separate tensors (plain run): present gets the
    evicted layout, the past stays untouched."""
    cfg = window_config()
    hs, cs = hina_session(build_gqa_model(cfg), isa="avx2", threads=2), cpu_session(build_gqa_model(cfg))
    C, W = 7, cfg.local_window_size
    for past_len in (3, 7, 12):
        n = resident(past_len, C, W)
        past = KVCache.empty(cfg, 1, C, rng=rng)
        before = past.copy()
        step = random_step(cfg, rng, [past_len], 1, positions=past_len + 8)
        out, pk, pv = run_gqa(hs, cfg, step, past)
        out_c, pk_c, pv_c = run_gqa(cs, cfg, step, past)
        assert np.array_equal(past.key, before.key) and np.array_equal(past.value, before.value)
        # Reference: the resident past rows at their absolute positions in a full cache.
        full_k = np.full((1, cfg.kv_num_heads, past_len + 1, cfg.head_dim), np.nan)
        full_v = full_k.copy()
        full_k[:, :, past_len - n:past_len], full_v[:, :, past_len - n:past_len] = past.key[:, :, :n], past.value[:, :, :n]
        want, ref_k, ref_v, valid = gqa_reference(cfg, step, full_k, full_v, shared=True)
        what = f"separate past {past_len} seed {seed}"
        check_close(out, want, what + " output", valid)
        check_close(out, out_c, what + " output vs CPU EP", valid)
        m = resident(past_len + 1, C, W)
        check_close(pk[:, :, :m], ref_k[:, :, past_len + 1 - m:], what + " present_key")
        check_close(pv[:, :, :m], pv_c[:, :, :m], what + " present_value vs CPU EP")


@pytest.mark.parametrize("case", ["capacity_below_window", "padded_prompt_row", "no_window"])
def test_window_errors(case, rng):
    """Bad windowed calls are HinaMoE errors naming the op and the reason
    (the CPU EP refuses the same calls)."""
    cfg = window_config(local_window_size=-1 if case == "no_window" else 6)
    if case == "no_window":
        with pytest.raises(Exception) as ei:
            hina_session(build_gqa_model(cfg))
        msg = error_text(ei.value)
        assert "GroupQueryAttention" in msg and "local_window_size > 0" in msg, msg
        return
    sess = hina_session(build_gqa_model(cfg))
    if case == "capacity_below_window":
        cache, step = KVCache.empty(cfg, 1, 5), random_step(cfg, rng, [3], 1)
        want = "must be >= local_window_size"
    else:
        cache, step = KVCache.empty(cfg, 2, 8), prompt_step(cfg, rng, [7, 4])
        want = "seqlens_k[1] = 3 is too small for sequence_length 7"
    with pytest.raises(Exception) as ei:
        run_gqa_shared(sess, cfg, cache, step)
    msg = error_text(ei.value)
    assert "GroupQueryAttention" in msg and want in msg, msg


def _nonfinite_case(name, dtype, rng):
    """(cfg, capacity, lens, step, buffer) of one named NaN/Inf case; the
    buffer's rows are as the op leaves them after ``lens`` tokens."""
    kw = dict(dtype=dtype, num_heads=4, kv_num_heads=1, head_dim=16, head_sink=False, packed=False)
    cap, lens, new = 7, [9], 1
    if name == "nan_v_in_window":
        cfg = window_config(**kw)
    elif name == "inf_v_just_evicted":  # a full buffer: this decode step evicts rows 0..C-W
        cfg, lens = window_config(**kw), [7]
    elif name == "nan_key_staged":  # 8 new tokens > capacity: the staged path
        cfg, new = window_config(**kw), 8
    else:  # fully_masked: head 1's bias -inf on every column
        cfg = window_config(attention_bias=True, **kw)
    step = random_step(cfg, rng, lens, new, positions=lens[0] + new + 4)
    win = KVCache.empty(cfg, 1, cap)
    n = resident(lens[0], cap, cfg.local_window_size)
    win.key[0, :, :n] = rng.standard_normal(win.key[0, :, :n].shape)
    win.value[0, :, :n] = rng.standard_normal(win.value[0, :, :n].shape)
    if name == "nan_v_in_window":
        win.value[0, 0, n - 2, 3] = np.nan
        win.value[0, 0, n - 1, 5] = np.inf
    elif name == "inf_v_just_evicted":
        win.value[0, 0, 0, 3] = np.inf
        win.key[0, 0, 0, 2] = np.nan
    elif name == "nan_key_staged":
        step.key[0, 1, 4] = np.nan
    else:
        step.attention_bias[0, 1] = -np.inf
    return cfg, cap, lens, step, win


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("name", ["nan_v_in_window", "inf_v_just_evicted", "nan_key_staged", "fully_masked"])
def test_window_nonfinite(name, dtype, isa, rng, seed):
    """NaN/Inf through a windowed cache, position by position: against the
    CPU EP (float32/float16) or ``ref`` (bfloat16), outputs and the buffer
    afterwards; and the NaN/Inf positions against the float64 reference on a
    full-length cache."""
    require_isa(isa)
    cfg, cap, lens, step, win = _nonfinite_case(name, dtype, rng)
    model = build_gqa_model(cfg)
    other = cpu_session(model) if dtype != "bfloat16" else hina_session(model, isa="ref")
    mine, theirs = win.copy(), win.copy()
    got = run_gqa_shared(hina_session(model, isa=isa, threads=2), cfg, mine, step).astype(np.float64)
    want = run_gqa_shared(other, cfg, theirs, step).astype(np.float64)
    total, new, w = lens[0], step.query.shape[1], cfg.local_window_size
    n = resident(total, cap, w)
    full_k = np.full((1, cfg.kv_num_heads, total + new, cfg.head_dim), np.nan)
    full_v = full_k.copy()
    full_k[:, :, total - n:total], full_v[:, :, total - n:total] = win.key[:, :, :n], win.value[:, :, :n]
    ref, _, _, valid = gqa_reference(cfg, step, full_k, full_v, shared=True)
    what = f"{name} {dtype} isa={isa} seed {seed}"
    g = got.reshape(ref.shape[0], ref.shape[1], -1)
    w_ = want.reshape(g.shape)
    if dtype == "float32":
        # ORT's MLAS float softmax drops a NaN score at some positions (README):
        # its NaNs are HinaMoE's, the rest matches, float64 decides the NaNs.
        assert not (np.isnan(w_) & ~np.isnan(g))[valid].any(), what + ": a CPU EP NaN is not NaN on HinaMoE"
        keep = valid[..., None] & ~np.isnan(g)
        check_same_nonfinite(g[keep], w_[keep], what + " vs CPU EP", dtype=dtype)
    else:
        check_same_nonfinite(g, w_, what + " vs " + ("CPU EP" if dtype != "bfloat16" else "ref"), valid, dtype=dtype)
    assert (~np.isfinite(g)).any() == (name != "inf_v_just_evicted" and not (name == "fully_masked"
                                                                             and dtype == "float32")), what
    check_same_nonfinite(np.where(np.isfinite(g), 0, g), np.where(np.isfinite(ref), 0, ref), what + " vs float64",
                         valid, dtype=dtype)
    m = resident(total + new, cap, w)
    for got_rows, want_rows, label in ((mine.key, theirs.key, "key"), (mine.value, theirs.value, "value")):
        check_same_nonfinite(got_rows[0, :, :m], want_rows[0, :, :m], f"{what} present_{label}", dtype=dtype)
