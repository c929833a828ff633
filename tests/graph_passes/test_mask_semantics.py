"""mask_semantics.window_of on hand-built masks: a causal padding mask is
recognised (with its sliding window where it has one), anything else -- no
causality, a window off by one, an additive mask that leaves a padded key
visible -- is refused, so the GQA fusion keeps the exported mask there."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from hinamoe.graph_passes import mask_semantics


def _mask_model(kind: str, window: int | None = None, causal: bool = True, pad_visible: bool = False):
    """mask [B, 1, S, T] from attention_mask [B, T] and input_ids [B, S]:
    key padding, optionally causal (query s sits at T - S + s) and windowed."""
    i64 = lambda name, *v: onnx.numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    inits = [i64("zero", 0), i64("one", 1), i64("ax01", 0, 1), i64("ax12", 1, 2), i64("ax1", 1),
             i64("w", window or 0), onnx.numpy_helper.from_array(np.array(0.0, np.float32), "f0"),
             onnx.numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "fmin")]
    nodes = [
        helper.make_node("Shape", ["attention_mask"], ["t"], start=1, end=2),
        helper.make_node("Shape", ["input_ids"], ["s"], start=1, end=2),
        helper.make_node("Squeeze", ["t", "zero"], ["t0"]),
        helper.make_node("Squeeze", ["s", "zero"], ["s0"]),
        helper.make_node("Sub", ["t0", "s0"], ["p0"]),
        helper.make_node("Range", ["p0", "t0", "one"], ["q"]),
        helper.make_node("Range", ["zero", "t0", "one"], ["k"]),
        helper.make_node("Unsqueeze", ["q", "ax1"], ["qc"]),          # [S, 1]
        helper.make_node("LessOrEqual", ["k", "qc"], ["causal"]),     # [S, T]
        helper.make_node("Sub", ["qc", "w"], ["qw"]),
        helper.make_node("Greater", ["k", "qw"], ["in_window"]),
        helper.make_node("Cast", ["attention_mask"], ["am_b"], to=TensorProto.BOOL),
        helper.make_node("Unsqueeze", ["am_b", "ax12"], ["pad"]),     # [B, 1, 1, T]
    ]
    visible = "pad"
    if pad_visible:  # every key of row 1 visible: a mask that ignores padding there
        nodes.append(helper.make_node("Not", ["pad"], ["unpad"]))
        nodes.append(helper.make_node("Or", ["pad", "unpad"], ["all_keys"]))
        visible = "all_keys"
    rule = "causal"
    if window:
        nodes.append(helper.make_node("And", ["causal", "in_window"], ["causal_w"]))
        rule = "causal_w"
    if causal:
        nodes.append(helper.make_node("Unsqueeze", [rule, "ax01"], ["rule4"]))
        nodes.append(helper.make_node("And", [visible, "rule4"], ["bool_mask"]))
    else:
        nodes.append(helper.make_node("Expand", [visible, "shape4"], ["bool_mask"]))
        nodes.insert(0, helper.make_node("Concat", ["one", "one", "s", "t"], ["shape4"], axis=0))
    out = "bool_mask"
    if kind == "additive":
        nodes.append(helper.make_node("Where", ["bool_mask", "f0", "fmin"], ["add_mask"]))
        out = "add_mask"
    graph = helper.make_graph(nodes, "mask",
                              [helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["B", "T"]),
                               helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["B", "S"])],
                              [helper.make_tensor_value_info(out, TensorProto.BOOL if kind == "bool" else
                                                             TensorProto.FLOAT, None)], inits)
    model = ir.serde.deserialize_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    return model, model.graph.outputs[0]


@pytest.mark.parametrize("kind", ["bool", "additive"])
@pytest.mark.parametrize("window", [None, 5])
def test_causal_padding_masks_are_recognised(kind, window):
    model, mask = _mask_model(kind, window)
    assert mask_semantics.window_of(model, mask, kind, 64) == (True, window)


@pytest.mark.parametrize("change", ["not_causal", "pad_visible"])
def test_other_masks_are_refused(change):
    model, mask = _mask_model("bool", causal=change != "not_causal", pad_visible=change == "pad_visible")
    assert mask_semantics.window_of(model, mask, "bool", 64) == (False, None)


def test_a_window_longer_than_the_probe_is_not_taken_for_none():
    """The far-end probe spans the whole context: a window of 40 seen
    through 64 positions is found, not mistaken for full attention."""
    model, mask = _mask_model("bool", 40)
    assert mask_semantics.window_of(model, mask, "bool", 64) == (True, 40)
