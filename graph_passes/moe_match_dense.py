"""Matcher for a MoE block that runs all experts as one batched MatMul and
weights their outputs with a dense routing matrix, as optimum exports
gpt-oss:

    logits = Gemm(x[T,H], W_router, b)                (stays: feeds the MoE)
    w, idx = TopK(logits, k);  w = Softmax(w)
    dense  = ScatterElements(zeros[T,E], idx, w, axis=1)
    gu     = MatMul(x tiled to [E,T,H], W_gu[E,H,2I]) + b_gu[E,1,2I]
    g, u   = Slice(gu, gate columns), Slice(gu, up columns)
    g      = Clip(g, max=limit);  u = Clip(u, -limit, limit)       (optional)
    h      = g * Sigmoid(alpha * g) * (u + beta)
    y      = MatMul(h, W_down[E,I,H]) + b_down[E,1,H]
    out    = ReduceSum(y * dense^T[E,...,1], axis 0)

Softmax over the top-k logits equals the full softmax's top-k renormalised
(normalize_routing_weights=1), and the activation is ORT's SwiGLU with
activation_alpha, activation_beta and swiglu_limit read from the graph.
Weights come back to [out, in], gate and up interleaved.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .graph_walk import (NoMatch, OtherPattern, attr, const_array, const_ints, consumers,
                         only_consumer, producer, through_casts)
from .moe_block import MoEBlock, block_nodes, interleave

BLOCK_OPS = {
    "Add", "Cast", "Clip", "Concat", "ConstantOfShape", "Expand", "Gather", "MatMul", "Mul",
    "ReduceSum", "Reshape", "ScatterElements", "Shape", "Sigmoid", "Slice", "Softmax",
    "Tile", "TopK", "Transpose", "Unsqueeze",
}
# Ops between the dense routing matrix and the Mul that weights the experts.
ROUTING_RESHAPES = ("Transpose", "Reshape", "Unsqueeze")


def _scalar(value: ir.Value | None) -> float | None:
    arr = const_array(value)
    return None if arr is None or arr.size != 1 else float(arr.reshape(-1)[0])


def _split_const(node: ir.Node) -> tuple[ir.Value, np.ndarray | None]:
    """(the non-constant input, the constant) of a binary node."""
    a, b = node.inputs
    if const_array(b) is not None:
        return a, const_array(b)
    return b, const_array(a)


def _matmul_with_bias(value: ir.Value, what: str):
    """(MatMul node, bias or None) for `value` = MatMul(...) [+ bias]."""
    bias = None
    add = producer(value, "Add")
    if add is not None:
        value, bias = _split_const(add)
        if bias is None:
            raise NoMatch(f"the {what} projection adds a value that is not a constant")
    matmul = producer(value, "MatMul")
    weight = const_array(matmul.inputs[1]) if matmul is not None else None
    if weight is None or weight.ndim != 3:
        raise NoMatch(f"the {what} projection is not a MatMul with constant [E, in, out] weights")
    return matmul, weight, bias


def _shape_length(value: ir.Value) -> int | None:
    """Number of elements of a shape tensor built from constants and
    Unsqueezed scalars (how the exporter writes Reshape targets)."""
    const = const_ints(value)
    if const is not None:
        return len(const)
    shape = producer(value, "Shape")
    if shape is not None and shape.inputs[0].shape is not None and \
            not shape.attributes.get("start") and not shape.attributes.get("end"):
        return len(shape.inputs[0].shape)
    concat = producer(value, "Concat")
    if concat is None:
        return None
    total = 0
    for part in concat.inputs:
        n = _shape_length(part)
        if n is None and producer(part, "Unsqueeze") is not None:
            n = 1
        if n is None:
            return None
        total += n
    return total


def _clip_bounds(value: ir.Value) -> tuple[ir.Value, float | None, float | None]:
    clip = producer(value, "Clip")
    if clip is None:
        return value, None, None
    low = _scalar(clip.inputs[1]) if len(clip.inputs) > 1 and clip.inputs[1] is not None else None
    high = _scalar(clip.inputs[2]) if len(clip.inputs) > 2 and clip.inputs[2] is not None else None
    if (len(clip.inputs) > 1 and clip.inputs[1] is not None and low is None) or \
            (len(clip.inputs) > 2 and clip.inputs[2] is not None and high is None):
        raise NoMatch("a Clip in the activation has bounds that are not constants")
    return clip.inputs[0], low, high


def _gated_product(h: ir.Value):
    """(gate slice, up slice, alpha, beta, limit) of
    h = G * Sigmoid(alpha * G) * (U + beta), G and U optionally clamped."""
    product = producer(h, "Mul")
    if product is None:
        raise NoMatch("the down projection does not read a gated product")
    for glu, up in (product.inputs, product.inputs[::-1]):
        act = producer(glu, "Mul")
        if act is None:
            continue
        for g, s in (act.inputs, act.inputs[::-1]):
            sig = producer(s, "Sigmoid")
            if sig is None:
                continue
            alpha, scaled = 1.0, sig.inputs[0]
            if scaled is not g:
                scale = producer(scaled, "Mul")
                if scale is None:
                    continue
                other, alpha_arr = _split_const(scale)
                if other is not g or alpha_arr is None or alpha_arr.size != 1:
                    continue
                alpha = float(alpha_arr.reshape(-1)[0])
            beta, u = 0.0, up
            shift = producer(up, "Add")
            if shift is not None:
                u, beta_arr = _split_const(shift)
                if beta_arr is None or beta_arr.size != 1:
                    raise NoMatch("the up projection is shifted by a non-constant")
                beta = float(beta_arr.reshape(-1)[0])
            gate_in, g_low, g_high = _clip_bounds(g)
            up_in, u_low, u_high = _clip_bounds(u)
            limits = {g_high, u_high, None if u_low is None else -u_low}
            if g_low is not None or len(limits) != 1:
                raise NoMatch(f"the clamps (gate <= {g_high}, up in [{u_low}, {u_high}]) "
                              "are not one swiglu_limit")
            return gate_in, up_in, alpha, beta, limits.pop()
    raise NoMatch("activation is not gate * sigmoid(alpha * gate) * (up + beta)")


def _columns(slice_value: ir.Value, width: int) -> np.ndarray:
    """Which of the `width` fused gate/up columns a Slice on the last axis keeps."""
    node = producer(slice_value, "Slice")
    if node is None:
        raise NoMatch("gate and up are not slices of one fused projection")
    args = [const_ints(v) if v is not None else None for v in node.inputs[1:]]
    starts, ends = args[0], args[1]
    axes = args[2] if len(args) > 2 else None
    steps = args[3] if len(args) > 3 else None
    if starts is None or ends is None or len(starts) != 1 or (axes not in (None, [2], [-1])) \
            or (steps is not None and len(steps) != 1):
        raise NoMatch("gate/up Slice is not a constant slice of the last axis")
    return np.arange(width)[slice(starts[0], ends[0], steps[0] if steps else 1)]


def match(topk: ir.Node, where: str) -> MoEBlock:
    logits = through_casts(topk.inputs[0])
    softmaxes = consumers(topk.outputs[0], "Softmax")
    router = logits.producer()
    if len(softmaxes) != 1 or router is None or router.op_type not in ("Gemm", "MatMul", "Add"):
        raise OtherPattern("TopK does not pick router logits followed by a Softmax over the top k")
    softmax = softmaxes[0]
    if attr(softmax, "axis", -1) not in (-1, 1):
        raise NoMatch("the Softmax is not over the top-k experts")
    k = const_ints(topk.inputs[1])
    if k is None or len(k) != 1 or attr(topk, "largest", 1) != 1:
        raise NoMatch("TopK does not pick a constant number of largest logits")
    tokens2d = router.inputs[0] if router.op_type != "Add" else None
    if router.op_type == "Add":
        mm = producer(_split_const(router)[0], "MatMul")
        tokens2d = mm.inputs[0] if mm is not None else None
    if tokens2d is None:
        raise NoMatch("the router is not a (biased) projection of the tokens")

    scatter = only_consumer(topk.outputs[1], "ScatterElements", "TopK indices")
    zeros = producer(scatter.inputs[0], "ConstantOfShape")
    if (scatter.inputs[1] is not topk.outputs[1] or through_casts(scatter.inputs[2]) is not
            softmax.outputs[0] or attr(scatter, "axis", 0) not in (1, -1) or zeros is None
            or attr(scatter, "reduction", "none") != "none"):
        raise NoMatch("the top-k weights are not scattered into a dense [T, E] matrix")
    routing = scatter.outputs[0]
    while True:  # through the reshapes that line the weights up with [E, ..., H]
        users = [u for u in consumers(routing) if u.op_type != "Shape"]
        if len(users) != 1:
            raise NoMatch("the dense routing matrix is read more than once")
        if users[0].op_type not in ROUTING_RESHAPES:
            break
        routing = users[0].outputs[0]
    weighted = users[0]
    if weighted.op_type != "Mul" or routing not in weighted.inputs:
        raise NoMatch(f"the dense routing matrix feeds {weighted.op_type}, not the expert outputs")
    y = weighted.inputs[1] if weighted.inputs[0] is routing else weighted.inputs[0]
    reduce = only_consumer(weighted.outputs[0], "ReduceSum", "weighted expert outputs")
    axes = const_ints(reduce.inputs[1]) if len(reduce.inputs) > 1 else attr(reduce, "axes")
    if list(axes or []) != [0] or attr(reduce, "keepdims", 1) != 0:
        raise NoMatch("the expert outputs are not summed over the expert axis")
    output = reduce.outputs[0]

    reshape = producer(y, "Reshape")
    rank = _shape_length(reshape.inputs[1]) if reshape is not None else None
    if reshape is None or rank is None:
        raise NoMatch("the expert outputs' [E, ..., H] shape is unknown")
    down, w_down, b_down = _matmul_with_bias(reshape.inputs[0], "down")
    gate_in, up_in, alpha, beta, limit = _gated_product(down.inputs[0])
    gate_up = producer(gate_in, "Slice").inputs[0] if producer(gate_in, "Slice") else None
    if gate_up is None or producer(up_in, "Slice") is None or \
            producer(up_in, "Slice").inputs[0] is not gate_up:
        raise NoMatch("gate and up are not slices of one fused projection")
    fused, w_gu, b_gu = _matmul_with_bias(gate_up, "gate/up")
    experts, hidden, width = w_gu.shape
    gate_cols, up_cols = _columns(gate_in, width), _columns(up_in, width)
    inter = len(gate_cols)
    if len(up_cols) != inter or 2 * inter != width or \
            len(np.union1d(gate_cols, up_cols)) != width:
        raise NoMatch("gate and up columns do not split the fused projection in two")
    if w_down.shape != (experts, inter, hidden):
        raise NoMatch(f"down weights {w_down.shape} do not fit gate/up {w_gu.shape}")
    for bias, size, what in ((b_gu, width, "gate/up"), (b_down, hidden, "down")):
        if bias is not None and bias.size != experts * size:
            raise NoMatch(f"the {what} bias has shape {bias.shape}")

    x_pre = producer(tokens2d, "Reshape").inputs[0] if producer(tokens2d, "Reshape") else None
    boundary = {tokens2d: 2, logits: 2}
    if x_pre is not None:
        boundary[x_pre] = 3
    tokens = tokens2d if rank - 1 == 2 else x_pre
    if tokens is None or rank - 1 not in (2, 3):
        raise NoMatch(f"the block's output has rank {rank - 1}, not that of its tokens")
    expected = {"TopK": 1, "Softmax": 1, "ScatterElements": 1, "MatMul": 2, "Sigmoid": 1}
    nodes, kept, ranks = block_nodes(output, boundary, BLOCK_OPS, expected)
    if logits not in ranks:
        raise NoMatch("the block does not read the router logits")
    ranks[tokens] = boundary[tokens]  # the MoE node reads it even if the block did not

    gate = np.transpose(w_gu[:, :, gate_cols], (0, 2, 1))  # [E, I, H]
    up = np.transpose(w_gu[:, :, up_cols], (0, 2, 1))
    fc1_bias = None
    if b_gu is not None:
        b = b_gu.reshape(experts, width)
        fc1_bias = interleave(b[:, gate_cols, None], b[:, up_cols, None])[..., 0]
    return MoEBlock(
        where=where, tokens=tokens, logits=logits, input_ranks=ranks, output=output,
        nodes=nodes, kept=kept, k=k[0], normalize=1, fc1=interleave(gate, up),
        fc2=np.ascontiguousarray(np.transpose(w_down, (0, 2, 1))), fc1_bias=fc1_bias,
        fc2_bias=None if b_down is None else b_down.reshape(experts, hidden),
        alpha=alpha, beta=beta, limit=limit)
