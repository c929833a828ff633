"""Helpers shared by the graph-pass tests: run passes on a ModelProto, count
ops, and prove from an ORT profile which EP ran each MoE node."""

from __future__ import annotations

import glob
import json
import os
from collections import Counter

import onnx
import onnx_ir as ir

UNFUSED_MOE_OPS = ("NonZero", "ScatterElements", "OneHot")


def as_bytes(model: onnx.ModelProto | ir.Model) -> bytes:
    if isinstance(model, ir.Model):
        model = ir.to_proto(model)
    return model.SerializeToString()


def op_counts(model: onnx.ModelProto | ir.Model) -> Counter:
    nodes = model.graph.node if isinstance(model, onnx.ModelProto) else model.graph
    return Counter(n.op_type for n in nodes)


def run_pass(apply, model: onnx.ModelProto, **options):
    """(rewritten ir.Model, PassReport) of one pass on a copy of `model`."""
    copy = ir.serde.deserialize_model(model)
    return copy, apply(copy, **options)


def node_providers(sess, run) -> dict[str, str]:
    """{node name: provider} of every node that ran during `run()`, from the
    ORT profile of `sess` (which must have profiling enabled)."""
    run()
    path = sess.end_profiling()
    try:
        with open(path) as f:
            events = json.load(f)
    finally:
        for p in glob.glob(path):
            os.remove(p)
    out = {}
    for ev in events:
        args = ev.get("args", {})
        if ev.get("cat") == "Node" and "provider" in args and ev["name"].endswith("_kernel_time"):
            out[ev["name"][: -len("_kernel_time")]] = args["provider"]
    return out


def moe_node_names(model: ir.Model) -> list[str]:
    return [n.name for n in model.graph if n.op_type == "MoE" and n.domain == "com.microsoft"]
