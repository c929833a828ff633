"""Static shapes: the per-token shape arithmetic an exporter writes around
every Reshape (Shape -> Gather -> Unsqueeze -> Concat, per layer, per call)
replaced by constants, so ONNX Runtime runs none of it.

* A Reshape whose target is computed becomes a Reshape to a constant when
  every computed entry is provably a static size or the same run-time dim
  as the input's at that position (then 0, "copy"); one entry nothing
  proves becomes -1. dim_roots.py does the proving; a target with two
  unknown entries stays as it is.
* A Reshape of a Reshape reads the first one's input; a Reshape to the
  shape its input has goes.
* An MoE/QMoE node reading Reshape(x [B, S, H], [-1, H]) whose output goes
  only to a Reshape back to x's shape reads x itself: ORT's MoE ops take
  [B, S, H] tokens with [B*S, E] router logits and give [B, S, H], so the
  Reshape back and its shape arithmetic go.

Nodes left without readers are removed. The numbers are unchanged: only
shapes move.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from .dim_roots import DimRoots
from .graph_walk import const_array
from .report import PassReport

NAME = "shapes"


def _constant_target(roots: DimRoots, node: ir.Node) -> list[int] | None:
    """The constant Reshape target equivalent to `node`'s computed one, or None."""
    if node.attributes.get_int("allowzero", 0) != 0:
        return None
    target = roots.evaluate(node.inputs[1])
    x = roots.of(node.inputs[0])
    if target is None:
        return None
    out: list[int | None] = []
    for i, item in enumerate(target.items):
        root = roots.root_of(item)
        if isinstance(root, int):
            out.append(root)
        elif root is not None and x is not None and i < len(x) and x[i] == root:
            out.append(0)
        else:
            out.append(None)
    unknown = [i for i, v in enumerate(out) if v is None]
    if len(unknown) > 1 or (unknown and -1 in out):
        return None
    if unknown:
        out[unknown[0]] = -1
    return out


def _moe_reads_3d(roots: DimRoots, node: ir.Node) -> bool:
    """Rewires `node` (MoE/QMoE) to read [B, S, H] and write it; True if done."""
    flat = node.inputs[0].producer() if node.inputs[0] is not None else None
    if flat is None or flat.op_type != "Reshape":
        return False
    x, shape = flat.inputs[0], roots.evaluate(flat.inputs[1])
    xr = roots.of(x)
    if xr is None or len(xr) != 3 or shape is None or [roots.root_of(t) for t in shape.items] != [-1, xr[2]]:
        return False
    y = node.outputs[0]
    users = [u.node for u in y.uses()]
    if y.is_graph_output() or len(users) != 1 or users[0].op_type != "Reshape" or users[0].inputs[0] is not y:
        return False
    back = users[0]
    target = roots.evaluate(back.inputs[1])
    if target is None or len(target.items) != 3 or [roots.root_of(t) for t in target.items] != xr:
        return False
    if back.outputs[0].is_graph_output():
        return False
    node.replace_input_with(0, x)
    back.outputs[0].replace_all_uses_with(y)
    y.shape = None
    return True


def _collapse_chain(node: ir.Node) -> bool:
    """Reshape(Reshape(x, a), b) -> Reshape(x, b'), b' = b with its 0
    entries ("copy") taken from a (possible where a has no -1 there)."""
    inner = node.inputs[0].producer()
    if inner is None or inner.op_type != "Reshape" or inner.attributes.get_int("allowzero", 0):
        return False
    a, b = const_array(inner.inputs[1]), const_array(node.inputs[1])
    if a is None or b is None:
        return False
    a, b = a.tolist(), b.tolist()
    if any(v == 0 and (i >= len(a) or a[i] == -1) for i, v in enumerate(b)):
        return False
    merged = [a[i] if v == 0 else v for i, v in enumerate(b)]
    node.replace_input_with(0, inner.inputs[0])
    node.replace_input_with(1, _const(node.graph, merged))
    return True


def _is_identity(roots: DimRoots, node: ir.Node) -> bool:
    """A Reshape to the shape its input already has: every entry copies (0)
    or repeats a static dim, and at most one -1 stands for the dim left."""
    x, target = roots.of(node.inputs[0]), const_array(node.inputs[1])
    if x is None or target is None or len(target) != len(x) or node.attributes.get_int("allowzero", 0):
        return False
    target = target.tolist()
    return target.count(-1) <= 1 and all(t in (0, -1) or t == d for t, d in zip(target, x))


def _const(graph: ir.Graph, target: list[int]) -> ir.Value:
    value = ir.Value(name=f"static_shapes/target_{len(graph.initializers)}",
                     const_value=ir.tensor(np.array(target, np.int64)))
    graph.register_initializer(value)
    return value


def apply(model: ir.Model, **options) -> PassReport:
    """Folds computed Reshape targets to constants and lets MoE read 3-D
    tokens; options are ignored."""
    report = PassReport(name=NAME)
    graph = model.graph
    graph.sort()
    roots = DimRoots(graph)
    moe = sum(1 for node in list(graph)
              if node.op_type in ("MoE", "QMoE") and node.domain == "com.microsoft" and _moe_reads_3d(roots, node))
    folded = 0
    for node in list(graph):
        if node.op_type != "Reshape" or node.domain != "" or const_array(node.inputs[1]) is not None:
            continue
        if not any(o.uses() or o.is_graph_output() for o in node.outputs):
            continue  # the MoE rewrite left it unread
        target = _constant_target(roots, node)
        if target is None:
            report.skipped.append({"where": node.name, "reason": "target has more than one unproven entry"})
            continue
        node.replace_input_with(1, _const(graph, target))
        folded += 1
    # Reshape pairs (v: [B,S,H] -> [B,S,N,D] -> [B,S,H]) collapse, and a
    # Reshape that changes nothing goes.
    identities = 0
    for node in list(graph):
        if node.op_type != "Reshape" or node.domain != "":
            continue
        _collapse_chain(node)
        out = node.outputs[0]
        if _is_identity(roots, node) and not out.is_graph_output():
            out.replace_all_uses_with(node.inputs[0])
            identities += 1
    before = len(graph)
    common_passes.RemoveUnusedNodesPass()(model)
    if folded or moe or identities:
        report.fused.append({"layer": "model", "reshapes_folded": folded, "moe_3d": moe,
                             "reshapes_dropped": identities, "nodes_removed": before - len(graph)})
    return report
