"""float64 numpy reference of com.microsoft::GroupQueryAttention, written
from the op's definition (ORT's schema text and CPU semantics), one query
token and one head at a time -- no shared code with the kernels.

Per batch row b with total_b = seqlens_k[b] + 1 tokens after the step:
past_b = 0 on a first prompt (S == total_sequence_length), else total_b - S.
Rotary position of token s: past_b + s, or with position_ids
position_ids[b, s] -- on a first prompt position_ids[0, 0] + s (ORT's CPU EP
reads only the first element then). The S new K/V rows (K rotated) land at [past_b, past_b + S) of the present
cache. Query token s sees keys j < L = min(past_b + s + 1, total_b), only the
last W of them with a local window W; score = scale * q.k, then softcap,
then + attention_bias; softmax (with a sink logit in the denominator for
smooth_softmax / head_sink); out = sum p_j V_j.

Non-finite values follow ORT's CPU kernel (checked against it position by
position in tests/gqa/test_gqa_nonfinite.py): IEEE arithmetic throughout (a NaN
or +inf score or sink gives NaN); a query whose visible scores are all -inf
with no sink gets weight 0 on every key in float32 and NaN in float16 (ORT's
half kernel) and bfloat16 (HinaMoE's choice, as for float16); ORT's P.V runs
over keys [0, total_b) with weight 0 on hidden ones, so a NaN/Inf V element
of a later prompt token, or of a row this step wrote before the window,
gives NaN in its column (0 x Inf). Cached rows before a local window are not
read (ORT multiplies them by 0 too; HinaMoE differs).
"""

from __future__ import annotations

import numpy as np


def rotate(x: np.ndarray, pos: int, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """RoPE on one head vector x [d] at position pos; dims >= R pass through."""
    half = cos.shape[1]
    r = 2 * half
    c, s_ = cos[pos].astype(np.float64), sin[pos].astype(np.float64)
    y = x.astype(np.float64).copy()
    if interleaved:
        a, b = x[0:r:2].astype(np.float64), x[1:r:2].astype(np.float64)
        y[0:r:2] = a * c - b * s_
        y[1:r:2] = b * c + a * s_
    else:
        a, b = x[:half].astype(np.float64), x[half:r].astype(np.float64)
        y[:half] = a * c - b * s_
        y[half:r] = b * c + a * s_
    return y


def split_qkv(cfg, step):
    """Q [B, S, N, d], K/V [B, S, Nkv, d] as float64 from separate or packed inputs."""
    n, nkv, d = cfg.num_heads, cfg.kv_num_heads, cfg.head_dim
    q = step.query.astype(np.float64)
    b, s = q.shape[:2]
    if step.key is None:
        q, k, v = q[..., :n * d], q[..., n * d:(n + nkv) * d], q[..., (n + nkv) * d:]
    else:
        k, v = step.key.astype(np.float64), step.value.astype(np.float64)
    return q.reshape(b, s, n, d), k.reshape(b, s, nkv, d), v.reshape(b, s, nkv, d)


def gqa_reference(cfg, step, past_key=None, past_value=None, shared: bool = False):
    """Returns ``(output [B, S, N*d], present_key, present_value, valid)``,
    all float64; ``valid[b, s]`` says which output rows are defined (padded
    prompt tokens are not).

    past_key/past_value: the past cache (None without past). shared: the
    present cache is the past buffer itself (rows outside the new ones keep
    their values); else present is zeros with rows [0, past_b) copied.
    """
    n, nkv, d = cfg.num_heads, cfg.kv_num_heads, cfg.head_dim
    g = n // nkv
    q, k_new, v_new = split_qkv(cfg, step)
    bsz, s_len = q.shape[:2]
    total_seq = int(step.total_sequence_length)
    first_prompt = s_len == total_seq
    past_cap = 0 if past_key is None else past_key.shape[2]
    cap = past_cap if shared else max(total_seq, past_cap)
    if shared:
        pk, pv = past_key.astype(np.float64).copy(), past_value.astype(np.float64).copy()
    else:
        pk, pv = np.zeros((bsz, nkv, cap, d)), np.zeros((bsz, nkv, cap, d))
    scale = cfg.scale if cfg.scale else 1.0 / np.sqrt(d)
    out = np.zeros((bsz, s_len, n, d))
    valid = np.zeros((bsz, s_len), dtype=bool)

    for b in range(bsz):
        total_b = int(step.seqlens_k[b]) + 1
        past_b = 0 if first_prompt else total_b - s_len
        if not shared and past_key is not None and past_b > 0:
            pk[b, :, :past_b] = past_key[b, :, :past_b]
            pv[b, :, :past_b] = past_value[b, :, :past_b]

        def position(s):
            # ORT reads only position_ids[0, 0] on a first prompt (as its
            # schema says: "uses only the first element"), every id later.
            if step.position_ids is not None:
                return int(step.position_ids[0, 0]) + s if first_prompt else int(step.position_ids[b, s])
            return past_b + s

        for s in range(s_len):
            for h in range(nkv):
                kv = k_new[b, s, h]
                if cfg.do_rotary:
                    kv = rotate(kv, position(s), step.cos_cache, step.sin_cache, cfg.rotary_interleaved)
                pk[b, h, past_b + s] = kv
                pv[b, h, past_b + s] = v_new[b, s, h]

        for s in range(s_len):
            lim = min(past_b + s + 1, total_b)
            valid[b, s] = past_b + s < total_b
            lo = max(0, lim - cfg.local_window_size) if cfg.local_window_size > 0 else 0
            for h in range(n):
                qv = q[b, s, h]
                if cfg.do_rotary:
                    qv = rotate(qv, position(s), step.cos_cache, step.sin_cache, cfg.rotary_interleaved)
                keys = pk[b, h // g, lo:lim]
                x = scale * (keys @ qv)
                if cfg.softcap > 0:
                    x = cfg.softcap * np.tanh(x / cfg.softcap)
                if step.attention_bias is not None:
                    ab = step.attention_bias
                    x = x + ab[b if ab.shape[0] > 1 else 0, h if ab.shape[1] > 1 else 0, s,
                               lo:lim].astype(np.float64)
                sink = None
                if step.head_sink is not None:
                    sink = float(step.head_sink[h])
                elif cfg.smooth_softmax:
                    sink = 0.0
                with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                    m = np.max(x)
                    if sink is not None:
                        m = np.maximum(m, sink)  # NaN in either stays NaN
                    if m == -np.inf and cfg.dtype == "float32":
                        w = np.zeros_like(x)  # all masked: ORT's float softmax gives weight 0
                    else:
                        e = np.exp(x - m)
                        den = e.sum() + (np.exp(sink - m) if sink is not None else 0.0)
                        w = e / den
                    o = w @ pv[b, h // g, lo:lim]
                    # hidden keys (later keys of a prompt, this step's rows
                    # before the window): weight 0, only 0 x Inf/NaN shows
                    for hidden in (pv[b, h // g, lim:total_b], pv[b, h // g, past_b:lo]):
                        o[~np.isfinite(hidden).all(axis=0)] = np.nan
                out[b, s, h] = o
    return out.reshape(bsz, s_len, n * d), pk, pv, valid

