"""dtype pass: store the weights of every linear in float16 or bfloat16.

Option ``dtype``: "fp16"/"float16", "bf16"/"bfloat16"; "fp32"/"float32",
"int4"/"int8" (the quantize pass's) or None leave the model alone.

* Every com.microsoft::MoE node gets its fc1/fc2/fc3 weights and biases
  converted (round to nearest even). The op wants one type T for all its
  inputs and its output, so the tokens and router logits are cast to T
  before the node and the output back to the model's type after it.
* Every MatMul whose weight is a constant float32 matrix (attention
  projections, LM head, shared experts) gets its weight converted, A cast
  to T before it and Y back after it (HinaMoE runs MatMul at T; ORT's CPU
  EP has no bfloat16 MatMul). A router MatMul keeps float32, as the
  quantize pass leaves it: rounding it would move tokens to other experts.
  One Cast serves every converted node that reads the same value.

Norms, residual adds and the KV cache stay in the model's type. Run it
after the fusions (and MatMul packing).
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


def _retype_io(graph: ir.Graph, node: ir.Node, model_dtype: ir.DataType, target: ir.DataType,
               inputs: tuple[int, ...], casts: dict) -> int:
    """Casts `inputs` of the node to `target` before it (one Cast per value:
    `casts` maps a value to its Cast's output) and its output back to
    `model_dtype` after it. Returns the number of Casts added."""
    added = 0
    for index in inputs:
        value = node.inputs[index]
        if (value.dtype or model_dtype) == target:
            continue
        if value not in casts:
            cast = _cast(value, target, f"{node.name}/Cast_in{index}")
            graph.insert_before(node, cast)
            casts[value] = cast.outputs[0]
            added += 1
        node.replace_input_with(index, casts[value])
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


def _dense_matmuls(graph: ir.Graph) -> list[ir.Node]:
    """MatMuls whose weight is a constant float32 matrix, routers excepted."""
    from .quantize import router_of

    routers = {r for n in graph if n.op_type in ("MoE", "QMoE") and n.domain == MS_DOMAIN
               if (r := router_of(n)) is not None}
    out = []
    for node in graph:
        if node.op_type != "MatMul" or node.domain != "" or node in routers:
            continue
        w = node.inputs[1]
        if w is None or w.const_value is None or w.is_graph_input():
            continue
        if w.const_value.dtype == ir.DataType.FLOAT and len(w.const_value.shape) == 2:
            out.append(node)
    return out


def apply(model: ir.Model, *, dtype: str | None = None, **_options) -> PassReport:
    """Stores the weights of every MoE node and of every dense MatMul in
    `dtype` (in place)."""
    report = PassReport(NAME)
    target = target_dtype(dtype)
    if target is None:
        return report
    graph = model.graph
    casts: dict[ir.Value, ir.Value] = {}
    dense = _dense_matmuls(graph)
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
        added = _retype_io(graph, node, model_dtype, target, (0, 1), casts)
        report.fused.append({"layer": layer, "op": "MoE", "dtype": target.name.lower(),
                             "weight_bytes_before": before, "weight_bytes_after": after,
                             "nodes_added": added})
    for node in dense:
        before, after = _convert(graph, node, 1, target)
        added = _retype_io(graph, node, ir.DataType.FLOAT, target, (0,), casts)
        report.fused.append({"layer": node.name, "op": "MatMul", "dtype": target.name.lower(),
                             "weight_bytes_before": before, "weight_bytes_after": after,
                             "nodes_added": added})
    return report
