"""RMSNorm pass (graph_passes/rms_norm.py).

* On real optimum exports of tiny random MoE checkpoints (after the MoE,
  GQA and static-shape passes): every RMSNorm becomes one node, the
  residual ones SkipSimplifiedLayerNormalization (two per layer and the
  final norm), no Pow/ReduceMean/Sqrt is left, and the model computes what
  it did within float32 rounding, on the CPU EP and on HinaMoE, for a
  left-padded batch, prefill + decode (inputs whose expert routing is a
  near-tie are redrawn: fusion_checks.clear_routing_steps).
* On hand-built graphs: a norm whose intermediate is read elsewhere stays
  as it is, and an Add of tensors nobody proves the same shape gets the
  plain form (a broadcasting Add is not a skip connection).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from hinamoe.graph_passes import rms_norm

from support.fusion_checks import assert_same_model, pass_pair, session_maker
from support.sessions import cpu_session

ARCHS = ["qwen3_moe", "mixtral", "qwen2_moe", "gpt_oss"]
BEFORE = ["moe-fusion", "gqa", "shapes"]
DECODE_STEPS = 3
FP32_REL = 1e-4  # of the largest |logit|: the fused norm sums in its own order


def _pair(path):
    return pass_pair(path, BEFORE, rms_norm.NAME, rotary_positions=64)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_norm_is_one_node(arch, tiny_export):
    before, after, report = _pair(tiny_export(arch).model)
    layers = sum(1 for v in after.graph.inputs if v.name.endswith(".key"))
    ops = [n.op_type for n in after.graph]
    assert not {"Pow", "ReduceMean", "Sqrt"} & set(ops), ops
    skips = [site for site in report.fused if site["skip"]]
    assert len(skips) == 2 * layers  # layer 0's input norm reads the embedding; the final norm a residual
    assert ops.count("SkipSimplifiedLayerNormalization") == 2 * layers
    assert ops.count("Add") < [n.op_type for n in before.graph].count("Add") - 2 * layers + 1
    assert report.skipped == []


@pytest.mark.parametrize("ep", ["CPU", "HinaMoE"])
@pytest.mark.parametrize("arch", ARCHS)
def test_same_model_within_rounding(arch, ep, tiny_export, rng):
    before, after, _ = _pair(tiny_export(arch).model)
    assert_same_model(before, after, session_maker(ep), rng, DECODE_STEPS, FP32_REL)


# ------------------------------------------------------------------ hand-built graphs

def _norm_graph(x_shapes, leak: bool = False):
    """out = RMSNorm(a + b) * w as HF exports it; `leak` also outputs the
    Sqrt, which the fused node does not give."""
    f = TensorProto.FLOAT
    inits = [onnx.numpy_helper.from_array(v, n) for n, v in (
        ("two", np.array(2.0, np.float32)), ("axes", np.array([-1], np.int64)),
        ("eps", np.array(1e-6, np.float32)), ("one", np.array(1.0, np.float32)),
        ("w", np.linspace(0.5, 1.5, 8).astype(np.float32)))]
    nodes = [helper.make_node("Add", ["a", "b"], ["x"]),
             helper.make_node("Pow", ["x", "two"], ["p"]),
             helper.make_node("ReduceMean", ["p", "axes"], ["m"], keepdims=1),
             helper.make_node("Add", ["m", "eps"], ["me"]),
             helper.make_node("Sqrt", ["me"], ["r"]),
             helper.make_node("Div", ["one", "r"], ["inv"]),
             helper.make_node("Mul", ["x", "inv"], ["y"]),
             helper.make_node("Mul", ["w", "y"], ["out"]),
             helper.make_node("Neg", ["x"], ["residual_reader"])]
    outputs = [helper.make_tensor_value_info(n, f, None) for n in ["out", "residual_reader"] + (["r"] if leak else [])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", f, x_shapes[0]),
                                           helper.make_tensor_value_info("b", f, x_shapes[1])], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("shapes,leak,want", [
    ((["B", "S", 8], ["B", "S", 8]), False, "SkipSimplifiedLayerNormalization"),
    ((["B", "S", 8], ["C", "S", 8]), False, "SimplifiedLayerNormalization"),  # B vs C: maybe a broadcast
    ((["B", "S", 8], ["B", "S", 8]), True, None),                             # the Sqrt is read outside
], ids=["skip", "unproven_shapes", "leaked_intermediate"])
def test_hand_built(shapes, leak, want, rng):
    proto = _norm_graph(shapes, leak)
    model = ir.serde.deserialize_model(proto)
    report = rms_norm.apply(model)
    ops = [n.op_type for n in model.graph]
    if want is None:
        assert report.fused == [] and "Pow" in ops
    else:
        assert want in ops and "Pow" not in ops
    feeds = {"a": rng.standard_normal((2, 3, 8)).astype(np.float32),
             "b": rng.standard_normal((2, 3, 8)).astype(np.float32)}
    ref = cpu_session(proto).run(None, feeds)
    got = cpu_session(ir.to_proto(model).SerializeToString()).run(None, feeds)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
