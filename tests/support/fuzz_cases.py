"""The fuzzer's cases: random MoE, QMoE and GroupQueryAttention nodes (attributes,
shapes, dtypes, tiers, simulated NUMA nodes) fed random and extreme values
(NaN, Inf, the largest finite value, denormals, empty dims, tied router
logits; GQA also with ``sliding_window_cache=1``: a shared window buffer
past eviction, decode and staged multi-token steps), each checked against the CPU EP where it runs the node and against
the float64 reference (and, for bfloat16 GQA, HinaMoE's ``ref`` tier) where
it does not.

A case is a small JSON-able dict (``generate(op, rng)``); ``run_case(case)``
rebuilds everything from it, so a failing case replays from its printed
parameters alone::

    python tests/support/fuzz_worker.py --replay '{"op": "gqa", "seed": 5, ...}'

``run_case`` returns a short verdict ("ok", "refused: ...") or raises
AssertionError. Crashes and hangs are the worker's business
(fuzz_worker.py runs cases in a subprocess).

QMoE cases: 4/8 bits, row-wise or block-wise scales (blocks 16..128),
zero points, biases, router_weights, every gate layout and activation,
accuracy_level 0/4; NaN/Inf tokens, tied/huge/NaN router logits, NaN
scales; scales and zero points of wrong shapes, a block_size not a power of
two, 2/3-bit weights. Against the CPU EP (floating-point experts:
``ORT_QMOE_CPU_QNBIT_GEMM=fp32``) where it runs the node, always against
the float64 dequantising reference (tests/support/qmoe_reference.py).

Adding an op: write ``gen_<op>(rng) -> dict`` and ``run_<op>(case) -> str``
and register both in ``OPS``.
"""

from __future__ import annotations

import numpy as np

from hinamoe.models import (
    GQAConfig,
    KVCache,
    build_gqa_model,
    build_moe_model,
    np_dtype,
    prompt_step,
    random_input,
    random_logits,
    random_step,
    run_gqa,
    run_gqa_shared,
    run_moe,
    weight_feeds,
)

from support.gqa_cases import check_close as gqa_check_close
from support.gqa_cases import check_same_nonfinite
from support.gqa_reference import gqa_reference
from support.moe_cases import ACT_FUSIONS, random_config
from support.moe_reference import check_close as moe_check_close
from support.moe_reference import reference_for
from support.runtime import CPU_EP_F16_MOE_OK
from support.sessions import cpu_session, error_text, hina_session

ISAS = ("ref", "avx2", "avx512", "amx-emu")
DTYPES = ("float32", "float16", "bfloat16")
NODE = "gqa"  # the node name build_gqa_model gives


def _pick(rng, seq):
    return seq[int(rng.integers(len(seq)))]


def _common(rng) -> dict:
    return {"seed": int(rng.integers(2**31)), "isa": _pick(rng, ISAS), "dtype": _pick(rng, DTYPES),
            "threads": int(rng.integers(1, 3)), "numa": "fake:2" if rng.random() < 0.25 else None}


def _session_options(case) -> dict:
    return {"numa": case["numa"]} if case.get("numa") else {}


def _special(kind: str, dtype: str) -> float:
    big = {"float32": 3.4e38, "float16": 65504.0, "bfloat16": 3.38e38}[dtype]
    tiny = {"float32": 1e-41, "float16": 6e-8, "bfloat16": 1e-39}[dtype]
    return {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "max": big, "-max": -big,
            "denormal": tiny, "zero": 0.0}[kind]


# ------------------------------------------------------------------ GQA

GQA_TENSORS = ("query", "key", "value", "past_key", "past_value", "attention_bias", "head_sink")
GQA_SPECIALS = ("nan", "inf", "-inf", "max", "-max", "denormal", "zero")
GQA_MALFORMED = ("seqlens_high", "seqlens_negative", "bias_keys", "past_heads", "total_inconsistent",
                 "sink_len")


def gen_gqa(rng) -> dict:
    c = _common(rng)
    g = _pick(rng, (1, 2, 3, 4, 5, 8, 16))
    nkv = int(rng.integers(1, 3))
    d = _pick(rng, (16, 32, 64, 80, 128) if rng.random() < 0.8 else (8, 24, 40, 72))
    c.update(num_heads=g * nkv, kv_num_heads=nkv, head_dim=d, packed=bool(rng.random() < 0.3),
             do_rotary=bool(d % 16 == 0 and rng.random() < 0.4), attention_bias=bool(rng.random() < 0.3),
             head_sink=bool(rng.random() < 0.2), softcap=float(_pick(rng, (0.0, 0.0, 0.0, 3.0))),
             scale=float(_pick(rng, (0.0, 0.0, 0.05, 1.0))),
             local_window_size=int(_pick(rng, (-1, -1, -1, 1, 3, 64))))
    c["smooth_softmax"] = bool(not c["head_sink"] and rng.random() < 0.2)
    if c["do_rotary"]:
        c["rotary_interleaved"] = bool(rng.random() < 0.5)
        c["rotary_dim"] = int(d // 2) if (d // 4) % 8 == 0 and rng.random() < 0.3 else 0
        c["position_ids"] = bool(rng.random() < 0.4)
    if c["attention_bias"]:
        c["bias_broadcast_batch"] = bool(rng.random() < 0.3)
        c["bias_broadcast_heads"] = bool(rng.random() < 0.3)
    phase = _pick(rng, ("prompt", "decode", "decode", "continue"))
    c["phase"] = phase
    if phase == "prompt":
        b = int(rng.integers(0 if rng.random() < 0.05 else 1, 4))
        c["lens"] = [int(x) for x in rng.integers(1, 24, size=b)]
        c["new"] = max(c["lens"], default=1)
    elif phase == "decode":
        b = int(rng.integers(0 if rng.random() < 0.05 else 1, 4))
        c["lens"] = [int(x) for x in rng.integers(0 if rng.random() < 0.2 else 1, 300, size=b)]
        c["new"] = 1
    else:
        c["lens"] = [int(rng.integers(1, 200))]
        c["new"] = int(rng.integers(2, 12))
    if c["lens"] and phase != "prompt" and max(c["lens"]) == 0:
        c["lens"][0] = 1
    c["buffer"] = _pick(rng, ("shared", "shared", "separate"))
    c["slack"] = int(_pick(rng, (0, 0, 3, 17)))  # extra capacity of a shared buffer
    c["magnitude"] = float(_pick(rng, (1.0, 1.0, 1.0, 4.0, 1e-3)))
    c["specials"] = []
    if rng.random() < 0.6:
        names = [n for n in GQA_TENSORS if _gqa_has(c, n)]
        for _ in range(int(rng.integers(1, 4))):
            c["specials"].append([_pick(rng, names), _pick(rng, GQA_SPECIALS), int(rng.integers(1, 4))])
    c["malformed"] = _pick(rng, GQA_MALFORMED) if rng.random() < 0.12 else None
    if rng.random() < 0.2:
        _window_cache_case(rng, c)
    return c


def _window_cache_case(rng, c):
    """Turn a case into a sliding_window_cache=1 step: a window W, a buffer
    of capacity C >= W shared by past and present (as genai binds it), rows
    filled as the op leaves them after ``lens[b]`` tokens (often past
    eviction), then a decode step or a batch-1 multi-token step (long ones
    evict keys their first queries read: the staged path)."""
    w = int(_pick(rng, (1, 2, 3, 6, 16)))
    c["local_window_size"] = w
    c["window_capacity"] = w + int(_pick(rng, (0, 0, 1, 3, 9)))
    c["buffer"], c["malformed"] = "shared", None
    if c["phase"] in ("prompt", "continue"):
        c["phase"], b = "continue", 1
        c["new"] = int(rng.integers(2, c["window_capacity"] + 4))
    else:
        c["phase"], b = "decode", int(rng.integers(1, 4))
        c["new"] = 1
    c["lens"] = [int(x) for x in rng.integers(1, 3 * c["window_capacity"] + 4, size=b)]
    if rng.random() < 0.6:  # specials inside and outside the window, in Q, K, V, bias, sink
        names = [n for n in GQA_TENSORS if _gqa_has(c, n)]
        c["specials"] = [[_pick(rng, names), _pick(rng, GQA_SPECIALS), int(rng.integers(1, 4))]
                         for _ in range(int(rng.integers(1, 4)))]


def _gqa_has(c, name: str) -> bool:
    if name in ("key", "value"):
        return not c["packed"]
    if name in ("past_key", "past_value"):
        return c["phase"] != "prompt"
    if name == "attention_bias":
        return c["attention_bias"]
    if name == "head_sink":
        return c["head_sink"]
    return True


def _touches_v(c, name: str) -> bool:
    """Whether specials poked into ``name`` can land in V (packed QKV: query)."""
    return name.endswith("value") or (name == "query" and c["packed"])


def _gqa_config(c) -> GQAConfig:
    keys = ("num_heads", "kv_num_heads", "head_dim", "dtype", "packed", "do_rotary", "rotary_interleaved",
            "rotary_dim", "position_ids", "attention_bias", "bias_broadcast_batch", "bias_broadcast_heads",
            "head_sink", "smooth_softmax", "local_window_size", "softcap", "scale")
    return GQAConfig(**{k: c[k] for k in keys if k in c})


def _poke(rng, arr, kind, count, dtype, summed=False):
    """Set ``count`` random elements of ``arr`` (in place) to a special value.
    ``summed``: Q, K or V, whose elements enter sums (q.k, p.V). There
    float32/bfloat16 "max" is 1e36: near FLT_MAX whether a sum overflows
    depends on its order and on where the softmax is normalised (every
    kernel's differs), and HinaMoE scores (scale*q).k where ORT computes
    scale*(q.k) (a documented difference)."""
    if arr is None or arr.size == 0:
        return
    value = _special(kind, dtype)
    if summed and dtype != "float16" and kind in ("max", "-max"):
        value = np.copysign(1e36, value)
    flat = arr.reshape(-1)
    for i in rng.integers(0, flat.size, size=count):
        flat[int(i)] = value


def _gqa_inputs(c, cfg, rng):
    """(step, past KVCache or None, shared) of a case."""
    lens, new = c["lens"], c["new"]
    b = len(lens)
    if c["phase"] == "prompt":
        step = prompt_step(cfg, rng, lens) if b else prompt_step(cfg, rng, [1])
        past_lens = [0] * b
    else:
        step = random_step(cfg, rng, lens, new) if b else random_step(cfg, rng, [1], new)
        past_lens = lens
    if b == 0:  # an empty batch
        step.query = step.query[:0]
        step.key = None if step.key is None else step.key[:0]
        step.value = None if step.value is None else step.value[:0]
        step.seqlens_k = step.seqlens_k[:0]
        if step.attention_bias is not None:
            step.attention_bias = step.attention_bias[:0] if step.attention_bias.shape[0] > 1 \
                else step.attention_bias
        if step.position_ids is not None:
            step.position_ids = step.position_ids[:0]
    mag = c["magnitude"]
    if mag != 1.0:
        dt = np_dtype(cfg.dtype)
        for name in ("query", "key", "value"):
            arr = getattr(step, name)
            if arr is not None:
                setattr(step, name, (arr.astype(np.float64) * mag).astype(dt))
    shared = c["buffer"] == "shared"
    total = step.total_sequence_length
    if c["phase"] == "prompt" and not shared:
        past = None
    elif shared:
        cap = total + c["slack"]
        past = KVCache.empty(cfg, b, cap)  # NaN rows: a kernel reading one shows
        for r, n in enumerate(past_lens):
            past.key[r, :, :n] = (rng.standard_normal(past.key[r, :, :n].shape) * mag).astype(past.key.dtype)
            past.value[r, :, :n] = rng.standard_normal(past.value[r, :, :n].shape).astype(past.key.dtype)
    else:  # separate: a growing cache (dim 2 + S = total)
        past = KVCache.empty(cfg, b, max(total - new, 0), rng=rng)
    for name, kind, count in c["specials"]:
        if name in ("past_key", "past_value"):
            if past is None:
                continue
            arr = past.key if name == "past_key" else past.value
            # only rows that hold past tokens (a shared buffer's unused rows stay NaN)
            for r, n in enumerate(past_lens):
                if n:
                    _poke(rng, arr[r, :, :n], kind, count, cfg.dtype, summed=True)
        else:
            _poke(rng, getattr(step, name), kind, count, cfg.dtype,
                  summed=name in ("query", "key", "value"))
    # A local window: cached rows before it are never read (a documented
    # difference from ORT, which multiplies them by 0): no non-finite V there.
    if cfg.local_window_size > 0 and past is not None:
        v = past.value.astype(np.float64)
        for r, n in enumerate(past_lens):
            keep = max(0, min(n, n + new - cfg.local_window_size))
            bad = ~np.isfinite(v[r, :, :keep])
            past.value[r, :, :keep][bad] = 0
    return step, past, shared


def _gqa_malform(c, step, past):
    m = c["malformed"]
    if m == "seqlens_high" and step.seqlens_k.size:
        step.seqlens_k[-1] = step.total_sequence_length + 2
    elif m == "seqlens_negative" and step.seqlens_k.size:
        step.seqlens_k[0] = -2
    elif m == "bias_keys" and step.attention_bias is not None:
        step.attention_bias = step.attention_bias[..., :max(1, step.attention_bias.shape[-1] - 1)]
    elif m == "past_heads" and past is not None and past.key.shape[1] > 1:
        past = KVCache(past.key[:, :1].copy(), past.value[:, :1].copy())
    elif m == "total_inconsistent" and c["phase"] != "prompt":
        step.total_sequence_length += 1
    elif m == "sink_len" and step.head_sink is not None:
        step.head_sink = step.head_sink[:-1]
    else:
        return step, past, False
    return step, past, True


def _run(fn):
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001 -- an ORT error is a result here
        return None, error_text(e)


def resident_rows(total: int, capacity: int, window: int) -> int:
    """Rows a windowed buffer keeps after ``total`` tokens (the schema's L(T))."""
    if total <= capacity:
        return total
    g = capacity - window + 1
    return total - g * -(-(total - capacity) // g)


def _window_inputs(c, cfg, rng):
    """(step, windowed buffer, float64 full-length past for the reference)."""
    lens, new, cap, w = c["lens"], c["new"], c["window_capacity"], cfg.local_window_size
    full = max(lens) + new
    step = random_step(cfg, rng, lens, new, positions=full + 4)
    mag = c["magnitude"]
    dt = np_dtype(cfg.dtype)
    if mag != 1.0:
        for name in ("query", "key", "value"):
            arr = getattr(step, name)
            if arr is not None:
                setattr(step, name, (arr.astype(np.float64) * mag).astype(dt))
    win = KVCache.empty(cfg, len(lens), cap)  # unused rows NaN: a kernel reading one shows
    for b, total in enumerate(lens):
        n = resident_rows(total, cap, w)
        shape = win.key[b, :, :n].shape
        win.key[b, :, :n] = (rng.standard_normal(shape) * mag).astype(dt)
        win.value[b, :, :n] = rng.standard_normal(shape).astype(dt)
    for name, kind, count in c["specials"]:
        if name in ("past_key", "past_value"):
            arr = win.key if name == "past_key" else win.value
            for b, total in enumerate(lens):
                _poke(rng, arr[b, :, :resident_rows(total, cap, w)], kind, count, cfg.dtype, summed=True)
        else:
            _poke(rng, getattr(step, name), kind, count, cfg.dtype, summed=name in ("query", "key", "value"))
    full_k = np.full((len(lens), cfg.kv_num_heads, full, cfg.head_dim), np.nan)
    full_v = full_k.copy()
    for b, total in enumerate(lens):
        n = resident_rows(total, cap, w)
        # Rows before the last query's window are not read by every query
        # (ORT multiplies them by 0, HinaMoE skips them: a documented
        # difference): no non-finite V there.
        v = win.value[b, :, :n]
        before = max(0, min(n, total + new - w - (total - n)))
        bad = ~np.isfinite(v[:, :before].astype(np.float64))
        v[:, :before][bad] = 0
        full_k[b, :, total - n:total], full_v[b, :, total - n:total] = win.key[b, :, :n], win.value[b, :, :n]
    return step, win, full_k, full_v


def run_gqa_case(c) -> str:
    from support.bad_input import relax_inputs

    if c.get("window_capacity"):
        return run_gqa_window_case(c)

    rng = np.random.default_rng(c["seed"])
    cfg = _gqa_config(c)
    step, past, shared = _gqa_inputs(c, cfg, rng)
    step, past, malformed = _gqa_malform(c, step, past) if c.get("malformed") else (step, past, False)
    model = build_gqa_model(cfg, name=NODE)
    if malformed:
        model = relax_inputs(model)
    what = f"gqa case {c}"

    def run_on(sess):
        if shared and past is not None:
            cache = past.copy()
            return run_gqa_shared(sess, cfg, cache, step)
        return run_gqa(sess, cfg, step, past)[0]

    got, err = _run(lambda: run_on(hina_session(model, isa=c["isa"], threads=c["threads"],
                                                extra_options=_session_options(c))))
    if not c["lens"]:  # an empty batch: ORT 1.32's CPU EP dies of SIGFPE there (integer division by 0)
        if err is not None and malformed:
            assert "GroupQueryAttention" in err, f"{what}: error without the op's name: {err}"
            return "refused: " + err[-160:]
        assert err is None, f"{what}: an empty batch refused: {err}"
        assert got.size == 0 and got.shape[0] == 0, f"{what}: output {got.shape} for an empty batch"
        return "ok (empty)"
    cpu_runs = cfg.dtype != "bfloat16"
    if cpu_runs:
        want, cpu_err = _run(lambda: run_on(cpu_session(model, threads=c["threads"])))
    else:
        want, cpu_err = _run(lambda: run_on(hina_session(model, isa="ref")))
    if err is not None:
        assert "GroupQueryAttention" in err, f"{what}: error without the op's name: {err}"
        # Malformed input may be refused even where ORT runs it (e.g. ORT takes
        # seqlens_k beyond total_sequence_length while the buffer has room).
        assert cpu_err is not None or malformed, \
            f"{what}: HinaMoE refused what {'the CPU EP' if cpu_runs else 'ref'} ran: {err}"
        return "refused: " + err[-160:]
    assert cpu_err is None or not cpu_runs, f"{what}: HinaMoE ran what the CPU EP refused: {cpu_err}"
    assert cpu_err is None, f"{what}: ref refused what {c['isa']} ran: {cpu_err}"
    try:
        ref_past_k = None if past is None else past.key
        ref_past_v = None if past is None else past.value
        ref, _, _, valid = gqa_reference(cfg, step, ref_past_k, ref_past_v, shared=shared and past is not None)
    except Exception as e:  # noqa: BLE001
        raise AssertionError(f"{what}: the float64 reference failed on a case both EPs ran: {e}") from e
    return _compare_gqa(c, cfg, got, want, ref, valid, cpu_runs, what)


def run_gqa_window_case(c) -> str:
    """A sliding_window_cache=1 step on a shared windowed buffer: the output
    against the CPU EP (f32/f16) or ``ref`` (bf16) and the float64 reference
    on a full-length cache at absolute positions; the buffer's rows
    afterwards against the CPU EP's / ref's (same non-finite positions)."""
    rng = np.random.default_rng(c["seed"])
    cfg = _gqa_config(c)
    cfg.extra_attrs = {"sliding_window_cache": 1}
    step, win, full_k, full_v = _window_inputs(c, cfg, rng)
    model = build_gqa_model(cfg, name=NODE)
    what = f"gqa window case {c}"
    mine, theirs = win.copy(), win.copy()
    got, err = _run(lambda: run_gqa_shared(hina_session(model, isa=c["isa"], threads=c["threads"],
                                                        extra_options=_session_options(c)), cfg, mine, step))
    cpu_runs = cfg.dtype != "bfloat16"
    other = (lambda: cpu_session(model, threads=c["threads"])) if cpu_runs else (lambda: hina_session(model, isa="ref"))
    want, cpu_err = _run(lambda: run_gqa_shared(other(), cfg, theirs, step))
    assert err is None, f"{what}: HinaMoE refused a valid windowed step: {err}"
    assert cpu_err is None, f"{what}: {'the CPU EP' if cpu_runs else 'ref'} refused it: {cpu_err}"
    ref, _, _, valid = gqa_reference(cfg, step, full_k, full_v, shared=True)
    verdict = _compare_gqa(c, cfg, got, want, ref, valid, cpu_runs, what)
    for b, total in enumerate(c["lens"]):
        n = resident_rows(total + c["new"], c["window_capacity"], cfg.local_window_size)
        for name in ("key", "value"):
            g = getattr(mine, name)[b, :, :n].astype(np.float64)
            w = getattr(theirs, name)[b, :, :n].astype(np.float64)
            check_same_nonfinite(g, w, f"{what} row {b} present_{name}", dtype=cfg.dtype)
    return verdict


def _compare_gqa(c, cfg, got, want, ref, valid, cpu_runs, what) -> str:
    if got.size == 0:
        assert want.size == 0
        return "ok (empty)"
    # Tolerances grow with the softmax's sharpness: a score's rounding error
    # scales with scale * |q| * |k| * sqrt(d) (1 for unit inputs at the
    # default scale), and 16-bit rotary rounds the rotated Q and K.
    alpha = cfg.scale or 1.0 / np.sqrt(cfg.head_dim)
    factor = max(1.0, alpha * np.sqrt(cfg.head_dim) * c["magnitude"] ** 2)
    if cfg.do_rotary and cfg.dtype != "float32":
        factor *= 2
    g = got.astype(np.float64).reshape(ref.shape[0], ref.shape[1], -1)
    w = want.astype(np.float64).reshape(g.shape)
    if any(k in ("max", "-max") for n, k, _ in c["specials"] if _touches_v(c, n)):
        factor *= 1e36  # V terms of 1e36 cancel: only the non-finite positions are comparable
    if cfg.dtype == "float32":
        # ORT's MLAS float softmax drops a NaN score at some positions of a row
        # (see test_gqa_nonfinite.check_vs_cpu_ep): every CPU EP NaN must be a
        # HinaMoE NaN; the rest matches, and the float64 reference decides the NaNs.
        # A row whose keys are all masked is 0 in ORT's float kernel, except
        # on some paths (seen with a local window of 1) where it is NaN:
        # HinaMoE gives 0 (the float64 reference's weight-0 row).
        masked_row = np.isnan(w) & (g == 0) & (ref == 0)
        w = np.where(masked_row, 0.0, w)
        assert not (np.isnan(w) & ~np.isnan(g))[valid].any(), f"{what}: a CPU EP NaN is not NaN on HinaMoE"
        keep = valid[..., None] & ~np.isnan(g)
        check_same_nonfinite(g[keep], w[keep], what + " vs CPU EP", dtype=cfg.dtype, factor=factor)
    else:
        check_same_nonfinite(g, w, what + (" vs CPU EP" if cpu_runs else " vs ref"), valid, dtype=cfg.dtype,
                             factor=factor)
    tame = not c["specials"] and c["magnitude"] <= 1.0
    if tame:
        gqa_check_close(g, ref, what + " vs float64 reference", valid, cfg.dtype, factor=factor)
    elif cfg.dtype != "float16" and not any(k in ("max", "-max") or (_touches_v(c, n) and "inf" in k)
                                            for n, k, _ in c["specials"]):
        # (not with Inf in V: a weight that underflows to 0 in float32 but not
        # in float64 turns Inf into NaN in one and not the other)
        # the NaN/Inf positions as the float64 reference defines them (f16
        # rounds rotated Q/K and overflows where float64 does not)
        check_same_nonfinite(np.where(np.isfinite(g), 0, g)[valid], np.where(np.isfinite(ref), 0, ref)[valid],
                             what + " non-finite positions vs float64 reference", dtype=cfg.dtype)
    return "ok"


# ------------------------------------------------------------------ MoE

MOE_VALUES = ("normal", "normal", "tied_logits", "nan_logits", "inf_logits", "denormal_x", "large_x",
              "zero_x", "huge_logits")


def gen_moe(rng) -> dict:
    c = _common(rng)
    act, fusion = _pick(rng, ACT_FUSIONS)
    c.update(act=act, fusion=int(fusion), tokens=int(_pick(rng, (0, 1, 2, 5, 16, 33))),
             values=_pick(rng, MOE_VALUES))
    return c


def _cpu_ep_runs_moe(cfg) -> bool:
    if cfg.dtype == "bfloat16" or (cfg.dtype == "float16" and not CPU_EP_F16_MOE_OK):
        return False
    if cfg.activation not in ("relu", "gelu", "silu", "identity", "swiglu"):
        return False
    if cfg.swiglu_limit_after_activation:  # the CPU EP: "requires CUDA"
        return False
    return not cfg.gated or cfg.swiglu_fusion == 1


def run_moe_case(c) -> str:
    rng = np.random.default_rng(c["seed"])
    cfg = random_config(rng, c["act"], c["fusion"], c["dtype"])
    model, w = build_moe_model(cfg, rng=rng)
    feeds = weight_feeds(cfg, w) if cfg.weights_as_inputs else None
    t = c["tokens"]
    batch = 2 if (cfg.input_rank == 3 and t % 2 == 0 and t > 0) else 1
    x = random_input(cfg, t, rng, batch=batch)
    lg = random_logits(cfg, t, rng)
    kind = c["values"]
    what = f"moe case {c} [{cfg.describe()}]"
    bad_token = None
    if t > 0:
        if kind == "tied_logits":
            lg[:, :] = np.round(lg[:, :] * 2) / 2  # many exact ties
            lg[0, :] = lg[0, 0]
        elif kind in ("nan_logits", "inf_logits"):
            bad_token = int(rng.integers(t))
            lg[bad_token, int(rng.integers(cfg.experts))] = np.nan if kind == "nan_logits" else np.inf
        elif kind == "huge_logits":
            lg[...] = (lg.astype(np.float64) * (1e3 if cfg.dtype == "float16" else 1e30)).astype(lg.dtype)
        elif kind == "denormal_x":
            x[...] = (x.astype(np.float64) * _special("denormal", cfg.dtype)).astype(x.dtype)
        elif kind == "large_x":
            x[...] = (x.astype(np.float64) * (8.0 if cfg.dtype == "float16" else 1e3)).astype(x.dtype)
        elif kind == "zero_x":
            x[...] = 0
    sess = hina_session(model, isa=c["isa"], threads=c["threads"], extra_options=_session_options(c))
    got, err = _run(lambda: run_moe(sess, x, lg, feeds))
    if bad_token is not None:
        assert err is not None, f"{what}: non-finite router logits accepted"
        assert "MoE" in err and str(bad_token) in err, f"{what}: the error does not name token {bad_token}: {err}"
        return "refused: " + err[-120:]
    assert err is None, f"{what}: HinaMoE refused: {err}"
    ref = reference_for(cfg, x, lg, w)
    # large inputs: intermediates of ~1e3 (clamped by swiglu_limit) carry
    # their rounding into small outputs
    factor = 8.0 if kind == "large_x" else 1.0
    moe_check_close(got, ref, cfg.dtype, what + " vs float64 reference", factor)
    if _cpu_ep_runs_moe(cfg) and kind != "huge_logits":
        oc = run_moe(cpu_session(model, threads=c["threads"]), x, lg, feeds)
        moe_check_close(got, oc.astype(np.float64), cfg.dtype, what + " vs CPU EP", factor=2.0 * factor)
    return "ok"



# ------------------------------------------------------------------ QMoE

QMOE_ACTS = (("swiglu", 1), ("swiglu", 1), ("swiglu", 0), ("swiglu", 2), ("silu", 0), ("relu", 0),
             ("gelu", 0), ("identity", 0), ("geglu", 1))
QMOE_VALUES = ("normal", "normal", "normal", "tied_logits", "huge_logits", "nan_logits", "nan_x", "inf_x",
               "nan_scale")
QMOE_MALFORMED = ("scales_shape", "zp_shape", "block_not_pow2", "bits_2", "bits_3")


def gen_qmoe(rng) -> dict:
    c = _common(rng)
    act, fusion = _pick(rng, QMOE_ACTS)
    block = int(_pick(rng, (0, 0, 16, 32, 64, 128)))
    # K (hidden for fc1/fc3, inter for fc2): whole blocks, even; block-wise
    # with at least 2 blocks (with one, the builder packs the zero points
    # row-wise, which the CPU EP refuses for a block-wise node)
    unit, low = (block, 2) if block else (16, 1)
    c.update(act=act, fusion=int(fusion), bits=int(_pick(rng, (4, 8))), block=block,
             hidden=unit * int(rng.integers(low, low + 2)), inter=unit * int(rng.integers(low, low + 2)),
             experts=int(rng.integers(2, 7)), zero_points=bool(rng.random() < 0.3),
             fc1_bias=bool(rng.random() < 0.4), fc2_bias=bool(rng.random() < 0.4),
             router_weights=bool(rng.random() < 0.2), normalize=int(rng.random() < 0.3),
             accuracy_level=_pick(rng, (None, None, 0, 4)), rank3=bool(rng.random() < 0.2),
             tokens=int(_pick(rng, (0, 1, 2, 5, 16, 33))), values=_pick(rng, QMOE_VALUES))
    c["k"] = int(rng.integers(1, min(c["experts"], 3) + 1))
    c["malformed"] = _pick(rng, QMOE_MALFORMED) if rng.random() < 0.12 else None
    return c


def _qmoe_config(c):
    from hinamoe.models import QMoEConfig

    swiglu = c["act"] == "swiglu"
    return QMoEConfig(hidden=c["hidden"], inter=c["inter"], experts=c["experts"], k=c["k"], bits=c["bits"],
                      block_size=c["block"], activation=c["act"], swiglu_fusion=c["fusion"], dtype=c["dtype"],
                      fc1_bias=c["fc1_bias"], fc2_bias=c["fc2_bias"], fc3_bias=c["fc1_bias"],
                      zero_points=c["zero_points"], router_weights=c["router_weights"],
                      accuracy_level=c["accuracy_level"], normalize_routing_weights=c["normalize"],
                      activation_alpha=1.702 if swiglu else None, activation_beta=1.0 if swiglu else None,
                      swiglu_limit=7.0 if swiglu else None, input_rank=3 if c["rank3"] else 2)


def _cpu_ep_runs_qmoe(cfg) -> bool:
    if cfg.dtype == "bfloat16" or (cfg.dtype == "float16" and not CPU_EP_F16_MOE_OK):
        return False
    return cfg.activation == "silu" or (cfg.activation == "swiglu" and cfg.swiglu_fusion == 1)


def _replace_initializer(model, name, arr):
    from onnx import helper

    for init in model.graph.initializer:
        if init.name == name:
            init.CopyFrom(helper.make_tensor(name, init.data_type, list(arr.shape), arr.tobytes(), raw=True))
            return
    raise KeyError(name)


def _qmoe_malform(c, model, w) -> tuple[str, tuple] | None:
    """Break the model as ``c["malformed"]`` says; return (what, accepted
    error needles) or None when this case has nothing to break."""
    m = c["malformed"]
    attrs = {a.name: a for a in model.graph.node[0].attribute}
    if m == "scales_shape":
        key = "fc1_scales" if c["seed"] % 2 else "fc2_scales"
        s = w[key]
        bad = s[..., :-1] if s.ndim == 3 and s.shape[-1] > 1 else s[:, :-1]
        _replace_initializer(model, key, np.ascontiguousarray(bad))
        return m, (key,)
    if m == "zp_shape" and "fc2_zp" in w:
        _replace_initializer(model, "fc2_zero_points", np.ascontiguousarray(w["fc2_zp"][:, :-1]))
        return m, ("fc2_zero_points",)
    if m == "block_not_pow2" and c["block"]:
        attrs["block_size"].i = c["block"] + c["block"] // 2
        return m, ("block_size",)
    if m in ("bits_2", "bits_3"):
        attrs["expert_weight_bits"].i = int(m[-1])
        return m, ("QMoE",)
    return None


def run_qmoe_case(c) -> str:
    import os

    from hinamoe.models import build_qmoe_model

    from support.qmoe_reference import qmoe_reference

    rng = np.random.default_rng(c["seed"])
    cfg = _qmoe_config(c)
    model, w = build_qmoe_model(cfg, rng)
    dt = np_dtype(cfg.dtype)
    t = c["tokens"]
    batch = 2 if (cfg.input_rank == 3 and t % 2 == 0 and t > 0) else 1
    x = rng.standard_normal((t, cfg.hidden)).astype(dt)
    lg = (rng.standard_normal((t, cfg.experts)) * 2).astype(dt)
    rw = rng.uniform(0.01, 1.0, size=(t, cfg.experts)).astype(dt) if cfg.router_weights else None
    kind = c["values"]
    what = f"qmoe case {c}"
    bad_token = None
    if t > 0:
        if kind == "tied_logits":
            lg[...] = np.round(lg * 2) / 2
            lg[0, :] = lg[0, 0]
        elif kind == "huge_logits":
            lg[...] = (lg.astype(np.float64) * (1e3 if cfg.dtype == "float16" else 1e30)).astype(dt)
        elif kind == "nan_logits":
            bad_token = int(rng.integers(t))
            lg[bad_token, int(rng.integers(cfg.experts))] = np.nan
        elif kind in ("nan_x", "inf_x"):
            x[int(rng.integers(t)), int(rng.integers(cfg.hidden))] = np.nan if kind == "nan_x" else np.inf
        elif kind == "nan_scale":  # an fc2 scale: its output row turns NaN wherever the expert is used
            s = w["fc2_scales"]
            at = np.unravel_index(int(rng.integers(s.size)), s.shape)
            s[at] = np.nan
            _replace_initializer(model, "fc2_scales", s)
            deq = w["deq"]["fc2"] = np.array(w["deq"]["fc2"], np.float64)
            cols = slice(at[2] * cfg.block_size, (at[2] + 1) * cfg.block_size) if s.ndim == 3 else slice(None)
            deq[at[0], at[1], cols] = np.nan
    if cfg.input_rank == 3:
        x = x.reshape(batch, t // batch, cfg.hidden)
    extra = {"router_weights": rw} if cfg.router_weights else None  # run_moe feeds bfloat16 too
    broken = _qmoe_malform(c, model, w) if c.get("malformed") else None

    def hina():
        sess = hina_session(model, isa=c["isa"], threads=c["threads"], extra_options=_session_options(c))
        return run_moe(sess, x, lg, extra)

    got, err = _run(hina)
    if broken is not None:
        m, needles = broken
        if m.startswith("bits_") and err is not None and "leaves node" not in err:
            # 2-bit: HinaMoE leaves it to the CPU EP (no_fallback then fails session creation)
            assert "QMoE" in err or "qmoe" in err or "node" in err, f"{what}: unclear error: {err}"
            return "refused: " + err[-120:]
        assert err is not None, f"{what}: malformed ({m}) accepted"
        assert any(n in err for n in needles) or "node" in err, f"{what}: the error does not say why: {err}"
        return "refused: " + err[-120:]
    if bad_token is not None:
        assert err is not None, f"{what}: NaN router logits accepted"
        assert "NaN" in err and f"token {bad_token}" in err, f"{what}: the error does not name token {bad_token}: {err}"
        return "refused: " + err[-120:]
    assert err is None, f"{what}: HinaMoE refused: {err}"
    assert got.shape == x.shape, f"{what}: output shape {got.shape}"
    if t == 0:
        return "ok (empty)"
    ref = qmoe_reference(cfg, x, lg, w, rw).reshape(t, -1)
    g = got.astype(np.float64).reshape(t, -1)
    # int8 tokens (block-wise at accuracy_level 4): each product errs by up
    # to 1/254 of a token's largest element; at these small sizes (few
    # routes, cancelling sums) that reached ~6% of the output's RMS in an
    # 8-minute fuzz run (3x test_qmoe_ep's 2%)
    factor = 4000.0 if (cfg.block_size and cfg.accuracy_level == 4) else 1.0
    if kind in ("nan_x", "inf_x", "nan_scale"):
        rows = ~np.isfinite(ref).all(1)
        # (relu maps a NaN to 0 on HinaMoE, max(0, x) ordered that way: the row may end
        # finite; int8 tokens turn an Inf block into NaN, so Inf there too)
        if not (cfg.activation == "relu" and (kind == "nan_x" or cfg.accuracy_level == 4)):
            assert (~np.isfinite(g[rows])).any(1).all(), f"{what}: a non-finite input gave a finite row"
        if kind == "nan_scale":
            check_same_nonfinite(np.where(np.isfinite(g), 0, g), np.where(np.isfinite(ref), 0, ref),
                                 what + " NaN positions vs float64 reference")
        keep = ~rows
        moe_check_close(g[keep], ref[keep], cfg.dtype, what + " finite rows vs float64 reference", factor)
        return "ok"
    moe_check_close(g, ref, cfg.dtype, what + " vs float64 reference", factor)
    if _cpu_ep_runs_qmoe(cfg) and kind != "huge_logits":
        # float experts on the CPU EP (its default runs block-wise 8-bit with int8 tokens)
        old = os.environ.get("ORT_QMOE_CPU_QNBIT_GEMM")
        os.environ["ORT_QMOE_CPU_QNBIT_GEMM"] = "fp32"
        try:
            cpu = cpu_session(model, threads=c["threads"])
        finally:
            if old is None:
                del os.environ["ORT_QMOE_CPU_QNBIT_GEMM"]
            else:
                os.environ["ORT_QMOE_CPU_QNBIT_GEMM"] = old
        cpu_int8 = cfg.block_size and cfg.accuracy_level == 4  # MLAS QNBit int8 tokens regardless
        oc = run_moe(cpu, x, lg, extra).astype(np.float64).reshape(t, -1)
        moe_check_close(g, oc, cfg.dtype, what + " vs CPU EP", 2.0 * max(factor, 4000.0 if cpu_int8 else 1.0))
    return "ok"


# ------------------------------------------------------------------ MatMulNBits

MMNB_VALUES = ("normal", "normal", "normal", "nan_a", "inf_a", "max_a", "nan_scale")
MMNB_MALFORMED = ("scales_size", "zp_size", "bits_2", "block_not_pow2")


def gen_mmnb(rng) -> dict:
    c = _common(rng)
    block = int(_pick(rng, (16, 32, 32, 64, 128)))
    c.update(bits=int(_pick(rng, (4, 8))), block=block, n=int(rng.integers(1, 80)),
             k=max(2, 2 * int(rng.integers(1, 3 * block // 2 + 1))), zero_points=bool(rng.random() < 0.3),
             bias=bool(rng.random() < 0.4), accuracy_level=_pick(rng, (None, None, 0, 1, 4)),
             rank3=bool(rng.random() < 0.5), tokens=int(_pick(rng, (0, 1, 2, 5, 16, 33, 70))),
             values=_pick(rng, MMNB_VALUES), tiles=bool(rng.random() < 0.5))
    c["malformed"] = _pick(rng, MMNB_MALFORMED) if rng.random() < 0.12 else None
    return c


def run_mmnb_case(c) -> str:
    from hinamoe.models import MatMulNBitsConfig, build_matmul_nbits_model
    from hinamoe.models.moe_layer import _ortvalue

    from support.quant_reference import matmul_nbits_reference
    from support.runtime import tiles_in_effect

    rng = np.random.default_rng(c["seed"])
    cfg = MatMulNBitsConfig(K=c["k"], N=c["n"], bits=c["bits"], block_size=c["block"], dtype=c["dtype"],
                            zero_points=c["zero_points"], bias=c["bias"], accuracy_level=c["accuracy_level"],
                            input_rank=3 if c["rank3"] else 2)
    model, parts = build_matmul_nbits_model(cfg, rng)
    dt = np_dtype(cfg.dtype)
    t = c["tokens"]
    a = rng.standard_normal((1, t, cfg.K) if c["rank3"] else (t, cfg.K)).astype(dt)
    flat = a.reshape(-1, cfg.K)
    kind, what = c["values"], f"mmnb case {c}"
    if t > 0 and kind in ("nan_a", "inf_a", "max_a"):
        flat[int(rng.integers(t)), int(rng.integers(cfg.K))] = _special(kind[:-2] if kind != "max_a" else "max", cfg.dtype)
    inits = {i.name: i for i in model.graph.initializer}
    if t > 0 and kind == "nan_scale":
        parts["scales"][int(rng.integers(cfg.N)), int(rng.integers(cfg.blocks))] = np.nan
        _replace_initializer(model, "mmnb.scales", parts["scales"].reshape(-1))
    broken = None
    m = c.get("malformed")
    if m == "scales_size":
        _replace_initializer(model, "mmnb.scales", parts["scales"].reshape(-1)[:-1].copy())
        broken = ("scales",)
    elif m == "zp_size" and "mmnb.zero_points" in inits:
        _replace_initializer(model, "mmnb.zero_points", np.zeros(1, np.uint8))
        broken = ("zero_points",)
    elif m in ("bits_2", "block_not_pow2"):
        for attr in model.graph.node[0].attribute:
            if m == "bits_2" and attr.name == "bits":
                attr.i = 2
            if m == "block_not_pow2" and attr.name == "block_size":
                attr.i = c["block"] + c["block"] // 2
        broken = ("bits", "block_size", "MatMulNBits")
    options = {**_session_options(c), "bf16_tiles": "auto" if c["tiles"] else "off"}

    def hina():
        sess = hina_session(model, isa=c["isa"], threads=c["threads"], extra_options=options)
        binding = sess.io_binding()
        ov_a = _ortvalue(a)
        binding.bind_ortvalue_input("A", ov_a)
        y = np.full(a.shape[:-1] + (cfg.N,), np.nan, dtype=dt)  # poisoned
        ov_y = _ortvalue(y)
        binding.bind_ortvalue_output("Y", ov_y)
        sess.run_with_iobinding(binding)
        return y

    got, err = _run(hina)
    if broken is not None:
        assert err is not None, f"{what}: malformed ({m}) accepted"
        assert any(n in err for n in broken) or "node" in err, f"{what}: the error does not say why: {err}"
        return "refused: " + err[-120:]
    assert err is None, f"{what}: HinaMoE refused: {err}"
    if t == 0:
        assert got.shape == a.shape[:-1] + (cfg.N,)
        return "ok (empty)"
    tiles = c["tiles"] and tiles_in_effect(c["isa"], t, c["accuracy_level"], c["bits"])
    i8 = c["accuracy_level"] == 4 and cfg.blocks > 1 and not tiles
    ref = matmul_nbits_reference(a, parts, int8_tokens=i8, bf16=tiles).reshape(t, -1)
    g = got.astype(np.float64).reshape(t, -1)
    if kind in ("nan_a", "inf_a", "nan_scale"):
        bad = ~np.isfinite(ref)
        assert (~np.isfinite(g[bad])).all(), f"{what}: a non-finite input gave a finite output"
        keep = ~bad.any(1) if kind != "nan_scale" else ~bad.any(0)
        ref, g = (ref[keep], g[keep]) if kind != "nan_scale" else (ref[:, keep], g[:, keep])
    elif kind == "max_a":  # float32: the same overflow as float64's float32 rounding (bf16 tiles round it to Inf)
        if cfg.dtype == "float32" and not tiles:
            assert (np.isfinite(g) == np.isfinite(ref.astype(np.float32))).all(), f"{what}: overflow differs"
        return "ok (max)"
    # int8 tokens: a code step of the largest |A| per block (cf. test_matmul_nbits)
    moe_check_close(g, ref, cfg.dtype, what + " vs float64 reference", 2000.0 if i8 else 1.0)
    return "ok"


# ------------------------------------------------------------------ MatMul (float16, bfloat16)

MATMUL_VALUES = ("normal", "normal", "normal", "nan_a", "inf_a", "denormal_a")
# Half an ulp of T: the one rounding of the float32 sum.
MATMUL_HALF_ULP = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
# ... and half the spacing of T's subnormals, where Y rounds to one.
MATMUL_TINY = {"float16": 2.0 ** -25, "bfloat16": 2.0 ** -134}


def gen_matmul(rng) -> dict:
    c = _common(rng)
    c.update(dtype=_pick(rng, ("float16", "bfloat16")), k=int(rng.integers(1, 300)), n=int(rng.integers(1, 300)),
             tokens=int(_pick(rng, (0, 1, 2, 5, 8, 9, 33, 70))), a_rank=int(_pick(rng, (1, 2, 3, 3))),
             values=_pick(rng, MATMUL_VALUES), weight_input=bool(rng.random() < 0.2))
    if c["a_rank"] == 1:
        c["tokens"] = 1
    c["malformed"] = "k_mismatch" if rng.random() < 0.1 else None
    return c


def run_matmul_case(c) -> str:
    from hinamoe.models import build_matmul_model
    from hinamoe.models.moe_layer import _ortvalue

    rng = np.random.default_rng(c["seed"])
    K, N, t = c["k"], c["n"], c["tokens"]
    model, w = build_matmul_model(K, N, c["dtype"], rng, a_rank=c["a_rank"], weight_input=c["weight_input"])
    dt = np_dtype(c["dtype"])
    shape = {1: (K,), 2: (t, K), 3: (1, t, K)}[c["a_rank"]]
    what = f"matmul case {c}"
    if c["malformed"] == "k_mismatch":
        model.graph.input[0].type.tensor_type.shape.dim[-1].dim_param = "k"
        shape = shape[:-1] + (K + 1,)
    a = rng.standard_normal(shape).astype(dt)
    flat = a.reshape(-1, shape[-1])
    kind = c["values"]
    if t > 0 and kind != "normal":
        flat[int(rng.integers(flat.shape[0])), int(rng.integers(K))] = _special(kind[:-2], c["dtype"])

    def hina():
        sess = hina_session(model, isa=c["isa"], threads=c["threads"], extra_options=_session_options(c))
        binding = sess.io_binding()
        keep = [_ortvalue(a)]
        binding.bind_ortvalue_input("A", keep[0])
        if c["weight_input"]:
            keep.append(_ortvalue(w))
            binding.bind_ortvalue_input("W", keep[1])
        y = np.full(shape[:-1] + (N,), np.nan, dtype=dt)  # poisoned
        keep.append(_ortvalue(y))
        binding.bind_ortvalue_output("Y", keep[-1])
        sess.run_with_iobinding(binding)
        return y

    got, err = _run(hina)
    if c["malformed"]:
        assert err is not None, f"{what}: A of the wrong width accepted"
        assert "MatMul" in err and "'A'" in err, f"{what}: the error does not say why: {err}"
        return "refused: " + err[-120:]
    assert err is None, f"{what}: HinaMoE refused: {err}"
    if t == 0:
        assert got.shape == shape[:-1] + (N,)
        return "ok (empty)"
    a64, w64 = flat.astype(np.float64), w.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        want = a64 @ w64
    g = got.astype(np.float64).reshape(-1, N)
    if kind in ("nan_a", "inf_a"):
        finite = np.isfinite(a64).all(1)
        assert (~np.isfinite(g[~finite])).all(), f"{what}: a non-finite input gave a finite output"
        g, want, a64 = g[finite], want[finite], a64[finite]
        if not len(g):
            return "ok (non-finite)"
    mag = np.abs(a64) @ np.abs(w64)
    allowed = MATMUL_HALF_ULP[c["dtype"]] * np.abs(want) + (K + 2) * 1.2e-7 * mag + MATMUL_TINY[c["dtype"]]
    err_ = np.abs(g - want)
    assert np.isfinite(g).all() and (err_ <= allowed).all(), f"{what}: max error {err_.max():.3g}"
    return "ok"


# ------------------------------------------------------------------ registry

# op -> (generator, runner)
OPS = {"moe": (gen_moe, run_moe_case), "gqa": (gen_gqa, run_gqa_case), "qmoe": (gen_qmoe, run_qmoe_case),
       "mmnb": (gen_mmnb, run_mmnb_case), "matmul": (gen_matmul, run_matmul_case)}


def generate(op: str, rng) -> dict:
    case = OPS[op][0](rng)
    case["op"] = op
    return case


def generate_mix(rng, n: int, ops=None) -> list[dict]:
    ops = list(ops or OPS)
    return [generate(ops[i % len(ops)], rng) for i in range(n)]


def run_case(case: dict) -> str:
    from support.runtime import available_isas

    if case["isa"] not in available_isas():
        return f"skipped: isa {case['isa']} not available here"
    return OPS[case["op"]][1](case)
