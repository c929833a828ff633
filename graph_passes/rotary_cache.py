"""The cos/sin caches of an exported rotary embedding, for
``com.microsoft::RotaryEmbedding``.

An export computes cos/sin per token from position_ids (inv_freq x
position, then Cos/Sin, YaRN's scaling included) on every call, then
rotates q and k with six elementwise nodes each. RotaryEmbedding does the
rotation in one node from caches [positions, D/2] indexed by position_ids.
The caches are the export's own subgraph run once by ONNX Runtime for
positions 0..P-1, so each entry has the bits the export computes for that
position; the subgraph is checked to depend on position_ids alone and
elementwise (a batch of random positions gives the cache rows), and for
the "half" form that both halves of cos/sin are equal (rotate_half with
emb = cat(freqs, freqs)). Anything else: None, and the caller keeps the
elementwise rotary.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir

POSITIONS_INPUT = "position_ids"


def _slice(graph: ir.Graph, outputs: list[ir.Value]) -> tuple[list[ir.Node], set[ir.Value]] | None:
    """Nodes computing `outputs` and the graph inputs they read."""
    graph_inputs = set(graph.inputs)
    nodes: set[ir.Node] = set()
    inputs: set[ir.Value] = set()
    work = list(outputs)
    while work:
        value = work.pop()
        if value is None or value.const_value is not None:
            continue
        if value in graph_inputs:
            inputs.add(value)
            continue
        node = value.producer()
        if node is None:
            return None
        if node not in nodes:
            nodes.add(node)
            work.extend(node.inputs)
    order = {node: i for i, node in enumerate(graph)}
    return sorted(nodes, key=order.__getitem__), inputs


def _runner(model: ir.Model, nodes: list[ir.Node], outputs: list[ir.Value]):
    """An ORT session of `nodes` alone: position_ids in, `outputs` out."""
    import onnxruntime as ort

    # Tensors are copied in memory: the model's external data file is not
    # where a model built from bytes would look for it.
    inits, seen = [], set()
    for node in nodes:
        for value in node.inputs:
            if value is not None and value.const_value is not None and value.name not in seen:
                seen.add(value.name)
                inits.append(onnx.numpy_helper.from_array(value.const_value.numpy(), value.name))
    protos = []
    for node in nodes:
        proto = ir.serde.serialize_node(node)
        for attr in proto.attribute:
            if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_location == onnx.TensorProto.EXTERNAL:
                attr.t.CopyFrom(onnx.numpy_helper.from_array(node.attributes[attr.name].value.numpy(), attr.t.name))
        protos.append(proto)
    graph = onnx.helper.make_graph(
        protos, "rotary_cos_sin",
        [onnx.helper.make_tensor_value_info(POSITIONS_INPUT, onnx.TensorProto.INT64, ["b", "s"])],
        [onnx.helper.make_tensor_value_info(v.name, onnx.TensorProto.FLOAT, None) for v in outputs], inits)
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(d, v)
                                                          for d, v in model.opset_imports.items()])
    proto.ir_version = model.ir_version
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return lambda pos: sess.run(None, {POSITIONS_INPUT: pos})


def caches(model: ir.Model, cos: ir.Value, sin: ir.Value, form: str, head_dim: int, positions: int):
    """(position_ids value, cos cache, sin cache [positions, head_dim / 2]
    float32) for the exported cos/sin, or None where they are not a pure
    per-position function."""
    if positions < 1:
        return None
    found = _slice(model.graph, [cos, sin])
    if found is None:
        return None
    nodes, inputs = found
    if len(inputs) != 1 or next(iter(inputs)).name != POSITIONS_INPUT:
        return None
    (position_ids,) = inputs
    try:
        run = _runner(model, nodes, [cos, sin])
        c, s = run(np.arange(positions, dtype=np.int64)[None, :])
        if c.dtype != np.float32 or s.dtype != np.float32:
            return None
        half = head_dim // 2
        if form == "half":
            if c.shape != (1, positions, head_dim) or s.shape != c.shape:
                return None
            if not (np.array_equal(c[..., :half], c[..., half:]) and np.array_equal(s[..., :half], s[..., half:])):
                return None
            c, s = c[..., :half], s[..., :half]
        elif c.shape != (1, positions, half) or s.shape != c.shape:
            return None
        cos_cache, sin_cache = np.ascontiguousarray(c[0]), np.ascontiguousarray(s[0])
        # Per position and elementwise: a batch of scattered positions reads the rows.
        probe = np.random.default_rng(0).integers(0, positions, size=(2, 5), dtype=np.int64)
        pc, ps = run(probe)
        if form == "half":
            pc, ps = pc[..., :half], ps[..., :half]
        if not (np.array_equal(pc, cos_cache[probe]) and np.array_equal(ps, sin_cache[probe])):
            return None
    except Exception:  # noqa: BLE001 - a subgraph ORT cannot run alone is simply not cached
        return None
    return position_ids, cos_cache, sin_cache
