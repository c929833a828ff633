"""hinamoe.models: layer builder, crafted routing, real shapes (no EP needed)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest

from hinamoe.models import (
    DEFAULT_BENCH_MODELS,
    SHAPES,
    MoEConfig,
    RoutingPlan,
    build_moe_model,
    crafted_logits,
    expert_token_counts,
    get_shape,
    model_path,
    random_input,
    random_logits,
    rotating_active_sets,
    run_moe,
    tokens_for,
)

from support.moe_reference import check_close, reference_for, route
from support.sessions import cpu_session


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("e,k,active", [(32, 8, 8), (32, 8, 16), (4, 2, 2), (16, 8, 8),
                                        (64, 4, 12), (5, 1, 3)])
def test_crafted_logits_exact_tokens_per_expert(n, e, k, active):
    act = rotating_active_sets(e, active, 3)[1]
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16):
        lg = crafted_logits(e, k, n, act, dtype)
        assert lg.shape == (tokens_for(n, active, k), e)
        counts = expert_token_counts(lg, k)
        expect = np.zeros(e, int)
        expect[act] = n
        assert counts.tolist() == expect.tolist()
        # and the reference router agrees (softmax + tie rule)
        top, w = route(lg, k, 0)
        assert np.bincount(top.reshape(-1), minlength=e).tolist() == expect.tolist()
        assert (w > 0).all()


def test_crafted_logits_rejects_impossible():
    with pytest.raises(ValueError):
        tokens_for(1, 3, 2)  # 3 slots cannot be split into tokens of 2
    with pytest.raises(ValueError):
        tokens_for(1, 2, 4)  # k > active


def test_rotation_groups_disjoint_and_cycle():
    sets = rotating_active_sets(32, 8, 5)
    assert sets[0] == list(range(8)) and sets[1] == list(range(8, 16))
    assert sets[4] == sets[0]
    plan = RoutingPlan(num_experts=32, k=8, tokens_per_expert=4, active_experts=8)
    assert plan.period == 4 and plan.num_tokens == 4
    for step in range(6):
        c = expert_token_counts(plan.logits(step), 8)
        assert set(np.nonzero(c)[0].tolist()) == set(plan.active_set(step))
        assert set(c[c > 0].tolist()) == {4}
    assert not set(plan.active_set(0)) & set(plan.active_set(1))


def test_crafted_routing_on_cpu_ep(rng):
    """Crafted logits through ORT's own MoE give the reference result."""
    cfg = MoEConfig(hidden=64, inter=40, experts=16, k=4, activation="swiglu",
                    normalize_routing_weights=1)
    model, w = build_moe_model(cfg, rng=rng)
    sess = cpu_session(model)
    plan = RoutingPlan(16, 4, 2, 8)
    for step in range(2):
        lg = plan.logits(step)
        x = random_input(cfg, plan.num_tokens, rng)
        check_close(run_moe(sess, x, lg), reference_for(cfg, x, lg, w), "float32", "crafted")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("act,fusion", [("relu", 0), ("swiglu", 0), ("swiglu", 1),
                                        ("swiglu", 2), ("geglu", 2), ("relu2", 0)])
def test_builder_layouts(dtype, act, fusion, rng):
    cfg = MoEConfig(hidden=20, inter=12, experts=3, k=2, activation=act, swiglu_fusion=fusion,
                    dtype=dtype, fc1_bias=True, fc2_bias=True, fc3_bias=True,
                    activation_alpha=1.702, swiglu_limit=7.0, input_rank=3)
    model, w = build_moe_model(cfg, rng=rng)
    onnx.checker.check_model(model)
    node = model.graph.node[0]
    assert (node.op_type, node.domain) == ("MoE", "com.microsoft")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["k"] == 2 and attrs["activation_type"] == act.encode()
    inits = {t.name: t for t in model.graph.initializer}
    gated = act in ("swiglu", "geglu")
    rows = 12 if (not gated or fusion == 0) else 24
    assert list(inits["fc1_experts_weights"].dims) == [3, rows, 20]
    assert list(inits["fc2_experts_weights"].dims) == [3, 20, 12]
    assert ("fc3_experts_weights" in inits) == (gated and fusion == 0)
    assert len(node.input) == (8 if gated and fusion == 0 else 6)
    # stored values are exactly the returned arrays
    arr = onnx.numpy_helper.to_array(inits["fc1_experts_weights"])
    if dtype == "bfloat16":
        arr = np.asarray(arr).view(np.uint16).view(ml_dtypes.bfloat16) \
            if arr.dtype != w["fc1"].dtype else arr
    np.testing.assert_array_equal(np.asarray(arr).astype(np.float64),
                                  w["fc1"].astype(np.float64))
    assert w["fc1"].dtype == np.dtype(ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    x = random_input(cfg, 6, rng, batch=2)
    assert x.shape == (2, 3, 20) and x.dtype == w["fc1"].dtype
    assert random_logits(cfg, 6, rng).dtype == x.dtype


def test_weights_as_graph_inputs():
    cfg = MoEConfig(hidden=16, inter=8, experts=4, k=2, weights_as_inputs=True, fc1_bias=True)
    model, _ = build_moe_model(cfg, seed=1)
    names = [i.name for i in model.graph.input]
    assert names == ["input", "router_probs", "fc1_experts_weights", "fc1_experts_bias",
                     "fc2_experts_weights"]
    assert not model.graph.initializer


def test_external_data_model(tmp_path, rng):
    """Expert-by-expert external data loads in ORT and equals the in-memory model."""
    cfg = MoEConfig(hidden=48, inter=32, experts=6, k=2, activation="swiglu", fc1_bias=True)
    model, w = build_moe_model(cfg, rng=rng, external_dir=tmp_path, name="layer")
    path = model_path(model)
    assert path and path.endswith("layer.onnx")
    assert (tmp_path / "layer.weights").stat().st_size >= cfg.total_weight_bytes()
    ext = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert len(ext) == 3
    model2, w2 = build_moe_model(cfg, weights=w)
    x, lg = random_input(cfg, 9, rng), random_logits(cfg, 9, rng)
    out_ext = run_moe(cpu_session(path), x, lg)
    out_mem = run_moe(cpu_session(model2), x, lg)
    np.testing.assert_array_equal(out_ext, out_mem)
    check_close(out_ext, reference_for(cfg, x, lg, w), "float32", "external")
    # without keeping weights: nothing returned, still loadable
    m3, w3 = build_moe_model(cfg, rng=rng, external_dir=tmp_path / "b", keep_weights=False)
    assert w3 == {}
    assert run_moe(cpu_session(model_path(m3)), x, lg).shape == x.shape


def test_real_shapes():
    q = get_shape("qwen3-30b-a3b")
    assert (q.hidden, q.inter, q.experts, q.k) == (2048, 768, 128, 8)
    m = get_shape("mixtral-8x7b")
    assert (m.hidden, m.inter, m.experts, m.k) == (4096, 14336, 8, 2)
    assert m.params_per_expert == 3 * 4096 * 14336
    d = get_shape("deepseek-v3")
    assert (d.hidden, d.inter, d.experts, d.k) == (7168, 2048, 256, 8)
    g = get_shape("gpt-oss-20b")
    assert (g.hidden, g.inter, g.experts, g.k) == (2880, 2880, 32, 4)
    assert (get_shape("qwen3-235b-a22b").hidden, get_shape("mixtral-8x22b").inter) == (4096, 16384)
    for name in DEFAULT_BENCH_MODELS:
        s = SHAPES[name]
        # bench layers hold >= 4x a 32 MiB L3 even in bf16
        assert s.default_bench_experts * s.expert_bytes(2) >= 4 * 32 * 2 ** 20
        assert s.default_bench_experts <= s.experts
    with pytest.raises(KeyError):
        get_shape("nope")
