"""dtype pass: store the MoE expert weights in float16 or bfloat16.

Option ``dtype``: "fp16"/"float16", "bf16"/"bfloat16"; "fp32"/"float32",
"int4"/"int8" (the quantize pass's) or None leave the model alone. Every
com.microsoft::MoE node gets its fc1/fc2/fc3 weights and biases converted
(round to nearest even). The op wants one type T for all its inputs and its
output, so the tokens and router logits are cast to T before the node and
the output back to the model's type after it. Every other weight stays as
exported. Run it after the fusions.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from .report import PassReport

NAME = "dtype"
MS_DOMAIN = "com.microsoft"

TARGETS = {
    "fp16": ir.DataType.FLOAT16, "float16": ir.DataType.FLOAT16, "f16": ir.DataType.FLOAT16,
    "bf16": ir.DataType.BFLOAT16, "bfloat16": ir.DataType.BFLOAT16,
    "fp32": None, "float32": None, "f32": None,
    "int4": None, "int8": None,  # the quantize pass stores these
}
NUMPY = {ir.DataType.FLOAT16: np.dtype(np.float16),
         ir.DataType.BFLOAT16: np.dtype(ml_dtypes.bfloat16)}
FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
# MoE inputs 2..7: fc1, fc1 bias, fc2, fc2 bias, fc3, fc3 bias.
WEIGHT_SLOTS = range(2, 8)


def target_dtype(dtype: str | None) -> ir.DataType | None:
    if dtype is None:
        return None
    try:
        return TARGETS[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"dtype {dtype!r}: expected one of fp32, fp16, bf16, int4, int8") from None


def _weights(node: ir.Node) -> list[ir.Value]:
    return [node.inputs[i] for i in WEIGHT_SLOTS
            if i < len(node.inputs) and node.inputs[i] is not None]


def _why_not(node: ir.Node) -> str | None:
    for w in _weights(node):
        if w.const_value is None or w.is_graph_input():
            return f"{w.name!r} is not an initializer"
        if w.const_value.dtype not in FLOATS:
            return f"{w.name!r} is {w.const_value.dtype.name}, not a float type"
    return None


def _convert(graph: ir.Graph, node: ir.Node, index: int, target: ir.DataType) -> tuple[int, int]:
    """Puts input `index` of `node` in `target`; returns (bytes before, after)."""
    value = node.inputs[index]
    old = value.const_value
    if old.dtype == target:
        return old.nbytes, old.nbytes
    arr = old.numpy().astype(np.float32).astype(NUMPY[target])
    if len(value.uses()) == 1:  # only this node reads it: convert in place
        value.const_value = ir.tensor(arr, name=value.name)
        value.dtype = target
        return old.nbytes, arr.nbytes
    new = ir.Value(name=f"{value.name}.{target.name.lower()}", const_value=ir.tensor(arr))
    new.shape, new.dtype = ir.Shape(arr.shape), target
    graph.register_initializer(new)
    node.replace_input_with(index, new)
    return old.nbytes, arr.nbytes


def _cast(value: ir.Value, to: ir.DataType, name: str) -> ir.Node:
    node = ir.node("Cast", [value], {"to": to}, name=name)
    node.outputs[0].name, node.outputs[0].dtype = name + "_output_0", to
    node.outputs[0].shape = value.shape
    return node


def _retype_io(graph: ir.Graph, node: ir.Node, model_dtype: ir.DataType,
               target: ir.DataType) -> int:
    """Casts tokens and logits to `target` before the node and its output
    back to `model_dtype` after it. Returns the number of Casts added."""
    added = 0
    for index in (0, 1):
        value = node.inputs[index]
        if (value.dtype or model_dtype) != target:
            cast = _cast(value, target, f"{node.name}/Cast_in{index}")
            graph.insert_before(node, cast)
            node.replace_input_with(index, cast.outputs[0])
            added += 1
    if model_dtype != target:
        out = node.outputs[0]
        back = _cast(out, model_dtype, f"{node.name}/Cast_out")
        result = back.outputs[0]
        for user, index in list(out.uses()):
            if user is not back:
                user.replace_input_with(index, result)
        for i, graph_output in enumerate(graph.outputs):
            if graph_output is out:
                graph.outputs[i] = result
        # The rest of the graph keeps reading the name it read before.
        name = out.name
        out.name, out.dtype = f"{name}.{target.name.lower()}", target
        result.name = name
        graph.insert_after(node, back)
        added += 1
    return added


def apply(model: ir.Model, *, dtype: str | None = None, **_options) -> PassReport:
    """Stores the expert weights of every MoE node in `dtype` (in place)."""
    report = PassReport(NAME)
    target = target_dtype(dtype)
    if target is None:
        return report
    graph = model.graph
    for node in [n for n in graph if n.op_type == "MoE" and n.domain == MS_DOMAIN]:
        layer = node.name[: -len("/MoE")] if node.name.endswith("/MoE") else node.name
        why = _why_not(node)
        if why:
            report.skipped.append({"where": layer, "reason": why})
            continue
        # The model's activation type: the tokens' type when the graph says,
        # else the type the weights were exported in.
        model_dtype = node.inputs[0].dtype or node.inputs[2].const_value.dtype
        before = after = 0
        for index in WEIGHT_SLOTS:
            if index < len(node.inputs) and node.inputs[index] is not None:
                b, a = _convert(graph, node, index, target)
                before, after = before + b, after + a
        casts = _retype_io(graph, node, model_dtype, target)
        report.fused.append({"layer": layer, "dtype": target.name.lower(),
                             "weight_bytes_before": before, "weight_bytes_after": after,
                             "nodes_added": casts})
    return report
