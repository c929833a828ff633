"""References for quantised models (``hina-export --dtype int4|int8``), written
from the ops' definitions:

* ``matmul_nbits_weight``: MatMulNBits' B in float64 ``[K, N]``: B_q
  ``[N, K_blocks, block/pack]`` bytes (even element in the low nibble), one
  scale per (column n, block), symmetric zero point 2**(bits-1), the padding
  past K dropped;
* ``qmoe_weights``: a QMoE node's experts dequantised in float64
  (``qmoe_quant.dequantize``);
* ``qmoe_reference``: QMoE's output in float64. QMoE picks the top k of the
  logits and softmaxes over those k, which is ``moe_reference``'s softmax,
  top-k and renormalise; with ``router_weights`` (input 14, here always the
  Softmax of the logits) the experts are still the top k of the logits,
  mixed with router_weights (renormalised when normalize_routing_weights=1);
  ``qmoe_reference_int8_activations`` also rounds the expert inputs to int8
  per block, as ORT's CPU EP does for block-wise 8-bit experts by default;
* ``matmul_nbits_reference``: a MatMulNBits node's Y in float64 from the
  codes, scales and zero points a builder drew (before packing), with the
  tokens rounded to int8 (accuracy_level 4) or both operands to bf16 (the
  tile kernel) where asked;
* ``dequantised_twin``: the same model with every QMoE turned back into a
  float MoE and every MatMulNBits into a MatMul on the dequantised weights:
  what the quantised model must compute, run by other kernels.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir

from hinamoe.graph_passes import qmoe_quant

from support.moe_reference import gated_activate, moe_reference, route

MS = "com.microsoft"


def _attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def _const(node: ir.Node, index: int):
    value = node.inputs[index] if index < len(node.inputs) else None
    return None if value is None else value.const_value.numpy()


def matmul_nbits_weight(node: ir.Node) -> np.ndarray:
    """float64 [K, N] of a MatMulNBits node (no zero-point input)."""
    assert len(node.inputs) == 3 or all(v is None for v in node.inputs[3:]), "zero points"
    k, n = _attr(node, "K"), _attr(node, "N")
    bits, block = _attr(node, "bits", 4), _attr(node, "block_size")
    packed = _const(node, 1).reshape(n, -1)  # [N, K_blocks * block * bits / 8]
    scales = _const(node, 2).reshape(n, -1)  # [N, K_blocks]
    w = qmoe_quant.dequantize(packed, scales, bits, block)  # [N, K_blocks * block]
    return w[:, :k].T


def qmoe_weights(node: ir.Node) -> dict:
    """fc1 [E, N1, H], fc2 [E, H, I] (float64) and the biases of a QMoE node."""
    bits, block = _attr(node, "expert_weight_bits", 4), _attr(node, "block_size", 0)
    assert all(v is None for v in node.inputs[8:14]), "fc3 / zero points are not produced here"
    return {"fc1": qmoe_quant.dequantize(_const(node, 2), _const(node, 3), bits, block),
            "fc2": qmoe_quant.dequantize(_const(node, 5), _const(node, 6), bits, block),
            "fc1_bias": _const(node, 4), "fc2_bias": _const(node, 7)}


def _moe_attributes(node: ir.Node) -> dict:
    return {"k": _attr(node, "k", 1), "activation_type": _attr(node, "activation_type", "relu"),
            "swiglu_fusion": _attr(node, "swiglu_fusion", 0),
            "activation_alpha": _attr(node, "activation_alpha"),
            "activation_beta": _attr(node, "activation_beta"),
            "swiglu_limit": _attr(node, "swiglu_limit")}


def _router_weights_is_softmax(node: ir.Node) -> bool:
    """Whether input 14 is Softmax over the experts of input 1 (what the pass feeds)."""
    rw = node.inputs[14] if len(node.inputs) > 14 else None
    if rw is None:
        return False
    producer = rw.producer()
    assert producer is not None and producer.op_type == "Softmax", "router_weights: expected Softmax"
    assert producer.inputs[0] is node.inputs[1], "router_weights: Softmax of another tensor"
    assert _attr(producer, "axis", -1) in (-1, 1), "router_weights: Softmax over another axis"
    return True


def qmoe_reference(x: np.ndarray, logits: np.ndarray, node: ir.Node) -> np.ndarray:
    """float64 output of QMoE `node` (inside its graph) on tokens `x` and router
    logits `logits`."""
    # Without router_weights: top-k of the logits, softmax over the k, which is
    # the full softmax, top-k and renormalise. With router_weights = Softmax of
    # the logits: the same experts, mixed with the full softmax's weights.
    normalize = (_attr(node, "normalize_routing_weights", 0)
                 if _router_weights_is_softmax(node) else 1)
    return moe_reference(x, logits, **qmoe_weights(node), **_moe_attributes(node),
                         normalize_routing_weights=normalize)


def int8_rounded(x: np.ndarray, block_size: int, margins: list | None = None) -> np.ndarray:
    """Activations as MLAS' int8 kernels see them: per block of `block_size`
    along the last axis, scale = max|x| / 127, values rounded to that grid.
    ``margins`` gets the smallest distance (in codes) of a value from a
    rounding boundary: below ~1e-4 a float32 kernel may round it the other way."""
    blocks = np.asarray(x, np.float64).reshape(*np.shape(x)[:-1], -1, block_size)
    scale = np.abs(blocks).max(axis=-1, keepdims=True) / 127
    scale = np.where(scale > 0, scale, 1.0)
    if margins is not None:
        v = blocks / scale
        margins.append(float(np.abs(np.abs(v - np.floor(v)) - 0.5).min()))
    return (np.rint(blocks / scale) * scale).reshape(np.shape(x))


def qmoe_reference_int8_activations(x: np.ndarray, logits: np.ndarray, node: ir.Node,
                                    margins: list | None = None) -> np.ndarray:
    """qmoe_reference with the tokens (fc1's input) and the SwiGLU output
    (fc2's input) rounded by int8_rounded: ORT's CPU QMoE on block-wise
    int8 experts by default. Renormalised routing, interleaved SwiGLU only.
    ``margins`` collects int8_rounded's distances from rounding boundaries."""
    assert _attr(node, "activation_type") == "swiglu" and _attr(node, "swiglu_fusion") == 1
    assert not _router_weights_is_softmax(node)
    w, a = qmoe_weights(node), _moe_attributes(node)
    block = _attr(node, "block_size")
    xs = np.asarray(x, np.float64).reshape(-1, np.shape(x)[-1])
    top, weights = route(logits, a["k"], 1)
    out = np.zeros_like(xs)
    for t in range(xs.shape[0]):
        for j in range(a["k"]):
            e = top[t, j]
            h = int8_rounded(xs[t], block, margins) @ w["fc1"][e].T
            if w["fc1_bias"] is not None:
                h = h + w["fc1_bias"][e]
            act = gated_activate(h[0::2], h[1::2], "swiglu",
                                 1.0 if a["activation_alpha"] is None else a["activation_alpha"],
                                 0.0 if a["activation_beta"] is None else a["activation_beta"],
                                 a["swiglu_limit"], 0)
            y = int8_rounded(act, block, margins) @ w["fc2"][e].T
            if w["fc2_bias"] is not None:
                y = y + w["fc2_bias"][e]
            out[t] += weights[t, j] * y
    return out.reshape(np.shape(x))


def matmul_nbits_reference(a: np.ndarray, parts: dict, int8_tokens: bool = False, bf16: bool = False) -> np.ndarray:
    """float64 Y = A @ W^T (+ bias), W[n, k] = (code - zp) * scale of k's block.
    int8_tokens: A rounded to int8 per block (accuracy_level 4); bf16: W (as
    float32 computes it) and A rounded to bf16, as the tile kernel takes them."""
    bs, bits = parts["block_size"], parts["bits"]
    codes = parts["codes"]
    K = codes.shape[1]
    blk = np.arange(K) // bs
    zp = parts["zero_points"]
    zp = np.full(parts["scales"].shape, 2 ** (bits - 1)) if zp is None else zp
    scales = parts["scales"].astype(np.float64)
    x = np.asarray(a, np.float64)
    if bf16:
        w32 = (codes.astype(np.float32) - zp[:, blk].astype(np.float32)) * scales[:, blk].astype(np.float32)
        w = w32.astype(ml_dtypes.bfloat16).astype(np.float64)
        x = np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    else:
        w = (codes - zp[:, blk]) * scales[:, blk]
    if int8_tokens and not bf16 and K > bs:
        pad = (-K) % bs
        xp = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])
        x = int8_rounded(xp, bs)[..., :K]
    y = x @ w.T
    if parts["bias"] is not None:
        y = y + parts["bias"].astype(np.float64)
    return y


def _init(graph: ir.Graph, name: str, arr: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(np.ascontiguousarray(arr)))
    value.shape, value.dtype = ir.Shape(arr.shape), ir.DataType.from_numpy(arr.dtype)
    graph.register_initializer(value)
    return value


def _swap(graph: ir.Graph, old: ir.Node, new: ir.Node) -> None:
    old_out, new_out = old.outputs[0], new.outputs[0]
    new_out.dtype, new_out.shape = old_out.dtype, old_out.shape
    graph.insert_before(old, new)
    old_out.replace_all_uses_with(new_out, replace_graph_outputs=True)
    name, old_out.name = old_out.name, f"{old_out.name}.quantised"
    new_out.name = name
    graph.remove(old, safe=True)


def dequantised_twin(model: ir.Model | onnx.ModelProto | str) -> onnx.ModelProto:
    """The float32 model that computes what `model`'s QMoE / MatMulNBits
    nodes do: MoE and MatMul on their dequantised weights."""
    if isinstance(model, str):
        model = ir.load(model)
    elif isinstance(model, onnx.ModelProto):
        model = ir.serde.deserialize_model(model)
    graph = model.graph
    for node in [n for n in graph if n.domain == MS and n.op_type in ("QMoE", "MatMulNBits")]:
        name = node.name
        if node.op_type == "MatMulNBits":
            b = _init(graph, f"{name}.dequantised", matmul_nbits_weight(node).astype(np.float32))
            _swap(graph, node, ir.node("MatMul", [node.inputs[0], b], name=f"{name}.twin"))
            continue
        w = qmoe_weights(node)
        normalize = (_attr(node, "normalize_routing_weights", 0)
                     if _router_weights_is_softmax(node) else 1)
        inputs = [node.inputs[0], node.inputs[1]]
        for key in ("fc1", "fc1_bias", "fc2", "fc2_bias"):
            inputs.append(None if w[key] is None else
                          _init(graph, f"{name}.{key}.dequantised", w[key].astype(np.float32)))
        attrs = {k: v for k, v in _moe_attributes(node).items() if v is not None}
        moe = ir.node("MoE", inputs, {**attrs, "normalize_routing_weights": normalize},
                      domain=MS, name=f"{name}.twin")
        _swap(graph, node, moe)
    import onnx_ir.passes.common as common_passes

    common_passes.RemoveUnusedNodesPass()(model)
    return ir.to_proto(model)
