"""A gpt-oss style MoE block (all experts in one batched MatMul, biases,
clamped SwiGLU, top-k logits -> softmax -> dense routing matrix) built with
onnx.helper, for fast tests of the MoE fusion's dense matcher without torch;
plus a float64 numpy reference.

``mutate``: "limit_mismatch" (up clamped to +-6, gate to 7: no single
swiglu_limit), "bias_input" (the down bias is a graph input).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MUTATIONS = ("limit_mismatch", "bias_input")
PREFIX = "/model/layers.0/mlp"
ALPHA, BETA, LIMIT = 1.702, 1.0, 7.0


@dataclass
class DenseWeights:
    router: np.ndarray  # [E, H] (Gemm transB=1)
    router_bias: np.ndarray  # [E]
    gate_up: np.ndarray  # [E, H, 2I], gate in even columns, up in odd ones
    gate_up_bias: np.ndarray  # [E, 2I]
    down: np.ndarray  # [E, I, H]
    down_bias: np.ndarray  # [E, H]


def random_dense_weights(rng, hidden, inter, experts) -> DenseWeights:
    def w(*shape, scale):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return DenseWeights(w(experts, hidden, scale=2 / np.sqrt(hidden)), w(experts, scale=0.5),
                        # large enough that the clamps at +-7 bite
                        w(experts, hidden, 2 * inter, scale=5 / np.sqrt(hidden)),
                        w(experts, 2 * inter, scale=0.5),
                        w(experts, inter, hidden, scale=1 / np.sqrt(inter)),
                        w(experts, hidden, scale=0.5))


def build_dense_block(weights: DenseWeights, k: int, mutate: str | None = None) -> onnx.ModelProto:
    """input ``hidden`` [B, S, H] -> ``output`` [B, S, H]."""
    experts, hidden = weights.router.shape
    nodes, inits, extra_inputs = [], [], []
    count = [0]

    def op(op_type, inputs, n_out=1, **attrs):
        count[0] += 1
        name = f"{PREFIX}/{op_type}_{count[0]}"
        outs = [f"{name}_output_{i}" for i in range(n_out)]
        nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(arr, name=None):
        count[0] += 1
        name = name or f"{PREFIX}/const_{count[0]}"
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def i64(*v):
        return const(np.array(v, np.int64))

    def f32(v):
        return const(np.array(v, np.float32))

    x2 = op("Reshape", ["hidden", i64(-1, hidden)])
    logits = op("Gemm", [x2, const(weights.router), const(weights.router_bias)], transB=1)
    vals, idx = op("TopK", [logits, i64(k)], n_out=2)
    probs = op("Softmax", [vals], axis=1)
    zeros = op("ConstantOfShape", [op("Shape", [logits])],
               value=numpy_helper.from_array(np.zeros(1, np.float32)))
    dense = op("ScatterElements", [zeros, idx, probs], axis=1)
    xt = op("Expand", [op("Unsqueeze", [x2, i64(0)]), i64(experts, 1, 1)])
    gu = op("Add", [op("MatMul", [xt, const(weights.gate_up)]),
                    const(weights.gate_up_bias[:, None, :])])
    big = 1 << 62
    g = op("Slice", [gu, i64(0), i64(big), i64(2), i64(2)])
    u = op("Slice", [gu, i64(1), i64(big), i64(2), i64(2)])
    g = op("Clip", [g, "", f32(LIMIT)])
    up_limit = 6.0 if mutate == "limit_mismatch" else LIMIT
    u = op("Clip", [u, f32(-up_limit), f32(up_limit)])
    glu = op("Mul", [g, op("Sigmoid", [op("Mul", [g, f32(ALPHA)])])])
    h = op("Mul", [op("Add", [u, f32(BETA)]), glu])
    down_bias = "down_bias"
    if mutate == "bias_input":
        extra_inputs.append(helper.make_tensor_value_info(down_bias, TensorProto.FLOAT,
                                                          [experts, 1, hidden]))
    else:
        const(weights.down_bias[:, None, :], down_bias)
    y = op("Add", [op("MatMul", [h, const(weights.down)]), down_bias])
    # [E, T, H] -> [E, B, S, H] and the routing matrix to [E, B, S, 1], with
    # shapes written as the exporter writes them.
    batch = op("Unsqueeze", [op("Gather", [op("Shape", ["hidden"]), const(np.array(0, np.int64))],
                            axis=0), i64(0)])
    y = op("Reshape", [y, op("Concat", [i64(experts), batch, i64(-1), i64(hidden)], axis=0)])
    rw = op("Reshape", [op("Transpose", [dense], perm=[1, 0]),
                        op("Concat", [i64(experts), batch, i64(-1)], axis=0)])
    rw = op("Unsqueeze", [rw, i64(3)])
    out = op("ReduceSum", [op("Mul", [y, rw]), i64(0)], keepdims=0)
    nodes.append(helper.make_node("Identity", [out], ["output"], name="/model/out"))
    io = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["B", "S", hidden])]
    graph = helper.make_graph(
        nodes, "dense_moe", io + extra_inputs,
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["B", "S", hidden])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def reference_dense_block(x: np.ndarray, weights: DenseWeights, k: int) -> np.ndarray:
    """float64: softmax over the top-k logits, clamped SwiGLU experts with biases."""
    shape = x.shape
    x = x.reshape(-1, shape[-1]).astype(np.float64)
    logits = x @ weights.router.T.astype(np.float64) + weights.router_bias
    top = np.argsort(-logits, axis=-1, kind="stable")[:, :k]
    w = np.exp(np.take_along_axis(logits, top, -1))
    w /= w.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(k):
            e = top[t, j]
            gu = x[t] @ weights.gate_up[e].astype(np.float64) + weights.gate_up_bias[e]
            g, u = np.minimum(gu[0::2], LIMIT), np.clip(gu[1::2], -LIMIT, LIMIT)
            h = g / (1 + np.exp(-ALPHA * g)) * (u + BETA)
            out[t] += w[t, j] * (h @ weights.down[e].astype(np.float64) + weights.down_bias[e])
    return out.reshape(shape)
