"""Which run-time dimensions of a graph are provably the same.

One forward walk over the (sorted) graph gives every value whose rank it
can follow a root per axis: an int (a static size), ``("sym", name)`` for a
graph input's named symbolic dim (ONNX: inputs with the same dim_param are
the same size), or ``("value", name, axis)``, a dim first seen at that
value's output. Ops that pass a dim through unchanged (elementwise ops and
their broadcasting, MatMul's rows, Reshape's 0 and shape expressions,
Gather, Unsqueeze, Transpose, the normalisations, MoE ...) hand on their
input's root, so "the batch of q_proj's output" and "the batch of the
layer norm's input" end up with the same root. Two dims with equal roots
are equal at run time; different roots prove nothing. Ops the walk does
not know get fresh roots, never a guess.
"""

from __future__ import annotations

import onnx_ir as ir

from .graph_walk import const_array
from .shape_values import Dim, evaluate

Root = object  # int | ("sym", name) | ("value", name, axis)

_SAME_AS_INPUT = {
    "Cast", "Neg", "Sqrt", "Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Reciprocal", "Identity",
    "Softmax", "Abs", "Sin", "Cos", "Not", "IsNaN", "Gelu", "FastGelu", "QuickGelu",
    "SimplifiedLayerNormalization", "LayerNormalization", "SkipSimplifiedLayerNormalization",
    "SkipLayerNormalization", "RotaryEmbedding", "MoE", "QMoE",
}
_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "Where", "Equal", "Less", "Greater", "LessOrEqual",
              "GreaterOrEqual", "And", "Or", "Max", "Min"}


class DimRoots:
    """Roots of every value's dims in `graph` (call again after rewriting)."""

    def __init__(self, graph: ir.Graph):
        self.roots: dict[ir.Value, list] = {}
        self.by_name: dict[str, ir.Value] = {}
        for value in list(graph.inputs) + list(graph.initializers.values()):
            self._declare(value)
        for node in graph:
            for value in node.outputs:
                self.by_name[value.name or ""] = value
            try:
                outs = _RULES.get(node.op_type, _unknown)(self, node)
            except (TypeError, ValueError, IndexError, KeyError):
                outs = None
            for i, value in enumerate(node.outputs):
                dims = outs[i] if outs is not None and i < len(outs) else None
                if dims is None:
                    dims = self._from_declared(value)
                if dims is not None:
                    self.roots[value] = [d if d is not None else ("value", value.name, a)
                                         for a, d in enumerate(dims)]

    # ------------------------------------------------------------ queries

    def of(self, value: ir.Value | None) -> list | None:
        """The roots of `value`'s dims, or None when its rank is unknown."""
        return None if value is None else self.roots.get(value)

    def rank(self, value: ir.Value | None) -> int | None:
        dims = self.of(value)
        return None if dims is None else len(dims)

    def root_of(self, item) -> Root | None:
        """The root of an item of a shape expression (shape_values.evaluate)."""
        if isinstance(item, int):
            return item
        if isinstance(item, Dim):
            dims = self.of(self.by_name.get(item.value_name))
            return dims[item.axis] if dims is not None and item.axis < len(dims) else None
        return None

    # ------------------------------------------------------------ internals

    def _declare(self, value: ir.Value) -> None:
        self.by_name[value.name or ""] = value
        if value.const_value is not None:
            self.roots[value] = [int(d) for d in value.const_value.shape]
            return
        dims = self._from_declared(value, symbols=True)
        if dims is not None:
            self.roots[value] = [d if d is not None else ("value", value.name, a) for a, d in enumerate(dims)]

    @staticmethod
    def _from_declared(value: ir.Value, symbols: bool = False) -> list | None:
        if value.shape is None:
            return None
        out = []
        for d in value.shape:
            if isinstance(d, int):
                out.append(d)
            elif symbols and isinstance(d, ir.SymbolicDim) and d.value:
                out.append(("sym", d.value))
            else:
                out.append(None)
        return out

    def _in(self, node: ir.Node, i: int) -> list | None:
        return self.of(node.inputs[i]) if i < len(node.inputs) else None

    def evaluate(self, value: ir.Value | None):
        """shape_values.evaluate, reading the ranks found so far for Shape
        nodes of values without a declared shape."""
        return evaluate(value, _KnownRanks(self))


class _KnownRanks:
    """A `known` map for shape_values.evaluate: a value's dims as ints and
    Dims, which root_of maps back to roots."""

    def __init__(self, roots: DimRoots):
        self.roots = roots

    def __contains__(self, value) -> bool:
        return self.roots.of(value) is not None

    def __getitem__(self, value) -> list:
        return [d if isinstance(d, int) else Dim(value.name or "", a) for a, d in enumerate(self.roots.of(value))]


def _merge(parts: list) -> Root | None:
    """The dim of a broadcast over `parts` (roots, None for absent axes)."""
    real = [p for p in parts if p is not None and p != 1]
    if not real:
        return 1 if any(p == 1 for p in parts) else None
    ints = [p for p in real if isinstance(p, int)]
    if ints:
        return ints[0]
    return real[0] if all(p == real[0] for p in real) else None


def _same(roots: DimRoots, node: ir.Node):
    """Output 0 (and a Skip*Normalization's input + skip sum, output 3) has
    the input's dims; statistics outputs are left unknown."""
    x = roots._in(node, 0)
    return [x, None, None, x if node.op_type.startswith("Skip") else None][:len(node.outputs)]


def _constant(roots: DimRoots, node: ir.Node):
    arr = const_array(node.outputs[0])
    return None if arr is None else [list(arr.shape)]


def _broadcast(roots: DimRoots, node: ir.Node):
    ins = [roots.of(v) for v in node.inputs if v is not None]
    if any(d is None for d in ins):
        return None
    rank = max(len(d) for d in ins)
    out = [_merge([d[a - rank + len(d)] if a - rank + len(d) >= 0 else None for d in ins]) for a in range(rank)]
    return [out]


def _matmul(roots: DimRoots, node: ir.Node):
    a, b = roots._in(node, 0), roots._in(node, 1)
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return None
    lead = max(len(a), len(b)) - 2
    batch = [_merge([d[i - lead + len(d)] if i - lead + len(d) >= 0 else None for d in (a[:-2], b[:-2])])
             for i in range(lead)]
    return [batch + [a[-2], b[-1]]]


def _matmul_nbits(roots: DimRoots, node: ir.Node):
    a = roots._in(node, 0)
    n = node.attributes.get_int("N")
    return None if a is None or n is None else [a[:-1] + [n]]


def _reshape(roots: DimRoots, node: ir.Node):
    x = roots._in(node, 0)
    target = roots.evaluate(node.inputs[1])
    if target is None:
        return None
    if list(target.items) == [-1] and x is not None and len(x) == 1:
        return [list(x)]
    allow_zero = node.attributes.get_int("allowzero", 0) == 1
    out = []
    for i, item in enumerate(target.items):
        if item == 0 and not allow_zero:
            out.append(x[i] if x is not None and i < len(x) else None)
        elif item == -1:
            out.append(None)
        else:
            out.append(roots.root_of(item))
    return [out]


def _axes(node: ir.Node, rank: int) -> list[int] | None:
    arr = const_array(node.inputs[1]) if len(node.inputs) > 1 and node.inputs[1] is not None else None
    axes = node.attributes.get_ints("axes") if arr is None else arr.reshape(-1).tolist()
    return None if axes is None else sorted(int(a) % rank for a in axes)


def _unsqueeze(roots: DimRoots, node: ir.Node):
    x = roots._in(node, 0)
    if x is None:
        return None
    n_axes = len(const_array(node.inputs[1]).reshape(-1)) if len(node.inputs) > 1 else len(
        node.attributes.get_ints("axes"))
    axes = _axes(node, len(x) + n_axes)
    out = list(x)
    for a in axes:
        out.insert(a, 1)
    return [out]


def _squeeze(roots: DimRoots, node: ir.Node):
    x = roots._in(node, 0)
    if x is None or len(node.inputs) < 2 and "axes" not in node.attributes:
        return None
    axes = set(_axes(node, len(x)))
    return [[d for a, d in enumerate(x) if a not in axes]]


def _transpose(roots: DimRoots, node: ir.Node):
    x = roots._in(node, 0)
    perm = node.attributes.get_ints("perm")
    if x is None:
        return None
    perm = list(reversed(range(len(x)))) if perm is None else perm
    return [[x[p] for p in perm]]


def _gather(roots: DimRoots, node: ir.Node):
    data, idx = roots._in(node, 0), roots._in(node, 1)
    if data is None or idx is None:
        return None
    axis = node.attributes.get_int("axis", 0) % len(data)
    return [data[:axis] + idx + data[axis + 1:]]


def _concat(roots: DimRoots, node: ir.Node):
    ins = [roots.of(v) for v in node.inputs]
    if not ins or any(d is None for d in ins):
        return None
    axis = node.attributes.get_int("axis") % len(ins[0])
    out = list(ins[0])
    sizes = [d[axis] for d in ins]
    out[axis] = sum(sizes) if all(isinstance(s, int) for s in sizes) else None
    return [out]


def _split(roots: DimRoots, node: ir.Node):
    x = roots._in(node, 0)
    if x is None:
        return None
    axis = node.attributes.get_int("axis", 0) % len(x)
    out = list(x)
    out[axis] = None
    return [list(out) for _ in node.outputs]


def _slice(roots: DimRoots, node: ir.Node):
    """Sliced axes get fresh roots, except x[a - n : a] on one axis, which
    has n elements."""
    x = roots._in(node, 0)
    if x is None:
        return None
    axes = const_array(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    cut = range(len(x)) if axes is None else {int(a) % len(x) for a in axes.reshape(-1)}
    out = [None if a in cut else d for a, d in enumerate(x)]
    start, end = node.inputs[1], node.inputs[2]
    sub = start.producer()
    steps = node.inputs[4] if len(node.inputs) > 4 else None
    if (len(cut) == 1 and sub is not None and sub.op_type == "Sub" and sub.inputs[0] is end
            and (steps is None or const_array(steps).tolist() == [1])):
        n = roots.evaluate(sub.inputs[1])
        if n is not None and len(n.items) == 1:
            out[next(iter(cut))] = roots.root_of(n.items[0])
    return [out]


def _reduce(roots: DimRoots, node: ir.Node):
    x = roots._in(node, 0)
    if x is None or (len(node.inputs) < 2 and "axes" not in node.attributes):
        return None  # all axes, or noop_with_empty_axes: not worth following
    axes = set(_axes(node, len(x)))
    if node.attributes.get_int("keepdims", 1):
        return [[1 if a in axes else d for a, d in enumerate(x)]]
    return [[d for a, d in enumerate(x) if a not in axes]]


def _shaped_by(roots: DimRoots, node: ir.Node, i: int) -> list | None:
    """The dims a shape tensor (input i) asks for, as roots (-1 unknown)."""
    target = roots.evaluate(node.inputs[i])
    return None if target is None else [roots.root_of(t) if t != -1 else None for t in target.items]


def _expand(roots: DimRoots, node: ir.Node):
    """Broadcast of x against the target shape; a target entry nobody can
    evaluate still leaves an x dim other than 1 as it is."""
    x, target = roots._in(node, 0), _shaped_by(roots, node, 1)
    if target is None:
        length = roots._in(node, 1)
        target = [None] * length[0] if length is not None and isinstance(length[0], int) else None
    if x is None or target is None:
        return None
    rank = max(len(x), len(target))
    out = []
    for a in range(rank):
        xd = x[a - rank + len(x)] if a - rank + len(x) >= 0 else 1
        td = target[a - rank + len(target)] if a - rank + len(target) >= 0 else 1
        out.append(_merge([xd, td]) if td is not None else (xd if xd != 1 else None))
    return [out]


def _constant_of_shape(roots: DimRoots, node: ir.Node):
    target = _shaped_by(roots, node, 0)
    return None if target is None else [target]


def _uncast(value: ir.Value) -> ir.Value:
    while value.producer() is not None and value.producer().op_type == "Cast":
        value = value.producer().inputs[0]
    return value


def _range(roots: DimRoots, node: ir.Node):
    """Range(0, n, 1) has n elements, Range(a, a + n, 1) too."""
    start, limit, delta = node.inputs
    step = roots.evaluate(delta)
    if step is None or step.ints() != [1]:
        return [[None]]
    start, adder = _uncast(start), _uncast(limit).producer()
    if adder is not None and adder.op_type == "Add" and start in map(_uncast, adder.inputs):
        count = adder.inputs[1] if _uncast(adder.inputs[0]) is start else adder.inputs[0]
    elif roots.evaluate(start) is not None and roots.evaluate(start).ints() == [0]:
        count = limit
    else:
        return [[None]]
    n = roots.evaluate(count)
    return [[roots.root_of(n.items[0]) if n is not None and len(n.items) == 1 else None]]


def _flatten(roots: DimRoots, node: ir.Node):
    return [[None, None]]


def _shape(roots: DimRoots, node: ir.Node):
    x = roots._in(node, 0)
    if x is None:
        return None
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", len(x))
    return [[len(x[slice(start, end)])]]


def _gqa(roots: DimRoots, node: ir.Node):
    q = roots._in(node, 0)
    if q is None or len(q) != 3:
        return None
    packed = len(node.inputs) < 2 or node.inputs[1] is None
    return [[q[0], q[1], None if packed else q[2]]]


def _unknown(roots: DimRoots, node: ir.Node):
    return None


_RULES = {op: _same for op in _SAME_AS_INPUT}
_RULES.update({op: _broadcast for op in _BROADCAST})
_RULES.update({
    "MatMul": _matmul, "MatMulNBits": _matmul_nbits, "Reshape": _reshape, "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze, "Transpose": _transpose, "Gather": _gather, "Concat": _concat, "Split": _split,
    "Slice": _slice, "Shape": _shape, "ReduceMean": _reduce, "ReduceMax": _reduce, "ReduceSum": _reduce,
    "ReduceMin": _reduce, "Expand": _expand, "ConstantOfShape": _constant_of_shape, "Range": _range,
    "Flatten": _flatten, "GroupQueryAttention": _gqa, "Constant": _constant,
})
