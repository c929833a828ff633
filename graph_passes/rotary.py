"""Rotary position embedding as exported, recognised and rebuilt on the
[B, S, heads, D] layout (before the exporter's transpose to BNSH).

Two exported forms, x = Transpose(0,2,1,3)(X) and h = D/2:

* "half" (Llama, Mixtral, Qwen): x*cos + rotate_half(x)*sin with
  rotate_half(x) = Concat(-x[..., h:], x[..., :h]), cos/sin [B, S, D].
* "chunk" (gpt-oss): Concat(x1*cos - x2*sin, x2*cos + x1*sin) with
  x1, x2 = x[..., :h], x[..., h:], cos/sin [B, S, D/2].

cos/sin reach the product as Unsqueeze(cos, 1); the rebuilt form uses
Unsqueeze(cos, 2) and the same elementwise ops in the same order, so its
results are bit-identical to the export's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir

from .match_helpers import NoMatch, check_axis, check_transpose, ints, producer, unsqueezed
from .shape_values import Dim


@dataclasses.dataclass
class Rotary:
    x: ir.Value  # [B, S, heads, D], what the export transposes then rotates
    cos: ir.Value  # [B, S, D] ("half") or [B, S, D/2] ("chunk")
    sin: ir.Value
    form: str  # "half" | "chunk"


def _check_halves(lower: ir.Node, upper: ir.Node, x: ir.Value, heads: int, head_dim: int, what: str):
    """lower = x[..., :D/2], upper = x[..., D/2:] (end may be D or larger)."""
    if lower.inputs[0] is not x or upper.inputs[0] is not x:
        raise NoMatch(f"{what}: the two halves slice different tensors")
    known = {x: [Dim("B", 0), heads, Dim("S", 0), head_dim]}
    half = head_dim // 2
    for sl, (lo, hi) in ((lower, (0, half)), (upper, (half, head_dim))):
        if sl.op_type != "Slice":
            raise NoMatch(f"{what}: expected Slice, got {sl.op_type}")
        arg = list(sl.inputs) + [None] * (5 - len(sl.inputs))
        starts = ints(arg[1], known, f"{what} slice start")
        ends = ints(arg[2], known, f"{what} slice end")
        axes = ints(arg[3], known, f"{what} slice axes") if arg[3] is not None else [0]
        steps = ints(arg[4], known, f"{what} slice steps") if arg[4] is not None else [1]
        ok = (starts == [lo] and len(ends) == 1 and isinstance(ends[0], int)
              and (ends[0] == hi if lo == 0 else ends[0] >= hi)
              and axes[0] in (3, -1) and steps == [1])
        if not ok:
            raise NoMatch(f"{what}: slice [{starts}:{ends}] on axes {axes} is not the half "
                          f"{lo}:{hi} of head_dim {head_dim}")


def _split_mul(node: ir.Node, tensor_producers: dict) -> tuple[ir.Value, ir.Value]:
    """Mul(a, b) as (the operand produced by one of `tensor_producers`, the other)."""
    a, b = node.inputs
    if a.producer() in tensor_producers:
        return a, b
    if b.producer() in tensor_producers:
        return b, a
    raise NoMatch(f"rotary: {node.name or 'Mul'} multiplies neither half of x")


def _transposed_input(x: ir.Value, what: str) -> ir.Value:
    transpose = producer(x, "Transpose", f"{what} before rotary")
    check_transpose(transpose, [0, 2, 1, 3], f"{what} to BNSH")
    return transpose.inputs[0]


def _match_half(add: ir.Node, head_dim: int, heads: int, what: str) -> Rotary:
    muls = [producer(v, "Mul", f"{what} rotary term") for v in add.inputs]
    rot = None
    for m in muls:
        for i in (0, 1):
            p = m.inputs[i].producer()
            if p is not None and p.op_type == "Concat":
                rot, rot_in, sin_u = m, m.inputs[i], m.inputs[1 - i]
    if rot is None:
        raise NoMatch(f"{what} rotary: no rotate_half (Concat) term")
    x_mul = muls[1] if rot is muls[0] else muls[0]
    concat = rot_in.producer()
    check_axis(concat.attributes.get_int("axis"), 4, 3, f"{what} rotate_half Concat")
    if len(concat.inputs) != 2:
        raise NoMatch(f"{what} rotate_half: Concat of {len(concat.inputs)} parts")
    neg = producer(concat.inputs[0], "Neg", f"{what} rotate_half first half")
    upper = producer(neg.inputs[0], "Slice", f"{what} rotate_half upper slice")
    lower = producer(concat.inputs[1], "Slice", f"{what} rotate_half lower slice")
    x = upper.inputs[0]
    _check_halves(lower, upper, x, heads, head_dim, f"{what} rotate_half")
    if x not in x_mul.inputs:
        raise NoMatch(f"{what} rotary: x*cos and rotate_half(x) read different tensors")
    cos_u = x_mul.inputs[1] if x_mul.inputs[0] is x else x_mul.inputs[0]
    return Rotary(_transposed_input(x, what), unsqueezed(cos_u, 1, f"{what} cos"),
                  unsqueezed(sin_u, 1, f"{what} sin"), "half")


def _match_chunk(concat: ir.Node, head_dim: int, heads: int, what: str) -> Rotary:
    check_axis(concat.attributes.get_int("axis"), 4, 3, f"{what} rotary Concat")
    if len(concat.inputs) != 2:
        raise NoMatch(f"{what} rotary: Concat of {len(concat.inputs)} parts")
    sub = producer(concat.inputs[0], "Sub", f"{what} rotary first half (x1*cos - x2*sin)")
    add = producer(concat.inputs[1], "Add", f"{what} rotary second half (x2*cos + x1*sin)")
    m1c, m2s = (producer(v, "Mul", f"{what} rotary term") for v in sub.inputs)
    m2c, m1s = (producer(v, "Mul", f"{what} rotary term") for v in add.inputs)
    halves = {m.inputs[i].producer() for m in (m1c, m2s) for i in (0, 1)
              if m.inputs[i].producer() is not None and m.inputs[i].producer().op_type == "Slice"}
    x1, cos_u = _split_mul(m1c, halves)
    x2, sin_u = _split_mul(m2s, halves)
    x2b, cos_b = _split_mul(m2c, halves)
    x1b, sin_b = _split_mul(m1s, halves)
    if x1 is x2 or x1b is not x1 or x2b is not x2 or cos_b is not cos_u or sin_b is not sin_u:
        raise NoMatch(f"{what} rotary: the four products are not x1*cos, x2*sin, x2*cos, x1*sin")
    x = x1.producer().inputs[0]
    _check_halves(x1.producer(), x2.producer(), x, heads, head_dim, f"{what} rotary halves")
    return Rotary(_transposed_input(x, what), unsqueezed(cos_u, 1, f"{what} cos"),
                  unsqueezed(sin_u, 1, f"{what} sin"), "chunk")


def match(value: ir.Value, head_dim: int, heads: int, what: str) -> Rotary:
    """The rotary embedding that produced `value` (BNSH), or NoMatch."""
    node = value.producer()
    if node is not None and node.op_type == "Add":
        return _match_half(node, head_dim, heads, what)
    if node is not None and node.op_type == "Concat":
        return _match_chunk(node, head_dim, heads, what)
    got = "a graph input" if node is None else node.op_type
    raise NoMatch(f"{what}: no rotary (x*cos + rotate_half(x)*sin or the chunked form), got {got}")


def build(tape: ir.tape.Tape, halves: ir.Value, x: ir.Value, cos: ir.Value, sin: ir.Value,
          form: str) -> ir.Value:
    """The rotary of `x` [B, S, heads, D]; cos/sin broadcast as [B, S, 1, *];
    `halves` is the constant [D/2, D/2] for Split."""
    lo, hi = tape.op_multi_out("Split", [x, halves], {"axis": -1}, num_outputs=2)
    if form == "half":
        rotated = tape.op("Concat", [tape.op("Neg", [hi]), lo], {"axis": -1})
        return tape.op("Add", [tape.op("Mul", [x, cos]), tape.op("Mul", [rotated, sin])])
    first = tape.op("Sub", [tape.op("Mul", [lo, cos]), tape.op("Mul", [hi, sin])])
    second = tape.op("Add", [tape.op("Mul", [hi, cos]), tape.op("Mul", [lo, sin])])
    return tape.op("Concat", [first, second], {"axis": -1})


def halves_constant(head_dim: int) -> np.ndarray:
    return np.array([head_dim // 2, head_dim // 2], np.int64)
