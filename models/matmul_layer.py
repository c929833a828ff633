"""Build single ONNX ``MatMul`` nodes at 16-bit float widths (a dense linear
whose weight is stored as float16 or bfloat16), for tests and benchmarks.

    model, w = build_matmul_model(K=2048, N=4096, dtype="bfloat16", rng=rng)
    # A: [batch, seq, K] in dtype; w: the weight [K, N] as stored (for references)
"""

from __future__ import annotations

import numpy as np
from onnx import helper

from .moe_layer import _tensor_from_array, np_dtype, onnx_dtype


def build_matmul_model(K: int, N: int, dtype: str, rng: np.random.Generator, *, a_rank: int = 3,
                       opset: int = 21, weight_input: bool = False, name: str = "mm"):
    """(ModelProto, w): Y = MatMul(A, W) with W [K, N] an initializer (or,
    with ``weight_input``, a graph input named "W"); A has ``a_rank``
    dimensions, the last K."""
    dt = np_dtype(dtype)
    w = (rng.standard_normal((K, N)) / np.sqrt(max(K, 1))).astype(dt)
    lead = ["batch", "seq", "extra"][:a_rank - 1] if a_rank <= 3 else [f"d{i}" for i in range(a_rank - 1)]
    inputs = [helper.make_tensor_value_info("A", onnx_dtype(dtype), lead + [K])]
    inits = []
    if weight_input:
        inputs.append(helper.make_tensor_value_info("W", onnx_dtype(dtype), [K, N]))
    else:
        inits.append(_tensor_from_array("W", w, onnx_dtype(dtype)))
    graph = helper.make_graph([helper.make_node("MatMul", ["A", "W"], ["Y"], name=name)], name, inputs,
                              [helper.make_tensor_value_info("Y", onnx_dtype(dtype), lead + [N])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model, w
