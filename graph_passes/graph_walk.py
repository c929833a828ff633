"""Small helpers for walking an onnx_ir graph: constants, producers through
no-op Casts, and the nodes bounded by a set of values.

Matchers use them to state a pattern in a few readable lines; a helper
returns None (or raises NoMatch) instead of guessing when the graph does not
look as expected."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx_ir as ir


class NoMatch(Exception):
    """The pattern does not match; the message says where and why."""


class OtherPattern(NoMatch):
    """The site fails a matcher's very first check: it is some other
    pattern, so this matcher's reason is not worth reporting."""


def _through_identity(value: ir.Value) -> ir.Value:
    """The exporter shares equal tensors between layers through Identity."""
    node = value.producer()
    while node is not None and node.op_type == "Identity" and node.domain == "":
        value = node.inputs[0]
        node = value.producer()
    return value


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The value's constant (initializer or Constant node, possibly behind
    Identity), or None. An initializer that is also a graph input can be
    overridden, so it is not a constant."""
    if value is None:
        return None
    value = _through_identity(value)
    if value.is_graph_input():
        return None
    tensor = ir.convenience.get_const_tensor(value)
    return None if tensor is None else tensor.numpy()


def const_ints(value: ir.Value | None) -> list[int] | None:
    arr = const_array(value)
    if arr is None or arr.dtype.kind not in "iu":
        return None
    return [int(v) for v in arr.reshape(-1)]


def is_constant(value: ir.Value) -> bool:
    value = _through_identity(value)
    if value.is_graph_input():
        return False
    if value.const_value is not None:
        return True
    node = value.producer()
    return node is not None and node.op_type == "Constant" and node.domain == ""


def producer(value: ir.Value | None, op_type: str | None = None) -> ir.Node | None:
    """The node making `value` (of `op_type`, if given), else None."""
    if value is None:
        return None
    node = value.producer()
    if node is None or node.domain != "" or (op_type and node.op_type != op_type):
        return None
    return node


def through_casts(value: ir.Value) -> ir.Value:
    """Walks up Cast nodes (the exporter casts routing values to float and
    back, which is a no-op in an f32 export)."""
    node = producer(value, "Cast")
    while node is not None:
        value = node.inputs[0]
        node = producer(value, "Cast")
    return value


def attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def consumers(value: ir.Value, op_type: str | None = None) -> list[ir.Node]:
    nodes = list(dict.fromkeys(value.consumers()))
    return [n for n in nodes if op_type is None or (n.op_type == op_type and n.domain == "")]


def only_consumer(value: ir.Value, op_type: str, what: str) -> ir.Node:
    nodes = consumers(value)
    if len(nodes) != 1 or nodes[0].op_type != op_type:
        found = ", ".join(n.op_type for n in nodes) or "nothing"
        raise NoMatch(f"{what}: expected one {op_type} consumer, found {found}")
    return nodes[0]


def bounded_ancestors(outputs: Iterable[ir.Value], boundary: set[ir.Value]) -> set[ir.Node]:
    """Nodes that compute `outputs` from `boundary` values and constants.

    Constant nodes and initializers are leaves and are not included (they
    may be shared with other layers). Raises NoMatch when a value from
    elsewhere (a graph input or an unrelated node) is needed."""
    nodes: set[ir.Node] = set()
    stack = [v for v in outputs]
    seen: set[ir.Value] = set()
    while stack:
        value = stack.pop()
        if value in seen or value in boundary:
            continue
        seen.add(value)
        if is_constant(value):
            continue
        node = value.producer()
        if node is None:
            raise NoMatch(f"the block depends on {value.name!r}, which is not one of its inputs")
        if node not in nodes:
            nodes.add(node)
            stack.extend(v for v in node.inputs if v is not None)
    return nodes


def forward_until(starts: Iterable[ir.Node], stop, limit: int) -> set[ir.Node]:
    """Nodes reachable from `starts` (included) by following consumers,
    not going past nodes for which `stop(node)` is true (those are
    included). Raises NoMatch past `limit` nodes (the walk left the block)."""
    reached: set[ir.Node] = set()
    stack = list(starts)
    while stack:
        node = stack.pop()
        if node in reached:
            continue
        reached.add(node)
        if len(reached) > limit:
            raise NoMatch(f"the branch from {node.name!r} does not close within {limit} nodes")
        if stop(node):
            continue
        for out in node.outputs:
            stack.extend(out.consumers())
    return reached
