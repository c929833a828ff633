"""One MatMul with a constant weight -> com.microsoft::MatMulNBits, through
ONNX Runtime's own quantizer (``onnxruntime.quantization.matmul_nbits_quantizer``).

The quantizer works on whole ModelProtos; serialising a multi-GB model for it
would hold every weight twice, so each MatMul is handed to it alone, as a
one-node model (its weight and nothing else), and the nodes and initializers
it writes are moved into our graph. Symmetric, block-wise along K; K that is
not a multiple of the block is padded by the quantizer (MatMulNBits allows it).
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper, numpy_helper

MS_DOMAIN = "com.microsoft"
# What the quantizer and MatMulNBits take for A and B.
FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16)


def why_not(node: ir.Node) -> str | None:
    """Why this MatMul cannot become MatMulNBits, or None."""
    b = node.inputs[1]
    if b is None or b.const_value is None or b.is_graph_input():
        return "its weight is not an initializer"
    tensor = b.const_value
    if tensor.dtype not in FLOATS:
        return f"its weight is {tensor.dtype.name}, not float32/float16"
    if len(tensor.shape) != 2:
        return f"its weight has rank {len(tensor.shape)}, not 2"
    return None


def _quantizer_class():
    """MatMulNBitsQuantizer, imported without the root logging setup its module
    does on import (logging.basicConfig at INFO would print a line per node,
    and every other library's INFO lines too)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    from onnxruntime.quantization import matmul_nbits_quantizer

    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    logging.getLogger(matmul_nbits_quantizer.__name__).setLevel(logging.WARNING)
    return matmul_nbits_quantizer.MatMulNBitsQuantizer


def _one_node_model(weight: np.ndarray, bits: int, block_size: int) -> onnx.ModelProto:
    """ORT's quantizer run on MatMul(A, weight) alone; returns its output model."""
    MatMulNBitsQuantizer = _quantizer_class()
    k, n = weight.shape
    elem = helper.np_dtype_to_tensor_dtype(weight.dtype)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["Y"], name="matmul")], "one_matmul",
        [helper.make_tensor_value_info("A", elem, ["M", k])],
        [helper.make_tensor_value_info("Y", elem, ["M", n])],
        initializer=[numpy_helper.from_array(weight, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=block_size, is_symmetric=True,
                                     op_types_to_quantize=("MatMul",))
    quantizer.process()
    return quantizer.model.model


class MatMulNBitsWriter:
    """Replaces MatMuls of one graph by MatMulNBits; a weight that several
    MatMuls read is quantised once and shared."""

    def __init__(self, graph: ir.Graph, bits: int, block_size: int):
        self.graph, self.bits, self.block_size = graph, bits, block_size
        self._done: dict[ir.Value, tuple[list[ir.Value], dict]] = {}

    def _quantised(self, weight: ir.Value) -> tuple[list[ir.Value], dict]:
        """(initializers B_q, scales[, zero points], MatMulNBits attributes) of `weight`."""
        if weight in self._done:
            return self._done[weight]
        out = _one_node_model(weight.const_value.numpy(), self.bits, self.block_size)
        [qnode] = [n for n in out.graph.node if n.op_type == "MatMulNBits"]
        if len(out.graph.node) != 1:
            raise RuntimeError(f"onnxruntime's quantizer wrote {len(out.graph.node)} nodes for "
                               f"one 2-D MatMul; expected a single MatMulNBits")
        inits = {t.name: t for t in out.graph.initializer}
        values = []
        for i, name in enumerate(qnode.input[1:], start=1):
            tensor = ir.serde.deserialize_tensor(inits[name])
            suffix = ("q", "scales", "zero_points")[i - 1]
            value = ir.Value(name=f"{weight.name}.{self.bits}bit.{suffix}",
                             const_value=ir.tensor(tensor.numpy()))
            value.shape, value.dtype = ir.Shape(tensor.shape), tensor.dtype
            self.graph.register_initializer(value)
            values.append(value)
        attrs = {a.name: helper.get_attribute_value(a) for a in qnode.attribute}
        self._done[weight] = (values, attrs)
        return values, attrs

    def replace(self, node: ir.Node) -> dict:
        """Swaps `node` (a MatMul that why_not accepts) for MatMulNBits; returns
        its report entry."""
        weight = node.inputs[1]
        shared = weight in self._done
        values, attrs = self._quantised(weight)
        new = ir.node("MatMulNBits", [node.inputs[0], *values], attrs, domain=MS_DOMAIN,
                      name=f"{node.name or weight.name}_Q{self.bits}")
        old_out, new_out = node.outputs[0], new.outputs[0]
        new_out.dtype = old_out.dtype or node.inputs[0].dtype or weight.const_value.dtype
        new_out.shape = old_out.shape
        self.graph.insert_before(node, new)
        old_out.replace_all_uses_with(new_out, replace_graph_outputs=True)
        name, old_out.name = old_out.name, f"{old_out.name}.replaced"
        new_out.name = name  # later nodes keep reading the name they read before
        self.graph.remove(node, safe=True)
        before = 0 if shared else weight.const_value.nbytes
        after = 0 if shared else sum(v.const_value.nbytes for v in values)
        return {"layer": node.name or weight.name, "op": "MatMulNBits", "bits": self.bits,
                "block_size": self.block_size, "K": int(attrs["K"]), "N": int(attrs["N"]),
                "weight_bytes_before": before, "weight_bytes_after": after,
                **({"shares_weight_of": weight.name} if shared else {})}
