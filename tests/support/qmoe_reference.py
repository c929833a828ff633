"""Float64 numpy reference of ``com.microsoft::QMoE`` (ORT CPU semantics),
written from the op's definition, independent of the C++ kernels:

* weights dequantised in float64: ``(q - zp) * scale`` (``qmoe_quant``);
* routing: the top ``k`` raw logits (ties toward the higher expert index),
  weights = softmax over those ``k`` (``normalize_routing_weights`` has no
  effect), or with ``router_weights`` the weights at the chosen experts,
  divided by their sum when normalising; routes with weight <= 1e-8 dropped;
* experts and activations as MoE (``moe_reference.activate`` /
  ``gated_activate``), the weighted sum over routes.
"""

from __future__ import annotations

import numpy as np

from support.moe_reference import activate, gated_activate


def qmoe_route(logits, k: int, normalize: int, router_weights=None):
    lg = np.asarray(logits, np.float64)
    t, e = lg.shape
    if np.isnan(lg).any():
        raise ValueError("NaN router logits")
    # stable sort on (-logit, -index): ties go to the higher index
    order = np.lexsort((-np.arange(e)[None, :].repeat(t, 0), -lg), axis=1)[:, :k]
    top = np.take_along_axis(lg, order, 1)
    if router_weights is None:
        ex = np.exp(top - top[:, :1])
        w = ex / ex.sum(1, keepdims=True)
    else:
        w = np.take_along_axis(np.asarray(router_weights, np.float64), order, 1)
        if normalize:
            s = w.sum(1, keepdims=True)
            w = np.where(s == 0, 0.0, w / np.where(s == 0, 1.0, s))
    return order, w


def qmoe_reference(cfg, x, logits, w: dict, router_weights=None) -> np.ndarray:
    xs = np.asarray(x, np.float64)
    shape = xs.shape
    xs = xs.reshape(-1, cfg.hidden)
    ids, wt = qmoe_route(np.asarray(logits).reshape(-1, cfg.experts), cfg.k, cfg.normalize_routing_weights,
                         None if router_weights is None else np.asarray(router_weights).reshape(-1, cfg.experts))
    deq = w["deq"]
    f64 = lambda key: None if key not in w else np.asarray(w[key], np.float64)  # noqa: E731
    b1, b2, b3 = f64("fc1_bias"), f64("fc2_bias"), f64("fc3_bias")
    alpha = 1.0 if cfg.activation_alpha is None else cfg.activation_alpha
    beta = 0.0 if cfg.activation_beta is None else cfg.activation_beta
    out = np.zeros_like(xs)
    inter = cfg.inter
    for t in range(xs.shape[0]):
        for s in range(cfg.k):
            e, rw = int(ids[t, s]), float(wt[t, s])
            if not rw > 1e-8:
                continue
            h = deq["fc1"][e] @ xs[t] + (0 if b1 is None else b1[e])
            if not cfg.gated:
                a = activate(h, cfg.activation)
            else:
                if cfg.has_fc3:
                    g, u = h, deq["fc3"][e] @ xs[t] + (0 if b3 is None else b3[e])
                elif cfg.swiglu_fusion == 1:
                    g, u = h[0::2], h[1::2]
                else:
                    g, u = h[:inter], h[inter:]
                a = gated_activate(g, u, cfg.activation, alpha, beta, cfg.swiglu_limit, 0)
            y = deq["fc2"][e] @ a + (0 if b2 is None else b2[e])
            out[t] += rw * y
    return out.reshape(shape)
