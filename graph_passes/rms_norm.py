"""RMSNorm as ORT's fused normalisation ops, residual adds included.

What an export of HF's RMSNorm gives (x float32; the Casts are the
module's upcast and downcast, no-ops in a float32 model)::

    xf = [Cast(float)](x)
    y  = Mul(xf, Div(1, Sqrt(Add(ReduceMean(Pow(xf, 2), axes=[-1]), eps))))
         (or Reciprocal(Sqrt(..)), or Mul(xf, Reciprocal(..)) in either order)
    out = Mul(weight, [Cast(float)](y))        (either operand order)

What it becomes: ``SimplifiedLayerNormalization(x, weight, axis=-1,
epsilon=eps)``; and where x is a residual ``Add(a, b)`` of two tensors of
the same shape (dim_roots.py proves it), ``com.microsoft::
SkipSimplifiedLayerNormalization(a, b, weight)``, whose fourth output, the
sum, replaces the Add for its other readers (the next residual). A decoder
layer's two Adds then cost no node of their own.

ONNX Runtime fuses the plain form itself when it loads a model, never the
skip form here (the sum has a second reader); writing both into the file
also serves runtimes without that optimiser.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from .dim_roots import DimRoots
from .graph_walk import NoMatch, const_array
from .report import PassReport

NAME = "rms-norm"
MS_DOMAIN = "com.microsoft"


@dataclasses.dataclass
class _Norm:
    x: ir.Value  # the normalised tensor as the model has it
    weight: ir.Value
    epsilon: float
    out: ir.Value
    where: str


def _strip_float_cast(value: ir.Value) -> ir.Value:
    node = value.producer()
    if node is not None and node.op_type == "Cast" and node.attributes.get_int("to") == ir.DataType.FLOAT:
        return node.inputs[0]
    return value


def _scalar(value: ir.Value | None) -> float | None:
    arr = const_array(value)
    return None if arr is None or arr.size != 1 else float(arr.reshape(-1)[0])


def _op(value: ir.Value | None, op_type: str) -> ir.Node:
    node = value.producer() if value is not None else None
    if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
        raise NoMatch(f"expected {op_type}")
    return node


def _match(mul_w: ir.Node) -> _Norm:
    """`mul_w` = Mul(weight, normalised) -> the norm it ends, or NoMatch."""
    a, b = mul_w.inputs
    weight, y = (a, b) if const_array(a) is not None else (b, a)
    w = const_array(weight)
    if w is None or w.ndim != 1 or w.dtype != np.float32:
        raise NoMatch("no 1-D float weight")
    mul = _op(_strip_float_cast(y), "Mul")
    for xf, inv in (tuple(mul.inputs), tuple(reversed(mul.inputs))):
        try:
            inv_node = inv.producer()
            if inv_node is not None and inv_node.op_type == "Reciprocal":
                sqrt = _op(inv_node.inputs[0], "Sqrt")
            else:
                div = _op(inv, "Div")
                if _scalar(div.inputs[0]) != 1.0:
                    raise NoMatch("Div is not 1 / x")
                sqrt = _op(div.inputs[1], "Sqrt")
            add = _op(sqrt.inputs[0], "Add")
            mean_v, eps_v = add.inputs if const_array(add.inputs[1]) is not None else reversed(add.inputs)
            eps = _scalar(eps_v)
            mean = _op(mean_v, "ReduceMean")
            axes = const_array(mean.inputs[1]) if len(mean.inputs) > 1 else None
            if eps is None or axes is None or axes.reshape(-1).tolist() != [-1] \
                    or mean.attributes.get_int("keepdims", 1) != 1:
                raise NoMatch("ReduceMean is not over the last axis, or no constant epsilon")
            power = _op(mean.inputs[0], "Pow")
            if power.inputs[0] is not xf or _scalar(power.inputs[1]) != 2.0:
                raise NoMatch("not the mean of x squared")
        except NoMatch:
            continue
        x = _strip_float_cast(xf)
        inner = [power, mean, add, sqrt, inv.producer(), mul]
        for node in inner:  # every intermediate read only inside the norm
            if any(out.is_graph_output() or any(u.node not in inner + [mul_w, y.producer()] for u in out.uses())
                   for out in node.outputs):
                raise NoMatch(f"{node.op_type} output read outside the norm")
        return _Norm(x=x, weight=weight, epsilon=eps, out=mul_w.outputs[0], where=mul_w.name or "")
    raise NoMatch("no RMSNorm ends here")


def _residual(roots: DimRoots, x: ir.Value) -> tuple[ir.Node, ir.Value, ir.Value] | None:
    """(Add, a, b) when x = Add(a, b) of two tensors with the same dims."""
    add = x.producer()
    if add is None or add.op_type != "Add" or add.domain != "" or x.is_graph_output():
        return None
    a, b = add.inputs
    ra, rb = roots.of(a), roots.of(b)
    if ra is None or ra != rb or len(ra) not in (2, 3) or const_array(a) is not None or const_array(b) is not None:
        return None
    return add, a, b


def _replace(old: ir.Value, new: ir.Value) -> None:
    """Every use of `old` (a graph output keeps its name) now reads `new`."""
    if old.is_graph_output():
        name, old.name = old.name, f"{old.name}/unfused"
        ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
        new.name = name
    else:
        old.replace_all_uses_with(new)


def apply(model: ir.Model, **options) -> PassReport:
    """Rewrites every RMSNorm; options are ignored."""
    report = PassReport(name=NAME)
    graph = model.graph
    graph.sort()
    roots = DimRoots(graph)
    norms = []
    for node in graph:
        if node.op_type == "Mul" and node.domain == "":
            try:
                norms.append(_match(node))
            except NoMatch:
                pass
    for norm in norms:
        tape = ir.tape.Tape()
        eps = float(np.float32(norm.epsilon))
        residual = _residual(roots, norm.x)
        anchor = norm.out.producer()
        if residual is not None:
            add, a, b = residual
            out, _, _, total = tape.op_multi_out(
                "SkipSimplifiedLayerNormalization", [a, b, norm.weight], {"epsilon": eps},
                domain=MS_DOMAIN, num_outputs=4, name=f"{norm.where}/SkipSimplifiedLayerNormalization")
            graph.insert_before(anchor, tape.nodes)
            _replace(norm.x, total)
        else:
            out = tape.op("SimplifiedLayerNormalization", [norm.x, norm.weight],
                          {"axis": -1, "epsilon": eps, "stash_type": 1}, name=f"{norm.where}/SimplifiedLayerNormalization")
            graph.insert_before(anchor, tape.nodes)
        _replace(norm.out, out)
        report.fused.append({"layer": norm.where, "epsilon": eps, "skip": residual is not None})
    if norms:
        import onnx_ir.passes.common as common_passes

        common_passes.RemoveUnusedNodesPass()(model)
        graph.sort()
        if MS_DOMAIN not in model.opset_imports:
            model.opset_imports[MS_DOMAIN] = 1
    return report
