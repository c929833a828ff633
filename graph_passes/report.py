"""What the passes did: per pass, the sites it fused and the ones it left
unfused with the reason; per model, op counts before and after."""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import Any


@dataclasses.dataclass
class PassReport:
    name: str
    # One entry per fused site, e.g. {"layer": "model.layers.0.mlp",
    # "nodes_removed": 183, "nodes_added": 1, ...}.
    fused: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    # Sites that looked like the pattern but were left unfused:
    # {"where": ..., "reason": ...}. A partial match must land here, never
    # in a half-rewritten graph.
    skipped: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def matched(self) -> int:
        return len(self.fused)


def op_counts(graph_nodes) -> dict[str, int]:
    """Counts of 'domain::op_type' (domain omitted for ONNX ops)."""
    counts: collections.Counter[str] = collections.Counter()
    for node in graph_nodes:
        counts[f"{node.domain}::{node.op_type}" if node.domain else node.op_type] += 1
    return dict(sorted(counts.items()))


@dataclasses.dataclass
class FusionReport:
    passes: list[PassReport] = dataclasses.field(default_factory=list)
    ops_before: dict[str, int] = dataclasses.field(default_factory=dict)
    ops_after: dict[str, int] = dataclasses.field(default_factory=dict)
    layers: int = 0  # decoder layers (KV-cache inputs), 0 when unknown

    @property
    def nodes_before(self) -> int:
        return sum(self.ops_before.values())

    @property
    def nodes_after(self) -> int:
        return sum(self.ops_after.values())

    def per_layer(self, nodes: int) -> float | None:
        """Nodes per decoder layer, the model's own few outside layers included."""
        return nodes / self.layers if self.layers else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "layers": self.layers,
            "ops_before": self.ops_before,
            "ops_after": self.ops_after,
            "passes": [dataclasses.asdict(p) | {"matched": p.matched} for p in self.passes],
        }

    def to_json(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)

    def format_table(self) -> str:
        lines = [f"nodes: {self.nodes_before} -> {self.nodes_after}"]
        if self.layers:
            lines[0] += (f" ({self.layers} layers: {self.per_layer(self.nodes_before):.0f}"
                         f" -> {self.per_layer(self.nodes_after):.0f} per layer)")
        for p in self.passes:
            lines.append(f"{p.name}: {p.matched} fused, {len(p.skipped)} left unfused")
            for site in p.fused:
                detail = ", ".join(f"{k}={v}" for k, v in site.items() if k != "layer")
                lines.append(f"  fused    {site.get('layer', '?')}: {detail}")
            for site in p.skipped:
                lines.append(f"  unfused  {site.get('where', '?')}: {site.get('reason', '')}")
        return "\n".join(lines)
