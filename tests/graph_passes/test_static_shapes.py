"""Static shapes pass (graph_passes/static_shapes.py, dim_roots.py).

* On real optimum exports of tiny random MoE checkpoints, after the MoE
  and GQA fusions: the per-layer shape arithmetic is gone (every Reshape
  inside a layer has a constant target, every MoE node reads [B, S, H]
  tokens) and the model computes exactly what it computed before, on the
  CPU EP and on HinaMoE, for a left-padded batch, prefill + decode.
* On hand-built graphs: a target entry taken from a dim nothing proves
  equal to the input's is never turned into "copy" (0); two such entries
  leave the Reshape as it is; a broadcast of two different run-time dims
  proves nothing.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from hinamoe.graph_passes import static_shapes
from hinamoe.graph_passes.dim_roots import DimRoots
from hinamoe.graph_passes.graph_walk import const_array

from support.fusion_checks import assert_same_model, pass_pair, session_maker
from support.sessions import cpu_session

ARCHS = ["qwen3_moe", "mixtral", "qwen2_moe", "gpt_oss"]
BEFORE = ["moe-fusion", "gqa"]
ROTARY_POSITIONS = 64
DECODE_STEPS = 3


def _lean_pair(path):
    return pass_pair(path, BEFORE, static_shapes.NAME, rotary_positions=ROTARY_POSITIONS)


@pytest.mark.parametrize("arch", ARCHS)
def test_export_loses_its_shape_arithmetic(arch, tiny_export):
    before, after, report = _lean_pair(tiny_export(arch).model)
    layers = sum(1 for v in after.graph.inputs if v.name.endswith(".key"))
    [site] = report.fused
    # Qwen2-MoE adds its shared expert ([B*S, H]) to the MoE output before
    # reshaping back: the MoE node keeps its flat tokens there, and that
    # Reshape back keeps its computed target (two run-time dims).
    # (gpt-oss's MoE fusion reads [B, S, H] already.)
    shared_expert = arch == "qwen2_moe"
    flat = sum(1 for n in before.graph if n.op_type == "MoE" and n.inputs[0].producer().op_type == "Reshape")
    assert site["moe_3d"] == (0 if shared_expert else flat)
    assert site["reshapes_folded"] >= 3 * layers
    for node in after.graph:
        in_layer = "/layers." in (node.name or "")
        if node.op_type == "Reshape" and in_layer and not (shared_expert and "/mlp/" in node.name):
            assert const_array(node.inputs[1]) is not None, node.name
        if node.op_type == "MoE" and not shared_expert:
            assert node.inputs[0].producer().op_type != "Reshape", node.name
    per_layer = lambda m: sum(1 for n in m.graph if "/layers.0/" in (n.name or ""))  # noqa: E731
    assert per_layer(after) < per_layer(before) - 10
    assert all("/mlp/" in s["where"] for s in report.skipped if "/layers." in s["where"]), report.skipped


@pytest.mark.parametrize("ep", ["CPU", "HinaMoE"])
@pytest.mark.parametrize("arch", ARCHS)
def test_same_numbers_before_and_after(arch, ep, tiny_export, rng):
    """Only shapes move: every output of every step is bit for bit the same."""
    before, after, _ = _lean_pair(tiny_export(arch).model)
    assert_same_model(before, after, session_maker(ep), rng, DECODE_STEPS, None)


# ------------------------------------------------------------------ hand-built graphs

def _reshape_model(target_parts):
    """y = Reshape(x + w, Concat(parts)) with x [batch, seq, 8] and w
    [other, seq, 8]; `target_parts` are (value name, axis) to read from
    Shape(value), or ints."""
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("x", f, ["batch", "seq", 8]),
              helper.make_tensor_value_info("w", f, ["other", "seq", 8])]
    nodes, parts, inits = [], [], []
    nodes.append(helper.make_node("Add", ["x", "w"], ["xw"]))
    for i, part in enumerate(target_parts):
        if isinstance(part, int):
            inits.append(onnx.numpy_helper.from_array(np.array([part], np.int64), f"c{i}"))
            parts.append(f"c{i}")
            continue
        src, axis = part
        inits.append(onnx.numpy_helper.from_array(np.array(axis, np.int64), f"a{i}"))
        nodes += [helper.make_node("Shape", [src], [f"s{i}"]),
                  helper.make_node("Gather", [f"s{i}", f"a{i}"], [f"g{i}"]),
                  helper.make_node("Unsqueeze", [f"g{i}", "zero"], [f"u{i}"])]
        parts.append(f"u{i}")
    inits.append(onnx.numpy_helper.from_array(np.array([0], np.int64), "zero"))
    nodes += [helper.make_node("Concat", parts, ["target"], axis=0),
              helper.make_node("Reshape", ["xw", "target"], ["y"], name="the_reshape")]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", f, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _fold(proto):
    model = ir.serde.deserialize_model(proto)
    report = static_shapes.apply(model)
    reshape = next(n for n in model.graph if n.op_type == "Reshape")
    target = reshape.inputs[1].const_value
    return model, report, None if target is None else target.numpy().tolist()


@pytest.mark.parametrize("parts,want", [
    ([("xw", 0), ("xw", 1), 2, 4], [0, 0, 2, 4]),  # the Reshape's own input
    ([("x", 0), ("x", 1), 2, 4], [-1, 0, 2, 4]),   # x + w keeps x's seq; its batch is x's or w's
    ([("w", 0), ("w", 1), 8], [-1, 0, 8]),         # w's seq is x's ("seq" both): copy
    ([("x", 1), ("x", 0), 2, 4], None),            # swapped dims: two unknowns, left computed
], ids=["own", "input_of_add", "other_input", "swapped"])
def test_reshape_targets(parts, want, rng):
    proto = _reshape_model(parts)
    model, report, target = _fold(proto)
    assert target == want, (target, report)
    x = rng.standard_normal((3, 5, 8)).astype(np.float32)
    w = rng.standard_normal((3, 5, 8)).astype(np.float32)
    feeds = {"x": x, "w": w}
    ref = cpu_session(proto).run(None, feeds)[0]
    got = cpu_session(ir.to_proto(model).SerializeToString()).run(None, feeds)[0]
    assert np.array_equal(got, ref)


def test_broadcast_of_different_dims_proves_nothing():
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])], "g",
        [helper.make_tensor_value_info("a", f, ["m", 8]), helper.make_tensor_value_info("b", f, ["n", 8])],
        [helper.make_tensor_value_info("c", f, None)])
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    roots = DimRoots(model.graph)
    a, b = model.graph.inputs
    c = model.graph.outputs[0]
    assert roots.of(a) == [("sym", "m"), 8] and roots.of(b) == [("sym", "n"), 8]
    assert roots.of(c)[0] not in (("sym", "m"), ("sym", "n")) and roots.of(c)[1] == 8
