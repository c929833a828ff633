"""A sparse-MoE block written out the way optimum's TorchScript export writes
it with the expert loop unrolled (router MatMul -> Softmax -> TopK ->
[ReduceSum/Div] -> OneHot; per expert NonZero -> Gather -> SwiGLU MatMuls ->
routing-weight Mul -> ScatterElements + Add), built with onnx.helper so the
MoE fusion pass can be tested without torch; plus a float64 numpy reference
of the same block.

``mutate`` breaks the pattern in one place, for the partial-match tests:
"drop_expert" (no branch for the last expert), "relu" (one expert uses
Relu instead of SiLU), "weight_input" (one expert's up weight is a graph
input), "wrong_weight" (one expert takes the other top-k slot's routing
weight: structurally the same, numerically wrong), "leak" (the routing
indices are also a graph output).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MUTATIONS = ("drop_expert", "relu", "weight_input", "wrong_weight", "leak")
PREFIX = "/model/layers.0/mlp"


@dataclass
class BlockWeights:
    router: np.ndarray  # [H, E] as exported (MatMul layout)
    gate: np.ndarray  # [E, H, I]
    up: np.ndarray  # [E, H, I]
    down: np.ndarray  # [E, I, H]
    shared: tuple | None = None  # (gate [H, Is], up [H, Is], down [Is, H], sigmoid gate [H, 1])


def random_block_weights(rng, hidden, inter, experts, shared_inter=0) -> BlockWeights:
    def w(*shape, fan_in):
        return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

    shared = None
    if shared_inter:
        shared = (w(hidden, shared_inter, fan_in=hidden), w(hidden, shared_inter, fan_in=hidden),
                  w(shared_inter, hidden, fan_in=shared_inter), w(hidden, 1, fan_in=hidden))
    # router x4: well separated top-k choices
    return BlockWeights(w(hidden, experts, fan_in=hidden) * 4,
                        w(experts, hidden, inter, fan_in=hidden),
                        w(experts, hidden, inter, fan_in=hidden),
                        w(experts, inter, hidden, fan_in=inter),
                        shared)


class _Builder:
    def __init__(self):
        self.nodes, self.inits, self.extra_inputs, self.count = [], [], [], 0

    def op(self, op_type, inputs, n_out=1, **attrs):
        self.count += 1
        name = f"{PREFIX}/{op_type}_{self.count}"
        outs = [f"{name}_output_{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def const(self, arr, name=None):
        self.count += 1
        name = name or f"{PREFIX}/const_{self.count}"
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name


def build_unfused_block(weights: BlockWeights, k: int, normalize: bool,
                        mutate: str | None = None) -> onnx.ModelProto:
    """The block as a model: input ``hidden`` [B, S, H] -> ``output`` [B, S, H]."""
    hidden, experts = weights.router.shape
    b = _Builder()
    x2 = b.op("Reshape", ["hidden", b.const(np.array([-1, hidden], np.int64))])
    logits = b.op("MatMul", [x2, b.const(weights.router, "router_weight")])
    probs = b.op("Cast", [b.op("Softmax", [logits], axis=1)], to=TensorProto.FLOAT)
    vals, idx = b.op("TopK", [probs, b.const(np.array([k], np.int64))], n_out=2)
    rw = vals
    if normalize:
        rw = b.op("Div", [vals, b.op("ReduceSum", [vals, b.const(np.array([-1], np.int64))],
                                     keepdims=1)])
    rw_flat = b.op("Reshape", [b.op("Cast", [rw], to=TensorProto.FLOAT),
                               b.const(np.array([-1], np.int64))])
    onehot = b.op("OneHot", [idx, b.const(np.array([experts], np.int64)),
                             b.const(np.array([0, 1], np.int64))], axis=-1)
    mask = b.op("Transpose", [onehot], perm=[2, 1, 0])
    acc = b.op("ConstantOfShape", [b.op("Shape", [x2])],
               value=numpy_helper.from_array(np.zeros(1, np.float32)))
    one = b.const(np.array([1], np.int64))
    for e in range(experts - 1 if mutate == "drop_expert" else experts):
        sel = b.op("Gather", [mask, b.const(np.array(e, np.int64))], axis=0)
        nz = b.op("Transpose", [b.op("NonZero", [b.op("Cast", [sel], to=TensorProto.BOOL)])],
                  perm=[1, 0])
        slot, row = b.op("Split", [nz, b.const(np.array([1, 1], np.int64))], n_out=2, axis=1)
        slot, row = b.op("Squeeze", [slot, one]), b.op("Squeeze", [row, one])
        xe = b.op("Gather", [x2, row], axis=0)
        up_name = f"experts.{e}.up"
        if mutate == "weight_input" and e == 1:
            b.extra_inputs.append(helper.make_tensor_value_info(up_name, TensorProto.FLOAT,
                                                                list(weights.up[e].shape)))
        else:
            b.const(weights.up[e], up_name)
        g = b.op("MatMul", [xe, b.const(weights.gate[e], f"experts.{e}.gate")])
        act = b.op("Relu", [g]) if (mutate == "relu" and e == 2) else \
            b.op("Mul", [g, b.op("Sigmoid", [g])])
        h = b.op("Mul", [act, b.op("MatMul", [xe, up_name])])
        y = b.op("MatMul", [h, b.const(weights.down[e], f"experts.{e}.down")])
        if mutate == "wrong_weight" and e == 0:
            # (k - 1) - slot, written with the ops the block already uses
            slot = b.op("Add", [b.op("Mul", [slot, b.const(np.array(-1, np.int64))]),
                                b.const(np.array(k - 1, np.int64))])
        flat = b.op("Add", [slot, b.op("Mul", [row, b.const(np.array(k, np.int64))])])
        wt = b.op("Unsqueeze", [b.op("Gather", [rw_flat, flat], axis=0), one])
        y = b.op("Mul", [y, wt])
        rows = b.op("Expand", [b.op("Unsqueeze", [row, one]), b.op("Shape", [y])])
        zeros = b.op("ConstantOfShape", [b.op("Shape", [acc])],
                     value=numpy_helper.from_array(np.zeros(1, np.float32)))
        acc = b.op("Add", [acc, b.op("ScatterElements", [zeros, rows, y], axis=0)])
    if weights.shared is not None:
        sg, su, sd, sgate = weights.shared
        g = b.op("MatMul", [x2, b.const(sg, "shared.gate")])
        h = b.op("Mul", [b.op("Mul", [g, b.op("Sigmoid", [g])]),
                         b.op("MatMul", [x2, b.const(su, "shared.up")])])
        s = b.op("MatMul", [h, b.const(sd, "shared.down")])
        gate = b.op("Sigmoid", [b.op("MatMul", [x2, b.const(sgate, "shared.expert_gate")])])
        acc = b.op("Add", [acc, b.op("Mul", [gate, s])])
    out = b.op("Reshape", [acc, b.op("Shape", ["hidden"])])
    b.nodes.append(helper.make_node("Identity", [out], ["output"], name="/model/out"))
    outputs = [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["B", "S", hidden])]
    if mutate == "leak":
        b.nodes.append(helper.make_node("Identity", [idx], ["topk_indices"], name="/model/leak"))
        outputs.append(helper.make_tensor_value_info("topk_indices", TensorProto.INT64, ["T", k]))
    graph = helper.make_graph(
        b.nodes, "unfused_moe",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["B", "S", hidden]),
         *b.extra_inputs], outputs, initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def reference_block(x: np.ndarray, weights: BlockWeights, k: int, normalize: bool,
                    logits_dtype=None) -> np.ndarray:
    """float64 numpy: softmax over all experts, top-k, optional renormalise,
    weighted SwiGLU experts, plus the gated shared expert. ``logits_dtype``:
    the router logits rounded to that type first, as a model whose MoE node
    takes them at a narrower type does (the dtype pass's bf16 / fp16 MoE), so
    near ties route the same way."""
    shape = x.shape
    x = x.reshape(-1, shape[-1]).astype(np.float64)
    logits = x @ weights.router.astype(np.float64)
    if logits_dtype is not None:
        logits = logits.astype(np.float32).astype(logits_dtype).astype(np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(probs, top, -1)
    if normalize:
        w /= w.sum(-1, keepdims=True)

    def swiglu(x, wg, wu, wd):
        g = x @ wg.astype(np.float64)
        return (g / (1 + np.exp(-g)) * (x @ wu.astype(np.float64))) @ wd.astype(np.float64)

    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(k):
            e = top[t, j]
            expert = swiglu(x[t:t + 1], weights.gate[e], weights.up[e], weights.down[e])
            out[t] += w[t, j] * expert[0]
    if weights.shared is not None:
        sg, su, sd, sgate = weights.shared
        gate = 1 / (1 + np.exp(-(x @ sgate.astype(np.float64))))
        out += gate * swiglu(x, sg, su, sd)
    return out.reshape(shape)
