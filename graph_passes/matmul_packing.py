"""MatMul packing: the MatMuls that read the same tokens with constant
weights of the same K (an attention layer's q, k and v projections; a
shared expert's gate and up) become one MatMul over the weights side by
side, then a Split.

At decode a projection is a pass over its weights, and k and v are small
(a twelfth of q's bytes in Qwen3-30B-A3B): one node per layer instead of
three saves two calls' fixed costs and lets the kernel split one larger
weight over the threads. Each output column is the same dot product as
before. A constant bias Add after each MatMul is packed as well. A MatMul
that computes an MoE node's router logits is never packed: routers stay
float when the quantize pass runs next, and a packed node would take them
to 4 bits. Run it after the fusions and before quantize.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .graph_walk import const_array
from .report import PassReport

NAME = "matmul-packing"
ROUTED = ("MoE", "QMoE")
# Ops between a router MatMul and the MoE's router input (as quantize sees
# them), besides the Add of a constant bias (gpt-oss).
PASS_THROUGH = ("Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


def _feeds_router(value: ir.Value) -> bool:
    work, seen = [value], set()
    while work:
        v = work.pop()
        for use in v.uses():
            node = use.node
            if node.op_type in ROUTED and use.idx == 1:
                return True
            bias_add = node.op_type == "Add" and const_array(node.inputs[1 - use.idx]) is not None
            if (node.op_type in PASS_THROUGH or bias_add) and node not in seen:
                seen.add(node)
                work.extend(node.outputs)
    return False


def _weight(node: ir.Node) -> np.ndarray | None:
    if node.op_type != "MatMul" or node.domain != "" or len(node.inputs) != 2:
        return None
    w = const_array(node.inputs[1])
    return w if w is not None and w.ndim == 2 and w.dtype.kind == "f" else None


def _bias(node: ir.Node, n: int) -> tuple[ir.Node | None, np.ndarray | None]:
    """The Add of a constant [N] bias that is the MatMul's only reader, if any."""
    users = list(node.outputs[0].uses())
    if len(users) != 1 or users[0].node.op_type != "Add" or node.outputs[0].is_graph_output():
        return None, None
    add = users[0].node
    other = add.inputs[1 - users[0].idx]
    b = const_array(other)
    if b is None or b.shape != (n,):
        return None, None
    return add, b


def _pack(graph: ir.Graph, x: ir.Value, group: list[tuple[ir.Node, np.ndarray]]) -> dict:
    weights = [w for _, w in group]
    packed_w = np.concatenate(weights, axis=1)
    sizes = [w.shape[1] for w in weights]
    first = group[0][0]
    name = f"{first.name or 'matmul'}/packed"
    w_value = ir.Value(name=f"{name}.weight", const_value=ir.tensor(packed_w))
    graph.register_initializer(w_value)
    tape = ir.tape.Tape()
    y = tape.op("MatMul", [x, w_value], name=name)
    biases = [_bias(node, w.shape[1]) for node, w in group]
    if all(add is not None for add, _ in biases):
        b_value = ir.Value(name=f"{name}.bias", const_value=ir.tensor(
            np.concatenate([b for _, b in biases]).astype(packed_w.dtype)))
        graph.register_initializer(b_value)
        y = tape.op("Add", [y, b_value], name=f"{name}/bias")
        ends = [add.outputs[0] for add, _ in biases]
    else:
        ends = [node.outputs[0] for node, _ in group]
    split_sizes = ir.Value(name=f"{name}.split", const_value=ir.tensor(np.array(sizes, np.int64)))
    graph.register_initializer(split_sizes)
    parts = tape.op_multi_out("Split", [y, split_sizes], {"axis": -1}, num_outputs=len(group),
                              name=f"{name}/split")
    graph.insert_before(first, tape.nodes)
    for old, new in zip(ends, parts):
        old.replace_all_uses_with(new)
    return {"layer": name, "packed": [node.name for node, _ in group], "N": sizes}


def apply(model: ir.Model, **options) -> PassReport:
    """Packs every group of two or more MatMuls sharing their input; options
    are ignored."""
    report = PassReport(name=NAME)
    graph = model.graph
    by_input: dict[ir.Value, list[tuple[ir.Node, np.ndarray]]] = {}
    for node in graph:
        w = _weight(node)
        if w is None or node.outputs[0].is_graph_output():
            continue
        if _feeds_router(node.outputs[0]):
            report.skipped.append({"where": node.name, "reason": "router logits stay a MatMul of their own"})
            continue
        by_input.setdefault(node.inputs[0], []).append((node, w))
    for x, nodes in by_input.items():
        groups: dict[tuple, list] = {}
        for node, w in nodes:
            groups.setdefault((w.shape[0], w.dtype.str), []).append((node, w))
        for group in groups.values():
            if len(group) >= 2:
                report.fused.append(_pack(graph, x, group))
    if report.fused:
        import onnx_ir.passes.common as common_passes

        common_passes.RemoveUnusedNodesPass()(model)
        graph.sort()
    return report
