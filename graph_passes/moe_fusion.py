"""MoE fusion: each exported MoE block becomes one com.microsoft::MoE node fed
by the router logits, with the expert weights stacked in ORT's layout
(fc1 [E, 2I, H] with gate and up rows interleaved, swiglu_fusion=1; fc2
[E, H, I]) so that the stock CPU EP runs it too.

Every TopK is a candidate block. The matchers (one module per export
pattern) describe what they found as a MoEBlock or say why it is not the
pattern:

* moe_match_unrolled: Mixtral, Qwen2-MoE, Qwen3-MoE (expert loop unrolled
  over all experts by the export patcher);
* moe_match_dense: gpt-oss (all experts as one batched MatMul, biases,
  clamped SwiGLU).

A block that only partly matches (an expert branch missing, another
activation, weights that are not constants, routing values needed outside
the block) is left unfused and reported with the reasons. A block that
matches is also run against its MoE node on the CPU EP (moe_verify) before
it is replaced: never a wrong graph.
"""

from __future__ import annotations

import re

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from . import moe_match_dense, moe_match_unrolled
from .graph_walk import NoMatch, OtherPattern
from .moe_block import MoEBlock
from .moe_verify import check_fusion, checkable
from .report import PassReport

NAME = "moe-fusion"
MS_DOMAIN = "com.microsoft"
MATCHERS = (("unrolled", moe_match_unrolled.match), ("dense", moe_match_dense.match))


def _block_name(topk: ir.Node) -> str:
    name = topk.name or ""
    where = name.rsplit("/", 1)[0] if "/" in name else f"TopK {name or '?'}"
    return where[: -len("/router")] if where.endswith("/router") else where


def _match(topk: ir.Node, where: str) -> tuple[MoEBlock | None, str]:
    """The first matcher's block, or None and why not: the reasons of the
    matchers that recognised their pattern, else all of them."""
    reasons, near = [], []
    for name, match in MATCHERS:
        try:
            return match(topk, where), ""
        except NoMatch as why:
            reasons.append(f"{name} pattern: {why}")
            if not isinstance(why, OtherPattern):
                near.append(str(why))
    return None, "; ".join(near or reasons)


def _safe_name(where: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", ".", where).strip(".") or "moe"


def _initializer(graph: ir.Graph, name: str, arr: np.ndarray) -> ir.Value:
    arr = np.ascontiguousarray(arr)
    value = ir.Value(name=name, const_value=ir.tensor(arr))
    value.shape, value.dtype = ir.Shape(arr.shape), ir.DataType.from_numpy(arr.dtype)
    graph.register_initializer(value)
    return value


def _replace(model: ir.Model, block: MoEBlock) -> ir.Node:
    graph = model.graph
    prefix = _safe_name(block.where) + ".moe."
    names = ("fc1_experts_weights", "fc1_experts_bias", "fc2_experts_weights", "fc2_experts_bias")
    weights = [None if arr is None else _initializer(graph, prefix + name, arr)
               for name, arr in zip(names, block.weights())]
    moe_dtype = weights[0].dtype
    router_probs = block.logits
    last = block.output.producer()
    if router_probs.dtype is not None and router_probs.dtype != moe_dtype:
        cast = ir.node("Cast", [router_probs], {"to": moe_dtype},
                       name=f"{block.where}/MoE/router_cast")
        graph.insert_after(last, cast)
        router_probs, last = cast.outputs[0], cast
    moe = ir.node("MoE", [block.tokens, router_probs, *weights], block.attributes(),
                  domain=MS_DOMAIN, name=f"{block.where}/MoE")
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
        where = _block_name(topk)
        block, why = _match(topk, where)
        if block is None:
            report.skipped.append({"where": where, "reason": why})
            continue
        verified = moe_verify and checkable(block)
        if verified:
            mismatch = check_fusion(model.graph, block, opset_version=opset,
                                    ir_version=model.ir_version)
            if mismatch:
                report.skipped.append({"where": where, "reason": mismatch})
                continue
        _replace(model, block)
        report.fused.append({
            "layer": where, "experts": block.num_experts, "k": block.k,
            "normalize_routing_weights": block.normalize,
            "hidden": block.fc1.shape[2], "inter": block.fc2.shape[2],
            "biases": block.fc1_bias is not None, "swiglu_limit": block.limit,
            "nodes_removed": len(block.nodes - block.kept), "nodes_added": 1,
            "verified": verified})
    if report.fused:
        model.graph.opset_imports.setdefault(MS_DOMAIN, 1)
        # The experts' [in, out] weights and the constants only the blocks used.
        common_passes.RemoveUnusedNodesPass()(model)
    return report
