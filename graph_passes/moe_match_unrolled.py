"""Matcher for the sparse-MoE block as optimum exports Mixtral, Qwen2-MoE and
Qwen3-MoE with the expert loop unrolled over all E experts:

    logits = MatMul(x[T,H], W_router[H,E])            (stays: feeds the MoE)
    probs  = Softmax(logits, axis=-1)  (Casts allowed around it)
    w, idx = TopK(probs, k)
    w      = w / ReduceSum(w, -1, keepdims)            (optional: renormalise)
    mask   = Transpose(OneHot(idx, E), (2,1,0))
    per expert e, from Gather(mask, e):
        tokens routed to e -> g = MatMul(xe, Wg), u = MatMul(xe, Wu)
        y = MatMul(g * Sigmoid(g) * u, Wd) * (routing weight of e)
        acc = acc + ScatterElements(zeros, token rows, y)
    out = the last acc                                 (the MoE output replaces it)

SwiGLU with alpha 1, beta 0 and no limit is exactly silu(g) * u. TorchScript
stores Linear weights as [in, out] for MatMul; they go back to PyTorch's
[out, in]. Anything else added to the layer's output (Qwen2-MoE's gated
shared expert) is outside the block and stays as it is.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .graph_walk import (NoMatch, OtherPattern, attr, const_array, const_ints, consumers,
                         forward_until, only_consumer, producer, through_casts)
from .moe_block import MoEBlock, block_nodes, interleave

BLOCK_OPS = {
    "Add", "Cast", "Concat", "ConstantOfShape", "Div", "Expand", "Flatten", "Gather",
    "MatMul", "Mul", "NonZero", "OneHot", "ReduceSum", "Reshape", "ScatterElements",
    "Shape", "Sigmoid", "Slice", "Softmax", "Split", "Squeeze", "TopK", "Transpose",
    "Unsqueeze",
}
# Nodes one expert branch may hold; more means the walk left the block.
BRANCH_NODE_LIMIT = 200


def _is_accumulation(node: ir.Node) -> bool:
    return node.op_type == "Add" and any(producer(v, "ScatterElements") for v in node.inputs)


def _fill_value(node: ir.Node) -> np.ndarray:
    """ConstantOfShape's fill value (zero when the attribute is absent)."""
    value = node.attributes.get("value")
    return np.zeros(1, np.float32) if value is None else value.value.numpy()


def _match_router(topk: ir.Node):
    """(tokens, logits, W_router, k) from the TopK upwards."""
    softmax = producer(through_casts(topk.inputs[0]), "Softmax")
    if softmax is None:
        raise OtherPattern("TopK does not select from a Softmax over the router logits")
    if attr(softmax, "axis", -1) not in (-1, 1):
        raise NoMatch(f"Softmax over axis {attr(softmax, 'axis')}, not the experts")
    logits = through_casts(softmax.inputs[0])
    router = producer(logits, "MatMul")
    w_router = const_array(router.inputs[1]) if router is not None else None
    if w_router is None or w_router.ndim != 2:
        raise NoMatch("the router logits are not a MatMul with a constant [H, E] weight")
    tokens = router.inputs[0]
    if tokens.shape is not None and len(tokens.shape) != 2:
        # The MoE op takes router logits as [T, E] only.
        raise NoMatch(f"the router reads rank-{len(tokens.shape)} tokens, not [T, H]")
    k = const_ints(topk.inputs[1])
    if k is None or len(k) != 1:
        raise NoMatch("TopK's k is not a constant")
    if attr(topk, "largest", 1) != 1 or attr(topk, "axis", -1) not in (-1, 1):
        raise NoMatch("TopK does not pick the largest probabilities over the experts")
    return tokens, logits, w_router, k[0]


def _match_selects(topk: ir.Node, num_experts: int) -> dict[int, ir.Node]:
    """expert index -> the Gather that picks that expert's routing mask."""
    onehot = only_consumer(topk.outputs[1], "OneHot", "TopK indices")
    if const_ints(onehot.inputs[1]) != [num_experts]:
        raise NoMatch(f"OneHot depth is not the router's {num_experts} experts")
    mask = only_consumer(onehot.outputs[0], "Transpose", "OneHot")
    if list(attr(mask, "perm", [])) != [2, 1, 0]:
        raise NoMatch("the expert mask is not OneHot transposed to [E, k, T]")
    selects: dict[int, ir.Node] = {}
    for node in consumers(mask.outputs[0]):
        index = const_ints(node.inputs[1]) if node.op_type == "Gather" else None
        if index is None or len(index) != 1 or attr(node, "axis", 0) != 0:
            raise NoMatch(f"the expert mask feeds {node.op_type} {node.name!r}, "
                          "not a Gather of one expert")
        e = index[0] % num_experts
        if e in selects:
            raise NoMatch(f"expert {e} is selected twice")
        selects[e] = node
    missing = sorted(set(range(num_experts)) - set(selects))
    if missing:
        raise NoMatch(f"no branch for expert(s) {missing} of {num_experts}")
    return selects


def _weight(matmul: ir.Node, what: str) -> np.ndarray:
    w = const_array(matmul.inputs[1])
    if w is None or w.ndim != 2:
        raise NoMatch(f"{what} weight is not a constant matrix")
    return w


def _match_expert(e: int, select: ir.Node):
    """(gate [I,H], up [I,H], down [H,I], the accumulation Add) of expert e."""
    branch = forward_until([select], _is_accumulation, BRANCH_NODE_LIMIT)
    matmuls = [n for n in branch if n.op_type == "MatMul"]
    adds = [n for n in branch if _is_accumulation(n)]
    if len(matmuls) != 3 or len(adds) != 1:
        raise NoMatch(f"expert {e}: expected gate, up and down MatMuls and one scatter-add, "
                      f"found {len(matmuls)} MatMul(s) and {len(adds)} scatter-add(s)")
    down = [m for m in matmuls if producer(m.inputs[0], "Mul")]
    if len(down) != 1:
        raise NoMatch(f"expert {e}: no down projection of a gated product")
    down = down[0]
    product = producer(down.inputs[0], "Mul")
    gate = up = None
    for act, other in (product.inputs, product.inputs[::-1]):
        silu = producer(act, "Mul")
        if silu is None:
            continue
        for g, s in (silu.inputs, silu.inputs[::-1]):
            sig = producer(s, "Sigmoid")
            if sig is not None and sig.inputs[0] is g:
                gate, up = producer(g, "MatMul"), producer(other, "MatMul")
    if gate is None or up is None or {gate, up, down} != set(matmuls):
        raise NoMatch(f"expert {e}: activation is not silu(gate) * up")
    if gate.inputs[0] is not up.inputs[0]:
        raise NoMatch(f"expert {e}: gate and up projections read different tokens")
    scale = consumers(down.outputs[0])
    if len(scale) != 1 or scale[0].op_type != "Mul":
        raise NoMatch(f"expert {e}: the down projection is not scaled by a routing weight")
    wg, wu, wd = (_weight(m, f"expert {e}: {what}")
                  for m, what in ((gate, "gate"), (up, "up"), (down, "down")))
    if wg.shape != wu.shape or wd.shape != wg.shape[::-1]:
        raise NoMatch(f"expert {e}: weight shapes {wg.shape}, {wu.shape}, {wd.shape} disagree")
    # [in, out] as stored for MatMul -> PyTorch's [out, in].
    return wg.T, wu.T, wd.T, adds[0]


def _last_accumulation(adds: list[ir.Node]) -> ir.Node:
    """The end of the chain acc_e = acc_{e-1} + scatter_e, starting at zeros."""
    outputs = {a.outputs[0] for a in adds}
    starts, ends = 0, []
    for add in adds:
        acc = [v for v in add.inputs if not producer(v, "ScatterElements")]
        if len(acc) != 1:
            raise NoMatch(f"scatter-add {add.name!r} does not add to one accumulator")
        if acc[0] not in outputs:
            init = producer(acc[0], "ConstantOfShape")
            if init is None or np.any(_fill_value(init) != 0):
                raise NoMatch(f"scatter-add {add.name!r} does not start from zeros")
            starts += 1
        if not any(c in adds for c in add.outputs[0].consumers()):
            ends.append(add)
    if starts != 1 or len(ends) != 1:
        raise NoMatch("the expert outputs are not summed in one chain")
    return ends[0]


def _routing_normalized(nodes: set[ir.Node], topk: ir.Node) -> int:
    """1 when the top-k probabilities are divided by their sum, else 0."""
    sums = [n for n in nodes if n.op_type == "ReduceSum"]
    if not sums:
        if any(n.op_type == "Div" for n in nodes):
            raise NoMatch("unrecognised division of the routing weights")
        return 0
    values = topk.outputs[0]
    for rs in sums:
        axes = const_ints(rs.inputs[1]) if len(rs.inputs) > 1 else attr(rs, "axes")
        divs = [d for d in consumers(rs.outputs[0], "Div")
                if d.inputs[0] is values and d.inputs[1] is rs.outputs[0]]
        if (len(sums) != 1 or rs.inputs[0] is not values or list(axes or []) not in ([-1], [1])
                or attr(rs, "keepdims", 1) != 1 or len(divs) != 1):
            raise NoMatch("unrecognised renormalisation of the routing weights")
    return 1


def match(topk: ir.Node, where: str) -> MoEBlock:
    tokens, logits, w_router, k = _match_router(topk)
    num_experts = w_router.shape[1]
    selects = _match_selects(topk, num_experts)
    gates, ups, downs, adds = [], [], [], []
    for e in range(num_experts):
        wg, wu, wd, add = _match_expert(e, selects[e])
        gates.append(wg), ups.append(wu), downs.append(wd), adds.append(add)
    if gates[0].shape[1] != w_router.shape[0]:
        raise NoMatch("expert and router hidden sizes differ")
    output = _last_accumulation(adds).outputs[0]

    boundary = {tokens: 2, logits: 2}
    reshape = producer(tokens, "Reshape")
    if reshape is not None:  # the block reads [B, S, H]'s shape for its zeros
        boundary[reshape.inputs[0]] = 3
    expected = {"TopK": 1, "Softmax": 1, "OneHot": 1, "MatMul": 3 * num_experts,
                "Sigmoid": num_experts, "ScatterElements": num_experts}
    nodes, kept, ranks = block_nodes(output, boundary, BLOCK_OPS, expected)
    if tokens not in ranks or logits not in ranks:
        raise NoMatch("the block does not read the router's tokens and logits")
    return MoEBlock(where=where, tokens=tokens, logits=logits, input_ranks=ranks, output=output,
                    nodes=nodes, kept=kept, k=k, normalize=_routing_normalized(nodes, topk),
                    fc1=interleave(np.stack(gates), np.stack(ups)),
                    fc2=np.ascontiguousarray(np.stack(downs)))
