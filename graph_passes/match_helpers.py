"""Small checks the pattern matchers share: each raises NoMatch with a
message that says what was expected where, so a pass can report why it
left a site unfused."""

from __future__ import annotations

import math

import onnx_ir as ir

from .graph_walk import NoMatch, const_array
from .shape_values import evaluate



def producer(value: ir.Value | None, op_type: str, what: str) -> ir.Node:
    node = value.producer() if value is not None else None
    if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
        got = "a graph input or initializer" if node is None else node.op_type
        raise NoMatch(f"{what}: expected {op_type}, got {got}")
    return node


def only_consumer(value: ir.Value, what: str, ignore_shape: bool = True) -> ir.Node:
    """The one consumer of `value` (Shape readers aside, they only read dims)."""
    users = {u.node for u in value.uses() if not (ignore_shape and u.node.op_type == "Shape")}
    if len(users) != 1:
        raise NoMatch(f"{what}: expected one consumer, found {len(users)}")
    return users.pop()


def scalar(value: ir.Value | None) -> float | None:
    arr = const_array(value)
    if arr is None or arr.size != 1:
        return None
    return float(arr.reshape(-1)[0])


def float_scalar(value: ir.Value | None, known: dict, depth: int = 0) -> float | None:
    """A float scalar the graph computes from constants and static dims,
    e.g. sqrt(1 / sqrt(head_dim)) built from Shape(q)."""
    c = scalar(value)
    if c is not None or value is None or depth > 16:
        return c
    node = value.producer()
    if node is None:
        return None
    if node.op_type == "Cast":
        inner = evaluate(node.inputs[0], known)
        if inner is not None and inner.ints() is not None and len(inner.items) == 1:
            return float(inner.items[0])
        return float_scalar(node.inputs[0], known, depth + 1)
    if node.op_type == "Sqrt":
        x = float_scalar(node.inputs[0], known, depth + 1)
        return None if x is None or x < 0 else math.sqrt(x)
    if node.op_type in ("Mul", "Div"):
        a, b = (float_scalar(v, known, depth + 1) for v in node.inputs)
        if a is None or b is None or (node.op_type == "Div" and b == 0):
            return None
        return a * b if node.op_type == "Mul" else a / b
    return None


def check_transpose(node: ir.Node, perm: list[int], what: str) -> None:
    got = node.attributes.get_ints("perm")
    if got is None or list(got) != perm:
        raise NoMatch(f"{what}: Transpose perm {got}, expected {perm}")


def check_axis(value, rank: int, axis: int, what: str) -> None:
    if value is None or value % rank != axis % rank:
        raise NoMatch(f"{what}: axis {value}, expected {axis}")


def ints(value: ir.Value | None, known: dict, what: str) -> list:
    expr = evaluate(value, known)
    if expr is None:
        raise NoMatch(f"{what}: cannot evaluate the shape expression")
    return list(expr.items)


def unsqueezed(value: ir.Value, axis: int, what: str) -> ir.Value:
    node = producer(value, "Unsqueeze", what)
    if ints(node.inputs[1], {}, f"{what} Unsqueeze axes") != [axis]:
        raise NoMatch(f"{what}: Unsqueeze on another axis than {axis}")
    return node.inputs[0]
