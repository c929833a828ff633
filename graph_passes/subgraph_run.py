"""Runs a piece of a graph on its own: the nodes that compute some values
from the graph inputs, as a small ONNX Runtime session. Passes use it to
find out what exporter arithmetic computes (rotary tables, attention
masks) instead of matching every way of writing it."""

from __future__ import annotations

import onnx
import onnx_ir as ir


def graph_slice(graph: ir.Graph, outputs: list[ir.Value]) -> tuple[list[ir.Node], set[ir.Value]] | None:
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


def slice_runner(model: ir.Model, nodes: list[ir.Node], inputs, outputs: list[ir.Value]):
    """run(feeds) of an ORT session of `nodes` alone: the graph `inputs` they
    read in (with their declared types), `outputs` out."""
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
        protos, "subgraph",
        [onnx.helper.make_tensor_value_info(v.name, int(v.dtype), None) for v in inputs],
        [onnx.helper.make_empty_tensor_value_info(v.name) for v in outputs], inits)
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(d, v)
                                                          for d, v in model.opset_imports.items()])
    proto.ir_version = model.ir_version
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return lambda feeds: sess.run(None, feeds)
