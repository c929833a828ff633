"""The float64 reference (moe_reference.py) against ORT's own CPU EP, on the
configurations the CPU EP supports (f32/f16, swiglu_fusion=1 or non-gated,
no fc3, no relu2/geglu, no post-activation clamp). No HinaMoE needed."""

from __future__ import annotations

import numpy as np
import pytest

from hinamoe.models import MoEConfig, build_moe_model, random_input, random_logits, run_moe, weight_feeds

from support.moe_reference import check_close, gelu_tanh, moe_reference, reference_for, route, sigmoid
from support.sessions import cpu_session

CPU_ACTS = ["relu", "gelu", "silu", "identity", "swiglu"]


def random_cpu_config(rng: np.random.Generator, activation: str, dtype: str) -> MoEConfig:
    e = int(rng.integers(1, 33))
    cfg = MoEConfig(
        hidden=int(rng.choice([8, 36, 64, 100, 130])),
        inter=int(rng.choice([8, 24, 72, 96])),
        experts=e,
        k=int(rng.integers(1, min(8, e) + 1)),
        activation=activation,
        swiglu_fusion=1,
        dtype=dtype,
        fc1_bias=bool(rng.integers(2)),
        fc2_bias=bool(rng.integers(2)),
        normalize_routing_weights=int(rng.integers(2)),
        input_rank=int(rng.choice([2, 3])),
        weights_as_inputs=bool(rng.integers(2)),
    )
    if activation == "swiglu" and rng.integers(2):
        cfg.activation_alpha = float(rng.choice([1.0, 1.702]))
        cfg.activation_beta = float(rng.choice([0.0, 1.0]))
        cfg.swiglu_limit = float(rng.choice([0.5, 7.0]))
    return cfg


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("activation", CPU_ACTS)
def test_reference_matches_cpu_ep(activation, dtype, rng, seed):
    for trial in range(3):
        cfg = random_cpu_config(rng, activation, dtype)
        model, w = build_moe_model(cfg, rng=rng)
        sess = cpu_session(model)
        feeds = weight_feeds(cfg, w) if cfg.weights_as_inputs else None
        for t in (1, int(rng.integers(2, 71))):
            batch = 1 if cfg.input_rank == 2 or t % 2 else 2
            x = random_input(cfg, t, rng, batch=batch)
            lg = random_logits(cfg, t, rng)
            out = run_moe(sess, x, lg, feeds)
            ref = reference_for(cfg, x, lg, w)
            check_close(out, ref, dtype, f"seed {seed} trial {trial} T={t} {cfg.describe()}")


def test_reference_ties_break_to_higher_index(rng):
    """Equal logits: the CPU EP picks the higher expert index; so must we."""
    cfg = MoEConfig(hidden=24, inter=16, experts=6, k=2, activation="relu",
                    normalize_routing_weights=1)
    model, w = build_moe_model(cfg, rng=rng)
    lg = np.array([[1, 1, 1, 1, 1, 1], [0, 2, 2, 0, 2, 0], [3, 0, 0, 3, 0, 1],
                   [0, 0, 0, 0, 0, 0], [5, 4, 4, 1, 1, 1]], np.float32)
    top, _ = route(lg, 2, 1)
    assert top.tolist() == [[5, 4], [4, 2], [3, 0], [5, 4], [0, 2]]
    x = random_input(cfg, 5, rng)
    out = run_moe(cpu_session(model), x, lg)
    check_close(out, reference_for(cfg, x, lg, w), "float32", "ties")


def test_reference_hand_computed():
    """One token, two experts, identity activation: checkable by hand."""
    x = np.array([[1.0, 2.0]])
    lg = np.array([[0.0, np.log(3.0)]])  # p = [0.25, 0.75]
    fc1 = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])  # [E=2, I=1, H=2]
    fc2 = np.array([[[2.0], [3.0]], [[1.0], [-1.0]]])  # [E=2, H=2, I=1]
    out = moe_reference(x, lg, fc1, fc2, k=2, activation_type="identity")
    # expert0: h=1 -> y=[2,3]; expert1: h=2 -> y=[2,-2]
    np.testing.assert_allclose(out, 0.25 * np.array([[2, 3]]) + 0.75 * np.array([[2, -2]]))
    out1 = moe_reference(x, lg, fc1, fc2, k=1, activation_type="identity",
                         normalize_routing_weights=1)
    np.testing.assert_allclose(out1, [[2.0, -2.0]])


def test_reference_gated_layouts_agree(rng):
    """fusion 1 (interleaved), 2 (stacked) and 0 (fc3) are the same function
    of the same gate/up matrices."""
    e, h, i, t = 3, 10, 6, 7
    gate = rng.standard_normal((e, i, h))
    up = rng.standard_normal((e, i, h))
    fc2 = rng.standard_normal((e, h, i))
    b_g, b_u = rng.standard_normal((e, i)), rng.standard_normal((e, i))
    x, lg = rng.standard_normal((t, h)), rng.standard_normal((t, e))
    inter = np.empty((e, 2 * i, h))
    inter[:, 0::2], inter[:, 1::2] = gate, up
    inter_b = np.empty((e, 2 * i))
    inter_b[:, 0::2], inter_b[:, 1::2] = b_g, b_u
    stacked = np.concatenate([gate, up], axis=1)
    stacked_b = np.concatenate([b_g, b_u], axis=1)
    for act in ("swiglu", "geglu"):
        kw = dict(k=2, activation_type=act, activation_alpha=1.702, activation_beta=1.0,
                  swiglu_limit=1.5)
        r1 = moe_reference(x, lg, inter, fc2, inter_b, swiglu_fusion=1, **kw)
        r2 = moe_reference(x, lg, stacked, fc2, stacked_b, swiglu_fusion=2, **kw)
        r0 = moe_reference(x, lg, gate, fc2, b_g, None, up, b_u, swiglu_fusion=0, **kw)
        np.testing.assert_allclose(r1, r2, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(r1, r0, rtol=1e-12, atol=1e-12)


def test_reference_activation_formulas():
    v = np.linspace(-6, 6, 49)
    np.testing.assert_allclose(sigmoid(v), 1 / (1 + np.exp(-v)))
    np.testing.assert_allclose(
        gelu_tanh(v), 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3))))
    from support.moe_reference import gated_activate

    g, u = v, v[::-1].copy()
    lim = 2.0
    a = gated_activate(g, u, "swiglu", 1.702, 1.0, lim, 0)
    gc = np.minimum(g, lim)
    np.testing.assert_allclose(a, gc * sigmoid(1.702 * gc) * (np.clip(u, -lim, lim) + 1.0))
    a2 = gated_activate(g, u, "swiglu", 1.702, 1.0, lim, 1)
    np.testing.assert_allclose(a2, np.minimum(g * sigmoid(1.702 * g), lim) * (np.clip(u, -lim, lim) + 1))
    assert np.all(gated_activate(g, u, "swiglu", 1.0, 0.0, None, 0) == g * sigmoid(g) * u)


def test_reference_rejects_nan_and_bad_k():
    lg = np.zeros((4, 3))
    lg[2, 1] = np.nan
    with pytest.raises(ValueError, match="token 2"):
        route(lg, 1, 0)
    with pytest.raises(ValueError):
        route(np.zeros((1, 3)), 4, 0)
    with pytest.raises(ValueError):
        route(np.zeros((1, 3)), 0, 0)


def test_reference_skips_zero_weight_routes():
    """A route whose softmax weight underflows to 0 contributes nothing."""
    x = np.ones((1, 2))
    lg = np.array([[0.0, -1e6]])
    fc1 = np.ones((2, 1, 2))
    fc2 = np.stack([np.ones((2, 1)), np.full((2, 1), np.inf)])  # expert 1 would poison
    out = moe_reference(x, lg, fc1, fc2, k=2, activation_type="identity")
    np.testing.assert_allclose(out, [[2.0, 2.0]])
