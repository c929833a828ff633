"""Bad input gives an ORT error naming the op, the input and the reason;
zero tokens give an empty output. Sessions disable the CPU EP fallback, so
the error comes from HinaMoE (or from ORT's own graph checks), never from a
silent fallback."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper

from hinamoe.models import MoEConfig, build_moe_model, random_input, random_logits, run_moe, weight_feeds

from support.bad_input import relax_inputs
from support.moe_reference import check_close, reference_for
from support.sessions import error_text, hina_session


def _err_text(excinfo) -> str:
    msg = error_text(excinfo.value)
    print(f"error message: {msg}")  # shown with -s / on failure
    return msg


def _run_expect_error(model, feeds_fn, isa="auto"):
    """Create the session and run; return the error message (either step may raise)."""
    with pytest.raises(Exception) as ei:
        sess = hina_session(model, isa=isa)
        run_moe(sess, *feeds_fn())
    return _err_text(ei)


def _mentions_moe(msg: str) -> bool:
    return "moe" in msg.lower()


BASE = dict(hidden=24, inter=16, experts=4, k=2, activation="swiglu", swiglu_fusion=1)


def test_zero_tokens_2d_and_3d(rng):
    for dtype in ("float32", "float16", "bfloat16"):
        for rank in (2, 3):
            cfg = MoEConfig(**BASE, dtype=dtype, input_rank=rank)
            model, w = build_moe_model(cfg, rng=rng)
            sess = hina_session(model)
            x = random_input(cfg, 0, rng)
            if rank == 3:
                x = x.reshape(2, 0, cfg.hidden)
            lg = random_logits(cfg, 0, rng)
            out = run_moe(sess, x, lg)
            assert out.shape == x.shape and out.dtype == x.dtype
            # and the session still works afterwards
            x1, lg1 = random_input(cfg, 3, rng), random_logits(cfg, 3, rng)
            check_close(run_moe(sess, x1, lg1), reference_for(cfg, x1, lg1, w), dtype,
                        "after empty run")


@pytest.mark.parametrize("k", [0, 5, 9])
def test_bad_k(k, rng):
    """k = 0 and k > E (E = 4): a clear error mentioning k (and E's value for k > E)."""
    cfg = MoEConfig(**{**BASE, "k": k})
    model, _ = build_moe_model(cfg, rng=rng)
    msg = _run_expect_error(model, lambda: (random_input(cfg, 3, rng), random_logits(cfg, 3, rng)))
    assert re.search(r"\bk\b", msg), msg
    assert str(k) in msg, msg
    if k > 4:
        assert "4" in msg, msg


def test_nan_router_logits_names_token(rng):
    cfg = MoEConfig(**BASE)
    model, _ = build_moe_model(cfg, rng=rng)
    sess = hina_session(model)
    x, lg = random_input(cfg, 6, rng), random_logits(cfg, 6, rng)
    lg[4, 1] = np.nan
    with pytest.raises(Exception) as ei:
        run_moe(sess, x, lg)
    msg = _err_text(ei)
    assert "nan" in msg.lower(), msg
    assert re.search(r"token\D{0,4}4\b", msg.lower()), msg
    # the session survives the failed run
    lg[4, 1] = 0.5
    assert np.isfinite(run_moe(sess, x, lg)).all()


def _bad_shape_case(rng, mutate, unknown_rank: bool = False, biases: bool = True):
    """Weights as graph inputs with symbolic dims (or no shapes at all);
    ``mutate(feeds)`` breaks one feed. Returns the error message."""
    cfg = MoEConfig(**BASE, fc1_bias=biases, fc2_bias=biases, weights_as_inputs=True)
    model, w = build_moe_model(cfg, rng=rng)
    model = relax_inputs(model, unknown_rank=unknown_rank)
    feeds = {"input": random_input(cfg, 5, rng), "router_probs": random_logits(cfg, 5, rng),
             **weight_feeds(cfg, w)}
    mutate(feeds, rng)
    with pytest.raises(Exception) as ei:
        sess = hina_session(model)
        x, lg = feeds.pop("input"), feeds.pop("router_probs")
        run_moe(sess, x, lg, feeds)
    return _err_text(ei)


def _resize(name, axis, delta):
    def f(feeds, rng):
        a = feeds[name]
        shape = list(a.shape)
        shape[axis] += delta
        feeds[name] = rng.standard_normal(shape).astype(a.dtype)
    return f


W1, W2, B1, B2 = ("fc1_experts_weights", "fc2_experts_weights", "fc1_experts_bias",
                  "fc2_experts_bias")


@pytest.mark.parametrize("case,names", [
    (("router_probs", 1, 1), ["router_probs", W1]),     # E: router vs weights
    ((W2, 0, 1), [W2, W1]),                             # E: fc2 vs fc1
    ((W1, 0, -1), [W1, W2, "router_probs"]),            # E: fc1 vs the others
    (("router_probs", 0, 2), ["router_probs", "input"]),  # token counts differ
    (("input", 1, 3), ["input", W1]),                   # hidden size
    ((W1, 1, 2), [W1, W2]),                             # fc1 rows != 2*I
    ((W2, 2, 1), [W2, W1]),                             # I: fc2 vs fc1
    ((B1, 1, 1), [B1]),
    ((B2, 0, 1), [B2]),
], ids=["router-E", "fc2-E", "fc1-E", "router-T", "input-H", "fc1-rows", "fc2-I",
        "fc1-bias", "fc2-bias"])
def test_bad_shapes(case, names, rng):
    """The message names the op and one of the inputs involved in the mismatch."""
    msg = _bad_shape_case(rng, _resize(*case))
    assert _mentions_moe(msg), msg
    assert any(n in msg for n in names), f"expected one of {names} in: {msg}"


@pytest.mark.parametrize("name,new_shape", [
    ("input", (24,)),                    # 1-D input
    ("input", (1, 1, 5, 24)),            # 4-D input
    ("router_probs", (1, 5, 4)),         # 3-D router
    ("fc1_experts_weights", (4 * 32, 24)),  # 2-D weights
    ("fc2_experts_weights", (4, 24, 16, 1)),  # 4-D weights
], ids=["input-1d", "input-4d", "router-3d", "fc1-2d", "fc2-4d"])
def test_bad_ranks(name, new_shape, rng):
    def mutate(feeds, r):
        a = feeds[name]
        feeds[name] = r.standard_normal(new_shape).astype(a.dtype)

    msg = _bad_shape_case(rng, mutate, unknown_rank=True, biases=False)
    assert _mentions_moe(msg), msg
    assert name in msg or "rank" in msg.lower() or "dim" in msg.lower(), msg


def test_bad_initializer_shapes_fail_at_load(rng):
    """Initializers that disagree (fc2 has E=5, fc1 E=4) are refused when the
    session is created or first run, with the reason."""
    cfg = MoEConfig(**BASE)
    model, w = build_moe_model(cfg, rng=rng)
    fc2 = np.concatenate([w["fc2"], w["fc2"][:1]])
    for init in model.graph.initializer:
        if init.name == W2:
            init.CopyFrom(helper.make_tensor(W2, TensorProto.FLOAT, list(fc2.shape),
                                             fc2.tobytes(), raw=True))
    msg = _run_expect_error(model, lambda: (random_input(cfg, 3, rng),
                                            random_logits(cfg, 3, rng)))
    assert "fc2" in msg or "expert" in msg.lower(), msg


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_unsupported_dtype(dtype, rng):
    """double / int32 MoE is not in the op's type list: the model is refused at
    session creation (ORT's type check) and never silently claimed."""
    cfg = MoEConfig(**{**BASE, "activation": "relu"}, dtype=dtype)
    model, _ = build_moe_model(cfg, rng=rng)
    with pytest.raises(Exception) as ei:
        sess = hina_session(model)
        run_moe(sess, random_input(cfg, 2, rng), random_logits(cfg, 2, rng))
    msg = _err_text(ei).lower()
    assert ("double" in msg or "int32" in msg or "type" in msg), msg


def test_mixed_dtypes_refused(rng):
    """f16 weights with an f32 input violate the op's single type T."""
    cfg = MoEConfig(**BASE, dtype="float16", router_dtype="float32")
    model, _ = build_moe_model(cfg, rng=rng)
    with pytest.raises(Exception) as ei:
        hina_session(model)
    assert "type" in _err_text(ei).lower()


def test_unknown_activation_refused(rng):
    """An unknown activation is not claimed (HinaMoE leaves it, so a session
    without fallback cannot be made) and the CPU EP then refuses it by name."""
    cfg = MoEConfig(**BASE, extra_attrs={"activation_type": "tanhshrink"})
    model, _ = build_moe_model(cfg, rng=rng)
    with pytest.raises(Exception):
        hina_session(model)
    with pytest.raises(Exception) as ei:
        sess = hina_session(model, no_fallback=False, cpu_fallback_provider=True)
        run_moe(sess, random_input(cfg, 2, rng), random_logits(cfg, 2, rng))
    assert "tanhshrink" in _err_text(ei) or "activation" in _err_text(ei).lower()


def test_fusion0_without_fc3_refused(rng):
    """swiglu_fusion=0 needs fc3; a model lacking it is an error, not garbage."""
    cfg = MoEConfig(**{**BASE, "swiglu_fusion": 1})
    model, _ = build_moe_model(cfg, rng=rng)
    node = model.graph.node[0]
    for a in node.attribute:
        if a.name == "swiglu_fusion":
            a.i = 0
    with pytest.raises(Exception) as ei:
        sess = hina_session(model)
        run_moe(sess, random_input(cfg, 2, rng), random_logits(cfg, 2, rng))
    assert _mentions_moe(_err_text(ei)) or "fc3" in _err_text(ei), _err_text(ei)
