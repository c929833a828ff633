"""MoE fusion: each exported sparse-MoE block becomes one com.microsoft::MoE.

What the exporter writes per layer (the expert loop unrolled over all E
experts), and what this pass requires of it:

    logits = MatMul(x[T,H], W_router[H,E])            (stays: feeds the MoE)
    probs  = Softmax(logits, axis=-1)  (Casts allowed around it)
    w, idx = TopK(probs, k)
    w      = w / ReduceSum(w, -1, keepdims)            (optional: renormalise)
    mask   = Transpose(OneHot(idx, E), (2,1,0))
    per expert e, from Gather(mask, e):
        tokens routed to e -> g = MatMul(xe, Wg), u = MatMul(xe, Wu)
        y = MatMul(g * Sigmoid(g) * u, Wd) * (routing weight of e)
        acc = acc + ScatterElements(zeros, token rows, y)
    out = the last acc                                 (replaced by the MoE)

The MoE node gets the router logits and the expert weights stacked in
ORT's layout: fc1 [E, 2I, H] with gate and up rows interleaved
(swiglu_fusion=1; swiglu with alpha 1, beta 0 and no limit is exactly
silu(g) * u), fc2 [E, H, I]. TorchScript stores Linear weights as [in, out]
for MatMul; the pass transposes them back to PyTorch's [out, in].

Anything else feeding the layer's output (Qwen2-MoE's gated shared expert)
is left as it is and still adds to the MoE output. A block that only partly
matches (an expert branch missing, another activation, weights that are not
constants, a value needed outside the block) is left unfused and reported
with the reason; a block that matches is also checked numerically against
the MoE node on the CPU EP before it is replaced (option moe_verify=False
skips that check).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from .graph_walk import (NoMatch, attr, bounded_ancestors, const_array, const_ints, consumers,
                         forward_until, only_consumer, producer, through_casts)
from .moe_verify import check_fusion, checkable
from .report import PassReport

NAME = "moe-fusion"
MS_DOMAIN = "com.microsoft"

# Ops an exported MoE block is made of. Anything else inside the block (a
# different activation, a bias, a clamp) means it is not the pattern above.
BLOCK_OPS = {
    "Add", "Cast", "Concat", "ConstantOfShape", "Div", "Expand", "Flatten", "Gather",
    "MatMul", "Mul", "NonZero", "OneHot", "ReduceSum", "Reshape", "ScatterElements",
    "Shape", "Sigmoid", "Slice", "Softmax", "Split", "Squeeze", "TopK", "Transpose",
    "Unsqueeze",
}
# Nodes one expert branch may hold; more means the walk left the block.
BRANCH_NODE_LIMIT = 200


@dataclasses.dataclass
class ExpertWeights:
    gate: np.ndarray  # [I, H]
    up: np.ndarray  # [I, H]
    down: np.ndarray  # [H, I]


@dataclasses.dataclass
class MoEBlock:
    where: str
    tokens: ir.Value  # [T, H], the router's input
    logits: ir.Value  # [T, E]
    extra_inputs: list[ir.Value]  # other block inputs ([B, S, H] for shapes)
    output: ir.Value  # sum of the routed experts, [T, H]
    nodes: set[ir.Node]  # the block, from its inputs to its output
    kept: set[ir.Node]  # its shape arithmetic that other nodes still read
    k: int
    normalize: int
    experts: list[ExpertWeights]

    def stacked_weights(self) -> tuple[np.ndarray, np.ndarray]:
        gate = np.stack([e.gate for e in self.experts])
        up = np.stack([e.up for e in self.experts])
        num, inter, hidden = gate.shape
        fc1 = np.empty((num, 2 * inter, hidden), dtype=gate.dtype)
        fc1[:, 0::2] = gate  # swiglu_fusion=1: row 2j is gate j, row 2j+1 is up j
        fc1[:, 1::2] = up
        fc2 = np.ascontiguousarray(np.stack([e.down for e in self.experts]))
        return fc1, fc2

    def attributes(self) -> dict:
        return {"k": self.k, "activation_type": "swiglu", "swiglu_fusion": 1,
                "activation_alpha": 1.0, "activation_beta": 0.0,
                "normalize_routing_weights": self.normalize}


def _block_name(topk: ir.Node) -> str:
    name = topk.name or ""
    return name.rsplit("/", 1)[0] if "/" in name else f"TopK {name or '?'}"


def _is_accumulation(node: ir.Node) -> bool:
    return node.op_type == "Add" and any(producer(v, "ScatterElements") for v in node.inputs)


# ------------------------------------------------------------ router


def _match_router(topk: ir.Node):
    """(tokens, logits, W_router, k) from the TopK upwards."""
    softmax = producer(through_casts(topk.inputs[0]), "Softmax")
    if softmax is None:
        raise NoMatch("TopK does not select from a Softmax over the router logits")
    if attr(softmax, "axis", -1) not in (-1, 1):
        raise NoMatch(f"Softmax over axis {attr(softmax, 'axis')}, not the experts")
    logits = through_casts(softmax.inputs[0])
    router = producer(logits, "MatMul")
    tokens = router.inputs[0] if router is not None else None
    if tokens is not None and tokens.shape is not None and len(tokens.shape) != 2:
        # The MoE op takes router logits as [T, E] only.
        raise NoMatch(f"the router reads rank-{len(tokens.shape)} tokens, not [T, H]")
    w_router = const_array(router.inputs[1]) if router is not None else None
    if w_router is None or w_router.ndim != 2:
        raise NoMatch("the router logits are not a MatMul with a constant [H, E] weight")
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


# ------------------------------------------------------------ experts


def _weight(matmul: ir.Node, what: str) -> np.ndarray:
    w = const_array(matmul.inputs[1])
    if w is None or w.ndim != 2:
        raise NoMatch(f"{what} weight is not a constant matrix")
    return w


def _match_expert(e: int, select: ir.Node):
    """(ExpertWeights, the accumulation Add) of expert e's branch."""
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
    weights = ExpertWeights(np.ascontiguousarray(wg.T), np.ascontiguousarray(wu.T),
                            np.ascontiguousarray(wd.T))
    return weights, adds[0]


def _last_accumulation(adds: list[ir.Node]) -> ir.Node:
    """The end of the chain acc_e = acc_{e-1} + scatter_e, starting at zeros."""
    outputs = {a.outputs[0]: a for a in adds}
    starts, ends = 0, []
    for add in adds:
        acc = [v for v in add.inputs if not producer(v, "ScatterElements")]
        if len(acc) != 1:
            raise NoMatch(f"scatter-add {add.name!r} does not add to one accumulator")
        if acc[0] not in outputs:
            init = producer(acc[0], "ConstantOfShape")
            fill = const_array_attr(init) if init is not None else None
            if fill is None or np.any(fill != 0):
                raise NoMatch(f"scatter-add {add.name!r} does not start from zeros")
            starts += 1
        if not any(c in adds for c in add.outputs[0].consumers()):
            ends.append(add)
    if starts != 1 or len(ends) != 1:
        raise NoMatch("the expert outputs are not summed in one chain")
    return ends[0]


def const_array_attr(node: ir.Node) -> np.ndarray:
    """ConstantOfShape's fill value (zero when the attribute is absent)."""
    value = node.attributes.get("value")
    return np.zeros(1, np.float32) if value is None else value.value.numpy()


# ------------------------------------------------------------ block


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


def match_block(topk: ir.Node) -> MoEBlock:
    where = _block_name(topk)
    tokens, logits, w_router, k = _match_router(topk)
    num_experts = w_router.shape[1]
    selects = _match_selects(topk, num_experts)
    experts, adds = [], []
    for e in range(num_experts):
        weights, add = _match_expert(e, selects[e])
        experts.append(weights)
        adds.append(add)
    if experts[0].gate.shape[1] != w_router.shape[0]:
        raise NoMatch("expert and router hidden sizes differ")
    output = _last_accumulation(adds).outputs[0]

    boundary = {tokens, logits}
    reshape = producer(tokens, "Reshape")
    if reshape is not None:  # the block reads [B, S, H]'s shape for its zeros
        boundary.add(reshape.inputs[0])
    nodes = bounded_ancestors([output], boundary)
    read = {v for n in nodes for v in n.inputs if v in boundary}
    if tokens not in read or logits not in read:
        raise NoMatch("the block does not read the router's tokens and logits")
    counts: dict[str, int] = {}
    for node in nodes:
        if node.domain != "" or node.op_type not in BLOCK_OPS:
            raise NoMatch(f"unexpected {node.op_type} {node.name!r} inside the block")
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    expected = {"TopK": 1, "Softmax": 1, "OneHot": 1, "MatMul": 3 * num_experts,
                "Sigmoid": num_experts, "ScatterElements": num_experts}
    for op, n in expected.items():
        if counts.get(op, 0) != n:
            raise NoMatch(f"{counts.get(op, 0)} {op} node(s) in the block, expected {n}")
    # Shape arithmetic on [B, S, H] is shared with the reshapes around the
    # block and stays; routing or expert values needed elsewhere would keep
    # the unfused machinery alive.
    shared = [out for node in nodes for out in node.outputs if out is not output
              and (out.is_graph_output() or any(c not in nodes for c in out.consumers()))]
    kept = bounded_ancestors(shared, boundary) if shared else set()
    heavy = sorted({n.op_type for n in kept} & {"TopK", "Softmax", "OneHot", "NonZero",
                                                   "ScatterElements", "MatMul", "Sigmoid"})
    if heavy:
        used = sorted(v.name or "?" for v in shared)[:3]
        raise NoMatch(f"values of the block ({', '.join(used)}) are used outside it, "
                      f"which would keep its {', '.join(heavy)} node(s)")
    return MoEBlock(where=where, tokens=tokens, logits=logits,
                    extra_inputs=sorted(read - {tokens, logits}, key=lambda v: v.name or ""),
                    output=output, nodes=nodes, kept=kept, k=k,
                    normalize=_routing_normalized(nodes, topk), experts=experts)


# ------------------------------------------------------------ rewrite


def _safe_name(where: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", ".", where).strip(".") or "moe"


def _replace(model: ir.Model, block: MoEBlock, fc1: np.ndarray, fc2: np.ndarray) -> ir.Node:
    graph = model.graph
    prefix = _safe_name(block.where)
    weights = []
    for name, arr in (("fc1_experts_weights", fc1), ("fc2_experts_weights", fc2)):
        value = ir.Value(name=f"{prefix}.moe.{name}", const_value=ir.tensor(arr))
        value.shape, value.dtype = ir.Shape(arr.shape), ir.DataType.from_numpy(arr.dtype)
        graph.register_initializer(value)
        weights.append(value)
    router_probs = block.logits
    last = block.output.producer()
    moe_dtype = weights[0].dtype
    if router_probs.dtype is not None and router_probs.dtype != moe_dtype:
        cast = ir.node("Cast", [router_probs], {"to": moe_dtype}, name=f"{block.where}/MoE/router_cast")
        graph.insert_after(last, cast)
        router_probs, last = cast.outputs[0], cast
    moe = ir.node("MoE", [block.tokens, router_probs, weights[0], None, weights[1]],
                  block.attributes(), domain=MS_DOMAIN, name=f"{block.where}/MoE")
    out = moe.outputs[0]
    out.name = f"{block.where}/MoE_output_0"
    out.dtype, out.shape = block.output.dtype or moe_dtype, block.output.shape
    graph.insert_after(last, moe)
    block.output.replace_all_uses_with(out, replace_graph_outputs=True)
    graph.remove(list(block.nodes - block.kept), safe=True)
    return moe


def apply(model: ir.Model, *, moe_verify: bool = True, **_options) -> PassReport:
    """Fuses every MoE block of `model` in place. moe_verify=False skips the
    numeric check of each candidate against the CPU EP (blocks whose expert
    weights exceed moe_verify.MAX_CHECK_BYTES are not checked either; the
    report says `verified` per layer)."""
    report = PassReport(NAME)
    opset = model.graph.opset_imports.get("", 18)
    for topk in [n for n in model.graph if n.op_type == "TopK" and n.domain == ""]:
        try:
            block = match_block(topk)
        except NoMatch as why:
            report.skipped.append({"where": _block_name(topk), "reason": str(why)})
            continue
        fc1, fc2 = block.stacked_weights()
        verified = moe_verify and checkable(fc1, fc2)
        if verified:
            mismatch = check_fusion(model.graph, tokens=block.tokens, logits=block.logits,
                                    extra_inputs=block.extra_inputs, output=block.output,
                                    attrs=block.attributes(), fc1=fc1, fc2=fc2,
                                    opset_version=opset, ir_version=model.ir_version)
            if mismatch:
                report.skipped.append({"where": block.where, "reason": mismatch})
                continue
        _replace(model, block, fc1, fc2)
        report.fused.append({
            "layer": block.where, "experts": len(block.experts), "k": block.k,
            "normalize_routing_weights": block.normalize,
            "hidden": fc1.shape[2], "inter": fc2.shape[2],
            "nodes_removed": len(block.nodes - block.kept), "nodes_added": 1, "verified": verified})
    if report.fused:
        model.graph.opset_imports.setdefault(MS_DOMAIN, 1)
        model.opset_imports.setdefault(MS_DOMAIN, 1)
        # The experts' [in, out] weights and the constants only the blocks used.
        common_passes.RemoveUnusedNodesPass()(model)
    return report
