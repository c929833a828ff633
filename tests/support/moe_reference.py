"""Float64 numpy reference of ``com.microsoft::MoE`` (ORT CPU semantics).

Written from the op definition, independent of the C++ kernels:

* per token ``p = softmax(logits over all E)``; the top ``k`` by ``p`` (ties
  toward the HIGHER expert index); routing weight ``p`` or, with
  ``normalize_routing_weights=1``, ``p / sum(top-k p)``; weights ``<= 0`` are
  skipped;
* expert ``e``: ``h = W1[e] @ x + b1[e]`` (``W1 [E, N1, H]``); gated
  activations take gate/up rows per ``swiglu_fusion`` (1 interleaved rows
  2j/2j+1, 2 stacked ``[gate | up]``, 0 gate = fc1 and up = fc3 @ x + b3);
  ``y = W2[e] @ a + b2[e]`` (``W2 [E, H, I]``);
* ``out[t] = sum over routes of weight * y``.

All inputs are converted to float64 first, so low-precision inputs are
taken at the values they hold.
"""

from __future__ import annotations

import numpy as np

GATED = ("swiglu", "geglu")
GELU_C = 0.7978845608028654  # sqrt(2/pi)


def _f64(a):
    return None if a is None else np.asarray(a, dtype=np.float64)  # no copy if f64


def sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * x ** 3)))


def activate(h: np.ndarray, activation: str) -> np.ndarray:
    """Non-gated activations."""
    if activation == "relu":
        return np.maximum(h, 0.0)
    if activation == "gelu":
        return gelu_tanh(h)
    if activation == "silu":
        return h * sigmoid(h)
    if activation == "identity":
        return h
    if activation == "relu2":
        r = np.maximum(h, 0.0)
        return r * r
    raise ValueError(f"unknown activation {activation!r}")


def gated_activate(g: np.ndarray, u: np.ndarray, activation: str, alpha: float, beta: float,
                   limit: float | None, limit_after: int) -> np.ndarray:
    if activation == "geglu":
        return gelu_tanh(g) * u
    if activation != "swiglu":
        raise ValueError(f"not a gated activation: {activation!r}")
    lim = np.inf if limit is None else float(limit)
    up = np.clip(u, -lim, lim) + beta
    if limit_after:
        return np.minimum(g * sigmoid(alpha * g), lim) * up
    gc = np.minimum(g, lim)
    return gc * sigmoid(alpha * gc) * up


def route(logits: np.ndarray, k: int, normalize: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k experts and routing weights per token: ``([T, k] ids, [T, k] w)``."""
    lg = _f64(logits)
    t, e = lg.shape
    if not 1 <= k <= e:
        raise ValueError(f"k={k} must be in [1, E={e}]")
    bad = np.argwhere(~np.isfinite(lg).all(axis=1)).reshape(-1)
    if bad.size:
        raise ValueError(f"non-finite router logits at token {int(bad[0])}")
    if t == 0:
        return np.zeros((0, k), np.int64), np.zeros((0, k))
    m = lg.max(axis=1, keepdims=True)
    ex = np.exp(lg - m)
    p = ex / ex.sum(axis=1, keepdims=True)
    idx = np.broadcast_to(np.arange(e), lg.shape)
    # sort by logit descending (same order as p), ties -> higher index first
    order = np.lexsort((-idx, -lg), axis=1)
    top = order[:, :k]
    w = np.take_along_axis(p, top, axis=1)
    if normalize:
        w = w / w.sum(axis=1, keepdims=True)
    return top, w


def moe_reference(
    x, router_logits, fc1, fc2, fc1_bias=None, fc2_bias=None, fc3=None, fc3_bias=None, *,
    k: int, activation_type: str = "relu", normalize_routing_weights: int = 0,
    swiglu_fusion: int = 0, activation_alpha: float | None = None,
    activation_beta: float | None = None, swiglu_limit: float | None = None,
    swiglu_limit_after_activation: int = 0,
) -> np.ndarray:
    """Reference output in float64, shaped like ``x`` (``[T, H]`` or ``[B, S, H]``)."""
    xs = np.shape(x)
    xf = _f64(x).reshape(-1, xs[-1])
    w1, w2 = _f64(fc1), _f64(fc2)
    b1, b2, w3, b3 = _f64(fc1_bias), _f64(fc2_bias), _f64(fc3), _f64(fc3_bias)
    lg = _f64(router_logits)
    if lg.ndim != 2 or lg.shape[0] != xf.shape[0]:
        raise ValueError(f"router logits shape {lg.shape} does not match {xf.shape[0]} tokens")
    e, n1, h = w1.shape
    if lg.shape[1] != e or w2.shape[0] != e:
        raise ValueError("mismatched number of experts")
    i = w2.shape[2]
    alpha = 1.0 if activation_alpha is None else float(activation_alpha)
    beta = 0.0 if activation_beta is None else float(activation_beta)
    gated = activation_type in GATED
    if gated:
        fusion = 0 if w3 is not None else int(swiglu_fusion)
        if fusion == 0 and w3 is None:
            raise ValueError("swiglu_fusion=0 needs fc3")
        if fusion in (1, 2) and n1 != 2 * i:
            raise ValueError(f"fused fc1 must have 2*I={2 * i} rows, has {n1}")
    out = np.zeros_like(xf)
    top, wts = route(lg, k, normalize_routing_weights)
    for ex_id in range(e):
        tok, slot = np.nonzero(top == ex_id)
        if tok.size == 0:
            continue
        rw = wts[tok, slot]
        keep = rw > 0
        tok, rw = tok[keep], rw[keep]
        if tok.size == 0:
            continue
        xe = xf[tok]
        hh = xe @ w1[ex_id].T
        if b1 is not None:
            hh = hh + b1[ex_id]
        if gated:
            if fusion == 1:
                g, u = hh[:, 0::2], hh[:, 1::2]
            elif fusion == 2:
                g, u = hh[:, :i], hh[:, i:]
            else:
                g = hh
                u = xe @ w3[ex_id].T
                if b3 is not None:
                    u = u + b3[ex_id]
            a = gated_activate(g, u, activation_type, alpha, beta, swiglu_limit,
                               swiglu_limit_after_activation)
        else:
            a = activate(hh, activation_type)
        y = a @ w2[ex_id].T
        if b2 is not None:
            y = y + b2[ex_id]
        np.add.at(out, tok, rw[:, None] * y)
    return out.reshape(xs)


def weights_f64(weights: dict) -> dict:
    """The weights dict converted once to float64 (speeds up repeated references)."""
    return {key: np.asarray(val, dtype=np.float64) for key, val in weights.items()}


def reference_for(cfg, x, logits, weights) -> np.ndarray:
    """Reference for a ``hinamoe.models.MoEConfig`` and the weights dict that
    ``build_moe_model`` returned (or its ``weights_f64``)."""
    return moe_reference(
        x, logits, weights["fc1"], weights["fc2"], weights.get("fc1_bias"),
        weights.get("fc2_bias"), weights.get("fc3"), weights.get("fc3_bias"),
        k=cfg.k, activation_type=cfg.activation,
        normalize_routing_weights=cfg.normalize_routing_weights,
        swiglu_fusion=cfg.swiglu_fusion, activation_alpha=cfg.activation_alpha,
        activation_beta=cfg.activation_beta, swiglu_limit=cfg.swiglu_limit,
        swiglu_limit_after_activation=cfg.swiglu_limit_after_activation or 0,
    )


# Tolerances: |out - ref| <= atol * scale + rtol * |ref|, scale = max(1, rms(ref)).
TOLERANCES = {
    "float32": (2e-5, 2e-5),
    "float16": (2e-3, 2e-3),
    # room for kernels that round the activation to bf16 before the down
    # projection (the AMX design) on top of the bf16 output rounding
    "bfloat16": (1.5e-2, 1e-2),
}


def check_close(out, ref, dtype: str, what: str = "", factor: float = 1.0) -> float:
    """Assert ``out`` matches ``ref`` within the dtype's tolerance; return the
    worst ratio error/allowed (<= 1 passes)."""
    o = np.asarray(out).astype(np.float64)
    r = np.asarray(ref, dtype=np.float64)
    assert o.shape == r.shape, f"{what}: shape {o.shape} != reference {r.shape}"
    if r.size == 0:
        return 0.0
    assert np.isfinite(o).all(), f"{what}: non-finite output"
    atol, rtol = TOLERANCES[dtype]
    scale = max(1.0, float(np.sqrt(np.mean(r * r))))
    allowed = factor * (atol * scale + rtol * np.abs(r))
    err = np.abs(o - r)
    ratio = float((err / allowed).max())
    if ratio > 1.0:
        pos = np.unravel_index(int(np.argmax(err / allowed)), err.shape)
        raise AssertionError(
            f"{what}: max err {err.max():.3g} (worst at {pos}: got {o[pos]:.6g}, "
            f"ref {r[pos]:.6g}, allowed {allowed[pos]:.3g}); ratio {ratio:.2f}, dtype {dtype}")
    return ratio
