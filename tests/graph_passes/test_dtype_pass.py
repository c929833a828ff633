"""dtype pass: MoE expert weights and dense MatMul weights stored in
fp16/bf16 with Casts around the nodes, the router and everything else
untouched; the result runs (bf16 on HinaMoE, proved by the profile; fp16 on
both EPs) within the dtype's tolerance of a float64 reference."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from hinamoe.graph_passes import dtype as dtype_pass
from hinamoe.graph_passes import moe_fusion, run_passes

from support.fusion_checks import as_bytes, moe_node_names, node_providers, op_counts, run_pass
from support.sessions import cpu_session, hina_session
from support.unfused_moe_graph import build_unfused_block, random_block_weights, reference_block

NUMPY = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16}
# Relative to the output's scale: weights and activations rounded to the
# dtype (8 bits of mantissa for bf16, 11 for fp16) through two GEMMs.
TOLERANCE = {"fp16": 5e-3, "bf16": 4e-2}


def _fused_block(rng, shared=True):
    weights = random_block_weights(rng, int(rng.choice([48, 72])), 32, int(rng.integers(4, 9)),
                                   shared_inter=24 if shared else 0)
    k = 2
    model = build_unfused_block(weights, k, normalize=True)
    fused, report = run_pass(moe_fusion.apply, model)
    assert report.matched == 1
    return weights, k, fused


def _close(got, want, rel):
    scale = np.abs(want).max()
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= rel * scale, f"max error {err:.3g} > {rel * scale:.3g}"


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_weights_converted_rest_untouched(dtype, rng):
    """The experts and the shared expert's MatMuls at the dtype, the router
    and everything else as it was; Casts in and out of each converted node,
    one per value."""
    _, _, fused = _fused_block(rng)
    before = {name: v.const_value.numpy().copy() for name, v in fused.graph.initializers.items()}
    routers = {n.inputs[1].name for n in fused.graph if n.op_type == "MatMul"
               if any(u.node.op_type == "MoE" for u in n.outputs[0].uses())}
    report = dtype_pass.apply(fused, dtype=dtype)
    by_op = {}
    for site in report.fused:
        assert site["weight_bytes_after"] * 2 == site["weight_bytes_before"], site
        by_op.setdefault(site["op"], []).append(site)
    [moe] = [n for n in fused.graph if n.op_type == "MoE"]
    dense = [n for n in fused.graph if n.op_type == "MatMul" and n.inputs[1].name not in routers]
    assert len(by_op["MoE"]) == 1 and len(by_op["MatMul"]) == len(dense) >= 3  # shared expert: gate, up, down
    converted = {moe.inputs[2].name, moe.inputs[4].name} | {n.inputs[1].name for n in dense}
    assert routers and not routers & converted
    for name, old in before.items():
        new = fused.graph.initializers[name].const_value.numpy()
        if name in converted:
            assert new.dtype == np.dtype(NUMPY[dtype]), name
            np.testing.assert_array_equal(new, old.astype(NUMPY[dtype]))
        else:
            assert new.dtype == old.dtype, name
            np.testing.assert_array_equal(new, old)
    for node in [moe, *dense]:
        assert node.outputs[0].dtype == node.inputs[0].dtype == node.inputs[1].dtype
        assert [u.node.op_type for u in node.outputs[0].uses()] == ["Cast"]
    # One Cast per value cast in, one per converted node's output.
    cast_inputs = [n.inputs[0] for n in fused.graph if n.op_type == "Cast"]
    assert len(cast_inputs) == len(set(cast_inputs))
    assert op_counts(fused)["Cast"] == sum(s["nodes_added"] for s in report.fused)


def _clear_routing(rng, weights, k: int, shape: tuple, rel_gap: float = 2 ** -6):
    """Random hidden states whose k-th and (k+1)-th router logits differ by
    more than two steps of the MoE node's type (relative 2^-6 for bf16, 2^-9
    for fp16), so rounding the logits to that type (the node takes them so)
    routes every token as float64 does."""
    for _ in range(50):
        x = rng.standard_normal(shape).astype(np.float32)
        logits = np.sort(x.reshape(-1, shape[-1]).astype(np.float64) @ weights.router.astype(np.float64), -1)[:, ::-1]
        gap = logits[:, k - 1] - logits[:, k]
        if np.all(gap > rel_gap * np.abs(logits[:, k - 1:k + 1]).max(-1)):
            return x
    raise AssertionError("50 draws in a row had a router near-tie")


def test_bf16_model_runs_on_hinamoe(tmp_path, rng):
    weights, k, fused = _fused_block(rng)
    dtype_pass.apply(fused, dtype="bf16")
    [moe_name] = moe_node_names(fused)
    sess = hina_session(as_bytes(fused), no_fallback=False, cpu_fallback_provider=True,
                        profile_prefix=str(tmp_path / "bf16"))
    x = _clear_routing(rng, weights, k, (2, 5, weights.router.shape[0]))
    out = {}
    providers = node_providers(sess, lambda: out.setdefault("y", sess.run(None, {"hidden": x})[0]))
    assert providers.get(moe_name) == "HinaMoE", providers
    bf16_matmuls = [n.name for n in fused.graph if n.op_type == "MatMul" and n.inputs[1].dtype == ir.DataType.BFLOAT16]
    assert bf16_matmuls and all(providers.get(n) == "HinaMoE" for n in bf16_matmuls), providers
    assert out["y"].dtype == np.float32
    # The MoE node takes the router logits at bf16: the reference routes on the same rounding.
    _close(out["y"], reference_block(x, weights, k, True, logits_dtype=NUMPY["bf16"]), TOLERANCE["bf16"])


def test_fp16_model_same_on_cpu_ep_and_hinamoe(rng):
    weights, k, fused = _fused_block(rng, shared=False)
    dtype_pass.apply(fused, dtype="fp16")
    x = _clear_routing(rng, weights, k, (3, 4, weights.router.shape[0]), rel_gap=2 ** -9)
    want = reference_block(x, weights, k, True, logits_dtype=np.float16)
    cpu = cpu_session(as_bytes(fused)).run(None, {"hidden": x})[0]
    hina = hina_session(as_bytes(fused), no_fallback=False,
                        cpu_fallback_provider=True).run(None, {"hidden": x})[0]
    _close(cpu, want, TOLERANCE["fp16"])
    _close(hina, want, TOLERANCE["fp16"])
    _close(hina, cpu.astype(np.float64), TOLERANCE["fp16"])


@pytest.mark.parametrize("dtype", [None, "fp32", "float32"])
def test_fp32_is_a_no_op(dtype, rng):
    _, _, fused = _fused_block(rng, shared=False)
    before = as_bytes(fused)
    report = dtype_pass.apply(fused, dtype=dtype)
    assert report.fused == [] and report.skipped == []
    assert as_bytes(fused) == before


def test_unknown_dtype_is_an_error(rng):
    _, _, fused = _fused_block(rng, shared=False)
    with pytest.raises(ValueError, match="fp32, fp16, bf16, int4, int8"):
        dtype_pass.apply(fused, dtype="fp8")


@pytest.mark.parametrize("dtype", ["int4", "int8"])
def test_int_dtypes_are_the_quantize_pass(dtype, rng):
    _, _, fused = _fused_block(rng, shared=False)
    before = as_bytes(fused)
    report = dtype_pass.apply(fused, dtype=dtype)
    assert report.fused == [] and report.skipped == []
    assert as_bytes(fused) == before


def test_weights_as_graph_inputs_left_alone(rng):
    """A MoE whose weights are graph inputs cannot be converted: reported."""
    e, h, i = 4, 16, 8
    node = helper.make_node("MoE", ["x", "logits", "fc1", "", "fc2"], ["y"], name="moe",
                            domain="com.microsoft", k=2, activation_type="swiglu",
                            swiglu_fusion=1)
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", f32, ["T", h]),
         helper.make_tensor_value_info("logits", f32, ["T", e]),
         helper.make_tensor_value_info("fc1", f32, [e, 2 * i, h])],
        [helper.make_tensor_value_info("y", f32, ["T", h])],
        initializer=[numpy_helper.from_array(
            rng.standard_normal((e, h, i)).astype(np.float32), "fc2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("com.microsoft", 1)])
    converted, report = run_pass(dtype_pass.apply, model, dtype="bf16")
    assert report.fused == []
    assert report.skipped == [{"where": "moe", "reason": "'fc1' is not an initializer"}]
    assert converted.graph.initializers["fc2"].const_value.dtype == ir.DataType.FLOAT


def test_pipeline_dtype_option(rng):
    weights = random_block_weights(rng, 48, 32, 6)
    model = build_unfused_block(weights, 2, normalize=False)
    fused, report = run_passes(model, dtype="bf16")
    by_name = {p.name: p for p in report.passes}
    assert by_name["moe-fusion"].matched == 1 and by_name["dtype"].matched == 1
    [moe] = [n for n in fused.graph if n.op_type == "MoE"]
    assert moe.inputs[2].const_value.dtype == ir.DataType.BFLOAT16
