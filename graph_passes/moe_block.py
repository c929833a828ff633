"""What a MoE matcher found in the graph: the block's inputs and output, the
nodes it spans, and the com.microsoft::MoE node (attributes, weights in
ORT's layout) that computes the same thing."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx_ir as ir


@dataclasses.dataclass
class MoEBlock:
    where: str
    tokens: ir.Value  # the MoE node's input: [T, H], or [B, S, H] when the block's output is
    logits: ir.Value  # router logits [T, E] (the router itself stays)
    input_ranks: dict[ir.Value, int]  # every value the block reads -> its rank
    output: ir.Value  # what the MoE node's output replaces (same shape as tokens)
    nodes: set[ir.Node]  # the block, from its inputs to its output
    kept: set[ir.Node]  # its shape arithmetic that other nodes still read
    k: int
    normalize: int  # normalize_routing_weights
    fc1: np.ndarray  # [E, 2I, H], gate and up rows interleaved (swiglu_fusion=1)
    fc2: np.ndarray  # [E, H, I]
    fc1_bias: np.ndarray | None = None  # [E, 2I], interleaved like fc1
    fc2_bias: np.ndarray | None = None  # [E, H]
    alpha: float = 1.0  # gate * sigmoid(alpha * gate)
    beta: float = 0.0  # ... * (up + beta)
    limit: float | None = None  # gate clamped above, up clamped to [-limit, limit]

    @property
    def num_experts(self) -> int:
        return self.fc1.shape[0]

    def attributes(self) -> dict:
        attrs = {"k": self.k, "activation_type": "swiglu", "swiglu_fusion": 1,
                 "activation_alpha": float(self.alpha), "activation_beta": float(self.beta),
                 "normalize_routing_weights": self.normalize}
        if self.limit is not None:
            attrs["swiglu_limit"] = float(self.limit)
        return attrs

    def weights(self) -> list[np.ndarray | None]:
        """MoE inputs 2..5: fc1, fc1 bias, fc2, fc2 bias."""
        return [self.fc1, self.fc1_bias, self.fc2, self.fc2_bias]


def interleave(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """[..., I, X] gate and up -> [..., 2I, X], row 2j gate j, row 2j+1 up j
    (swiglu_fusion=1)."""
    shape = list(gate.shape)
    shape[-2] *= 2
    out = np.empty(shape, dtype=gate.dtype)
    out[..., 0::2, :] = gate
    out[..., 1::2, :] = up
    return out


# Ops whose presence outside the fused node would mean the unfused routing
# or expert computation is still alive.
HEAVY_OPS = frozenset({"TopK", "Softmax", "OneHot", "NonZero", "ScatterElements", "MatMul",
                       "Sigmoid", "Tile"})


def block_nodes(output: ir.Value, boundary: set[ir.Value], allowed_ops: set[str],
                expected: dict[str, int]):
    """(nodes, kept, input ranks) of the block computing `output` from
    `boundary` values (a dict value -> rank) and constants.

    Raises NoMatch for an op outside `allowed_ops`, op counts other than
    `expected`, or routing/expert values that other nodes read (fusing would
    keep them alive). Shape arithmetic other nodes read is returned as
    `kept`: it stays in the graph."""
    from .graph_walk import NoMatch, bounded_ancestors

    nodes = bounded_ancestors([output], set(boundary))
    counts: dict[str, int] = {}
    for node in nodes:
        if node.domain != "" or node.op_type not in allowed_ops:
            raise NoMatch(f"unexpected {node.op_type} {node.name!r} inside the block")
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    for op, n in expected.items():
        if counts.get(op, 0) != n:
            raise NoMatch(f"{counts.get(op, 0)} {op} node(s) in the block, expected {n}")
    shared = [out for node in nodes for out in node.outputs if out is not output
              and (out.is_graph_output() or any(c not in nodes for c in out.consumers()))]
    kept = bounded_ancestors(shared, set(boundary)) if shared else set()
    heavy = sorted({n.op_type for n in kept} & HEAVY_OPS)
    if heavy:
        used = sorted(v.name or "?" for v in shared)[:3]
        raise NoMatch(f"values of the block ({', '.join(used)}) are used outside it, "
                      f"which would keep its {', '.join(heavy)} node(s)")
    read = {v for n in nodes for v in n.inputs if v in boundary}
    return nodes, kept, {v: boundary[v] for v in read}
