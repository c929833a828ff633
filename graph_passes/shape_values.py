"""Evaluates the small integer expressions an exporter builds shapes from
(Shape -> Gather -> Unsqueeze -> Concat, integer Div/Mul, ...), so a pass
can check what a Reshape, Expand or Slice really does.

Dimensions nobody knows statically stay symbolic: ``Dim(value, axis)``
stands for "axis `axis` of `value` at run time", so two expressions that
read the same dimension compare equal. Anything the evaluator does not
understand gives ``None``: the caller then treats the pattern as not
matched, never as a guess.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from .graph_walk import const_array


@dataclasses.dataclass(frozen=True)
class Dim:
    """A dimension known only at run time: `axis` of the tensor `value`."""

    value_name: str
    axis: int


# A 1-D shape expression: ints and Dims. A scalar is a 1-tuple with
# `scalar=True` in `IntExpr`.
@dataclasses.dataclass(frozen=True)
class IntExpr:
    items: tuple
    scalar: bool = False

    def ints(self) -> list[int] | None:
        """The elements when every one is a known int, else None."""
        if all(isinstance(x, (int, np.integer)) for x in self.items):
            return [int(x) for x in self.items]
        return None


_MAX_DEPTH = 32


def dims_of(value: ir.Value) -> list | None:
    """The static shape of `value` with symbolic dims as Dim, or None."""
    if value.shape is None:
        return None
    return [d if isinstance(d, int) else Dim(value.name or "", i) for i, d in enumerate(value.shape)]


def _shape_of(value: ir.Value, depth: int, known: dict) -> list | None:
    """Dims of a tensor: from its declared shape, or through shape-preserving
    producers (Transpose permutes, Reshape takes its target)."""
    if value in known:
        return list(known[value])
    declared = dims_of(value)
    if declared is not None:
        return declared
    node = value.producer()
    if node is None or depth > _MAX_DEPTH:
        return None
    if node.op_type == "Transpose":
        inner = _shape_of(node.inputs[0], depth + 1, known)
        perm = node.attributes.get_ints("perm")
        if inner is None or perm is None or len(perm) != len(inner):
            return None
        return [inner[p] for p in perm]
    if node.op_type == "Reshape":
        target = evaluate(node.inputs[1], known, depth + 1)
        if target is None:
            return None
        inner = _shape_of(node.inputs[0], depth + 1, known)
        out = []
        for i, t in enumerate(target.items):
            if t == 0 and node.attributes.get_int("allowzero", 0) == 0:
                out.append(inner[i] if inner is not None and i < len(inner) else Dim(value.name or "", i))
            elif t == -1:
                out.append(Dim(value.name or "", i))
            else:
                out.append(t)
        return out
    return None


def _arith(op: str, a, b):
    if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
        a, b = int(a), int(b)
        if op == "Add":
            return a + b
        if op == "Sub":
            return a - b
        if op == "Mul":
            return a * b
        if op == "Div" and b != 0:
            return int(a / b)  # ONNX integer Div truncates
    return None


def evaluate(value: ir.Value | None, known: dict | None = None, depth: int = 0) -> IntExpr | None:
    """The integer expression `value` holds, with run-time dims as Dim.

    `known` maps tensors to dims the caller has established (e.g. a head
    dimension checked elsewhere), for Shape nodes that read them."""
    known = {} if known is None else known
    if value is None or depth > _MAX_DEPTH:
        return None
    arr = const_array(value)
    if arr is not None:
        if arr.dtype.kind not in "iu" or arr.ndim > 1:
            return None
        return IntExpr(tuple(int(x) for x in arr.reshape(-1)), scalar=arr.ndim == 0)
    node = value.producer()
    if node is None:
        return None
    op = node.op_type
    ins = node.inputs
    if op == "Shape":
        dims = _shape_of(ins[0], depth + 1, known)
        if dims is None:
            return None
        start = node.attributes.get_int("start", 0)
        end = node.attributes.get_int("end", len(dims))
        return IntExpr(tuple(dims[slice(start, end)]))
    if op == "Cast" and node.attributes.get_int("to") in (ir.DataType.INT64, ir.DataType.INT32):
        return evaluate(ins[0], known, depth + 1)
    if op == "Gather":
        data, idx = evaluate(ins[0], known, depth + 1), evaluate(ins[1], known, depth + 1)
        if idx is None or idx.ints() is None or node.attributes.get_int("axis", 0) != 0:
            return None
        if data is None:
            # Gather(Shape(x), i) of an x whose rank nobody knows: still
            # "dim i of x", which is all a comparison needs.
            shape = ins[0].producer()
            if (shape is None or shape.op_type != "Shape" or shape.attributes.get_int("start", 0) != 0
                    or "end" in shape.attributes or any(i < 0 for i in idx.ints())):
                return None
            return IntExpr(tuple(Dim(shape.inputs[0].name or "", i) for i in idx.ints()), scalar=idx.scalar)
        try:
            picked = tuple(data.items[i] for i in idx.ints())
        except IndexError:
            return None
        return IntExpr(picked, scalar=idx.scalar)
    if op == "Unsqueeze":
        inner = evaluate(ins[0], known, depth + 1)
        return None if inner is None or not inner.scalar else IntExpr(inner.items)
    if op == "Squeeze":
        inner = evaluate(ins[0], known, depth + 1)
        return None if inner is None or len(inner.items) != 1 else IntExpr(inner.items, scalar=True)
    if op == "Slice":
        data = evaluate(ins[0], known, depth + 1)
        bounds = [const_array(v) if v is not None else None for v in list(ins[1:]) + [None] * (5 - len(ins))]
        if data is None or data.scalar or bounds[0] is None or bounds[1] is None:
            return None
        axes, steps = bounds[2], bounds[3]
        if (axes is not None and axes.reshape(-1).tolist() not in ([0], [-1])) or (
                steps is not None and steps.reshape(-1).tolist() != [1]):
            return None  # only a plain [start:end] of a 1-D expression
        start, end = int(bounds[0].reshape(-1)[0]), int(bounds[1].reshape(-1)[0])
        return IntExpr(tuple(data.items[start:end]))
    if op == "Concat":
        parts = [evaluate(v, known, depth + 1) for v in ins]
        if any(p is None or p.scalar for p in parts):
            return None
        return IntExpr(tuple(x for p in parts for x in p.items))
    if op == "Reshape":
        # Reshape(x, [-1]) of a 1-D expression is the expression itself.
        target = const_array(ins[1])
        inner = evaluate(ins[0], known, depth + 1)
        if inner is None or target is None or target.tolist() != [-1]:
            return None
        return IntExpr(inner.items)
    if op == "Where":
        # torch's expand idiom: Where(Equal(s, -1), ones, s) puts 1 (Expand's
        # "keep this dim") where s says -1.
        cond = ins[0].producer() if ins[0] is not None else None
        shape = evaluate(ins[2], known, depth + 1)
        if cond is None or cond.op_type != "Equal" or shape is None or cond.inputs[0] is not ins[2]:
            return None
        if any(x == -1 for x in shape.items):
            minus = evaluate(cond.inputs[1], known, depth + 1)
            if minus is None or set(minus.items) != {-1}:
                return None
            ones = evaluate(ins[1], known, depth + 1)
            if ones is None or len(ones.items) != len(shape.items) or any(o != 1 for o in ones.items):
                return None
            return IntExpr(tuple(1 if x == -1 else x for x in shape.items))
        return shape
    if op == "ConstantOfShape":
        # A 1-D fill whose length is a known int, e.g. the ones of the
        # expand idiom above.
        length = evaluate(ins[0], known, depth + 1)
        fill = node.attributes.get("value")
        arr = fill.value.numpy() if fill is not None else np.zeros(1, np.float32)
        if length is None or length.ints() is None or len(length.items) != 1 or arr.dtype.kind not in "iu":
            return None
        return IntExpr((int(arr.reshape(-1)[0]),) * length.ints()[0])
    if op in ("Add", "Sub", "Mul", "Div"):
        a, b = evaluate(ins[0], known, depth + 1), evaluate(ins[1], known, depth + 1)
        if a is None or b is None:
            return None
        if len(a.items) == 1 and len(b.items) != 1:
            a = IntExpr(a.items * len(b.items), a.scalar)
        if len(b.items) == 1 and len(a.items) != 1:
            b = IntExpr(b.items * len(a.items), b.scalar)
        if len(a.items) != len(b.items):
            return None
        out = tuple(_arith(op, x, y) for x, y in zip(a.items, b.items))
        if any(x is None for x in out):
            return None
        return IntExpr(out, scalar=a.scalar and b.scalar)
    return None
