"""Applies the passes in order and collects the report."""

from __future__ import annotations

from typing import Callable

import onnx
import onnx_ir as ir

from . import dtype, gqa_fusion, matmul_packing, moe_fusion, quantize, rms_norm, static_shapes
from .report import FusionReport, PassReport, op_counts

# (name, apply) in the order they run. Fusion passes add their entry here.
PASSES: list[tuple[str, Callable[..., PassReport]]] = [
    (moe_fusion.NAME, moe_fusion.apply),
    (gqa_fusion.NAME, gqa_fusion.apply),
    (static_shapes.NAME, static_shapes.apply),
    (rms_norm.NAME, rms_norm.apply),
    (matmul_packing.NAME, matmul_packing.apply),
    (dtype.NAME, dtype.apply),
    (quantize.NAME, quantize.apply),
]


def run_passes(model: onnx.ModelProto | ir.Model, *, only: list[str] | None = None,
               **options) -> tuple[ir.Model, FusionReport]:
    """Runs every pass (or those named in `only`) on `model`.

    `options` go to every pass; each reads the ones it knows (e.g.
    dtype="bf16" for the dtype pass; dtype="int4", block_size=32 for the
    quantize pass) and ignores the rest. Returns the rewritten model and
    the report."""
    if isinstance(model, onnx.ModelProto):
        model = ir.serde.deserialize_model(model)
    layers = sum(1 for v in model.graph.inputs
                 if (v.name or "").startswith("past_key_values.") and (v.name or "").endswith(".key"))
    report = FusionReport(ops_before=op_counts(model.graph), layers=layers)
    for name, apply in PASSES:
        if only is not None and name not in only:
            continue
        report.passes.append(apply(model, **options))
    report.ops_after = op_counts(model.graph)
    return model, report
