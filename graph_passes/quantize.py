"""quantize pass: ``--dtype int4|int8``, the model 4- or 8-bit end to end.

* Every com.microsoft::MoE node becomes com.microsoft::QMoE: fc1/fc2 weights
  symmetric, block-wise along K (``block_size``, 32 by default), scales
  ``[E, N, K / block_size]`` (QMoE's T2: float16 beside float32 tokens,
  halving their bytes to Q4_0's share, unless a scale falls outside
  float16's normal range; else the model's type), no zero points (default
  2**(bits-1)); layout in ``qmoe_quant``.
* Every other MatMul with a constant 2-D weight (attention projections,
  lm_head, shared experts) becomes MatMulNBits through ONNX Runtime's
  quantizer (``matmul_nbits``), same bits and block size. The routers stay
  float: they are a few KB, and rounding them moves tokens to other experts.

Routing: QMoE takes the top k of the logits and softmaxes over those k. That
is MoE's softmax over all experts, top-k and renormalise
(``normalize_routing_weights=1``: Mixtral, Qwen3-MoE, gpt-oss) exactly.
Without renormalising (Qwen2-MoE) the weights are the full softmax's; QMoE
then gets ``router_weights`` (input 14) = Softmax(logits): experts chosen on
the logits (the same top k), mixed with those probabilities.

ORT's CPU QMoE runs fc1 with interleaved SwiGLU (``swiglu_fusion=1``) or a
plain activation, without fc3; MoE nodes it could not run (fc3,
``swiglu_fusion`` 0/2, ``use_sparse_mixer``, ``swiglu_limit_after_activation``)
stay MoE, with the reason in the report. A block size that is not a power of
two >= 16, or an expert K (hidden or intermediate size) that it does not
divide, is an error (QuantizeError). Run it last, after the fusions.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from . import qmoe_quant
from .matmul_nbits import MatMulNBitsWriter, why_not as matmul_why_not
from .report import PassReport

NAME = "quantize"
MS_DOMAIN = "com.microsoft"
BITS = {"int4": 4, "int8": 8}
DEFAULT_BLOCK_SIZE = 32
FLOATS = (ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
# Attributes MoE and QMoE share; everything else on a MoE node stops the conversion.
SHARED_ATTRIBUTES = ("k", "activation_type", "swiglu_fusion", "activation_alpha",
                     "activation_beta", "swiglu_limit", "normalize_routing_weights")
# Expert weight elements quantised per numpy call (bounds the float64 temporaries).
CHUNK_ELEMENTS = 1 << 24
# Ops between a router MatMul and the MoE's router input.
PASS_THROUGH = ("Cast", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


class QuantizeError(ValueError):
    """An option or a model the quantize pass cannot honour; says why."""


def quant_bits(dtype: str | None) -> int | None:
    """4 or 8 for "int4"/"int8", None for every other dtype (not this pass's)."""
    return BITS.get(str(dtype).lower()) if dtype is not None else None


def check_block_size(block_size: int) -> None:
    if not isinstance(block_size, (int, np.integer)) or block_size < 16 or block_size & (block_size - 1):
        raise QuantizeError(f"block size {block_size!r}: expected a power of two >= 16 "
                            f"(16, 32, 64, 128, ...)")


def largest_block(*dims: int) -> int:
    """The largest power of two >= 16 dividing every dim, or 0."""
    block = 0
    size = 16
    while all(d % size == 0 for d in dims):
        block, size = size, size * 2
    return block


def check_expert_dims(block_size: int, hidden: int, inter: int, where: str) -> None:
    """QMoE quantises fc1 along hidden and fc2 along inter: both must be
    multiples of the block."""
    bad = [f"{name} {dim}" for name, dim in (("hidden size", hidden), ("intermediate size", inter))
           if dim % block_size]
    if bad:
        fit = largest_block(hidden, inter)
        hint = (f"--block-size {fit} divides both" if fit
                else "no power of two >= 16 divides both, so these experts cannot be QMoE")
        raise QuantizeError(f"{where}: expert {' and '.join(bad)} not a multiple of block size "
                            f"{block_size} (QMoE quantises whole blocks along K); {hint}")


def _attr(node: ir.Node, name: str, default=None):
    a = node.attributes.get(name)
    return default if a is None else a.value


def _layer(node: ir.Node) -> str:
    return node.name[: -len("/MoE")] if node.name.endswith("/MoE") else node.name


def _why_not_qmoe(node: ir.Node) -> str | None:
    if _attr(node, "use_sparse_mixer", 0):
        return "use_sparse_mixer=1: ORT's CPU QMoE does not run it"
    if _attr(node, "swiglu_limit_after_activation", 0):
        return "swiglu_limit_after_activation=1: ORT's CPU QMoE does not run it"
    unknown = sorted(set(node.attributes) - set(SHARED_ATTRIBUTES)
                     - {"use_sparse_mixer", "swiglu_limit_after_activation"})
    if unknown:
        return f"attributes {unknown} have no QMoE counterpart here"
    gated = _attr(node, "activation_type", "relu") in ("swiglu", "geglu")
    if len(node.inputs) > 6 and any(v is not None for v in node.inputs[6:8]):
        return "it has fc3 (separate up projection): ORT's CPU QMoE does not run fc3"
    if gated and _attr(node, "swiglu_fusion", 0) != 1:
        return (f"swiglu_fusion={_attr(node, 'swiglu_fusion', 0)}: ORT's CPU QMoE runs only "
                f"interleaved gate/up (swiglu_fusion=1)")
    for index in (2, 3, 4, 5):
        value = node.inputs[index] if index < len(node.inputs) else None
        if value is None:
            if index in (2, 4):
                return f"input {index} (an expert weight) is missing"
            continue
        if value.const_value is None or value.is_graph_input():
            return f"{value.name!r} is not an initializer"
        if value.const_value.dtype not in FLOATS:
            return f"{value.name!r} is {value.const_value.dtype.name}, not a float type"
    return None


def _quantise_weight(weight: np.ndarray, bits: int, block_size: int, scale_np):
    """qmoe_quant.quantize over [E, N, K] a few experts at a time, scales in
    `scale_np`; None when that is float16 and a scale lies outside its
    normal range (it would keep fewer than 11 significant bits, or overflow)."""
    e, n, k = weight.shape
    packed = np.empty((e, n, k * bits // 8), np.uint8)
    scales = np.empty((e, n, k // block_size), scale_np)
    step = max(1, CHUNK_ELEMENTS // max(1, n * k))
    for first in range(0, e, step):
        p, s = qmoe_quant.quantize(weight[first:first + step], bits, block_size, scale_np)
        if np.dtype(scale_np) == np.float16 and not _fits_float16(s):
            return None
        packed[first:first + step], scales[first:first + step] = p, s
    return packed, scales


def _fits_float16(scales: np.ndarray) -> bool:
    """Every scale finite and in float16's normal range."""
    a = np.abs(scales.astype(np.float32))
    return bool(np.all(np.isfinite(a)) and a.min(initial=1.0) >= F16_NORMAL_MIN)


def _initializer(graph: ir.Graph, name: str, arr: np.ndarray) -> ir.Value:
    value = ir.Value(name=name, const_value=ir.tensor(np.ascontiguousarray(arr)))
    value.shape, value.dtype = ir.Shape(arr.shape), ir.DataType.from_numpy(arr.dtype)
    graph.register_initializer(value)
    return value


def _router_weights(graph: ir.Graph, node: ir.Node, logits: ir.Value) -> ir.Value:
    """Softmax over all experts of the logits, ahead of `node`."""
    softmax = ir.node("Softmax", [logits], {"axis": -1}, name=f"{_layer(node)}/QMoE/router_softmax")
    out = softmax.outputs[0]
    out.name, out.dtype, out.shape = f"{softmax.name}_output_0", logits.dtype, logits.shape
    graph.insert_before(node, softmax)
    return out


def _to_qmoe(graph: ir.Graph, node: ir.Node, bits: int, block_size: int) -> dict:
    layer = _layer(node)
    prefix = layer.strip("/").replace("/", ".") + ".qmoe."
    fc1, fc2 = node.inputs[2], node.inputs[4]
    # The op's T: the tokens' type (the weights' when the graph does not say).
    token_type = node.inputs[0].dtype or fc1.const_value.dtype
    # T2, the scales' type, is free of T: float16 beside float32 tokens.
    token_np = ir.DataType(token_type).numpy()
    scale_np = np.float16 if np.dtype(token_np) == np.float32 else token_np
    weights = [_quantise_weight(v.const_value.numpy(), bits, block_size, scale_np) for v in (fc1, fc2)]
    if any(w is None for w in weights):  # a scale outside float16's normal range
        scale_np = token_np
        weights = [_quantise_weight(v.const_value.numpy(), bits, block_size, scale_np) for v in (fc1, fc2)]
    quantised = [(_initializer(graph, f"{prefix}{name}_experts_weights", packed),
                  _initializer(graph, f"{prefix}{name}_scales", scales))
                 for name, (packed, scales) in zip(("fc1", "fc2"), weights)]
    del weights
    (q1, s1), (q2, s2) = quantised
    fc1_bias = node.inputs[3] if len(node.inputs) > 3 else None
    fc2_bias = node.inputs[5] if len(node.inputs) > 5 else None
    attrs = {a: node.attributes[a].value for a in SHARED_ATTRIBUTES if a in node.attributes}
    attrs.update(expert_weight_bits=bits, block_size=block_size)
    inputs = [node.inputs[0], node.inputs[1], q1, s1, fc1_bias, q2, s2, fc2_bias]
    normalize = _attr(node, "normalize_routing_weights", 0)
    if normalize:
        routing = "top-k of the logits, softmax over the k (= MoE's renormalised routing)"
    else:
        # Input 14: choose on the logits, mix with the full softmax (= MoE's normalize=0).
        inputs += [None] * 6 + [_router_weights(graph, node, node.inputs[1])]
        routing = "router_weights = Softmax(logits), not renormalised (= MoE's normalize=0)"
    qmoe = ir.node("QMoE", inputs, attrs, domain=MS_DOMAIN, name=f"{layer}/QMoE")
    old_out, new_out = node.outputs[0], qmoe.outputs[0]
    new_out.dtype, new_out.shape = old_out.dtype or token_type, old_out.shape
    graph.insert_before(node, qmoe)
    old_out.replace_all_uses_with(new_out, replace_graph_outputs=True)
    name, old_out.name = old_out.name, f"{old_out.name}.replaced"
    new_out.name = name  # later nodes keep reading the name they read before
    graph.remove(node, safe=True)
    before = fc1.const_value.nbytes + fc2.const_value.nbytes
    after = sum(v.const_value.nbytes for v in (q1, s1, q2, s2))
    _drop_if_unused(graph, fc1, fc2)
    return {"layer": layer, "op": "QMoE", "bits": bits, "block_size": block_size,
            "experts": int(fc1.const_value.shape[0]), "scales": np.dtype(scale_np).name, "routing": routing,
            "weight_bytes_before": before, "weight_bytes_after": after}


# float16's smallest normal value.
F16_NORMAL_MIN = 6.104e-5


def _drop_if_unused(graph: ir.Graph, *values: ir.Value) -> None:
    """Frees float weights nothing reads any more now, not at the end of the
    pass: a large model's float experts need not all stay in memory."""
    for value in values:
        if not value.uses() and graph.initializers.get(value.name) is value:
            del graph.initializers[value.name]


def router_of(node: ir.Node) -> ir.Node | None:
    """The MatMul/Gemm that computes a (Q)MoE node's router logits."""
    value = node.inputs[1]
    while value is not None and value.producer() is not None:
        producer = value.producer()
        if producer.op_type in ("MatMul", "Gemm") and producer.domain == "":
            return producer
        if producer.op_type not in PASS_THROUGH or producer.domain != "":
            return None
        value = producer.inputs[0]
    return None


def _moe_nodes(graph: ir.Graph, op: str) -> list[ir.Node]:
    return [n for n in graph if n.op_type == op and n.domain == MS_DOMAIN]


def apply(model: ir.Model, *, dtype: str | None = None, block_size: int | None = None,
          accuracy_level: int | None = None, progress: bool = False, **_options) -> PassReport:
    """Quantises `model` in place for dtype "int4"/"int8" (else does nothing).
    accuracy_level (0-4; None: the attribute absent) goes on every QMoE and
    MatMulNBits node written: 4 lets the kernels quantise the tokens to int8
    per block, as llama.cpp does for its Q4_0 / Q8_0 dot products."""
    report = PassReport(NAME)
    bits = quant_bits(dtype)
    if bits is None:
        return report
    block_size = DEFAULT_BLOCK_SIZE if block_size is None else block_size
    check_block_size(block_size)
    graph = model.graph
    moes = []
    for node in _moe_nodes(graph, "MoE"):
        why = _why_not_qmoe(node)
        if why:
            report.skipped.append({"where": _layer(node), "reason": f"stays MoE: {why}"})
            continue
        _, _, hidden = node.inputs[2].const_value.shape
        inter = node.inputs[4].const_value.shape[2]
        check_expert_dims(block_size, hidden, inter, _layer(node))  # before anything changes
        moes.append(node)
    routers = {r for n in _moe_nodes(graph, "MoE") + _moe_nodes(graph, "QMoE")
               if (r := router_of(n)) is not None}
    matmuls = [n for n in graph if n.op_type == "MatMul" and n.domain == "" and n not in routers]
    todo = [("qmoe", n) for n in moes] + [("matmul", n) for n in matmuls]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc=f"quantising to {dtype}", unit="node", leave=False)
    writer = MatMulNBitsWriter(graph, bits, block_size)
    for kind, node in todo:
        if kind == "qmoe":
            report.fused.append(_to_qmoe(graph, node, bits, block_size))
        elif (why := matmul_why_not(node)) is None:
            weight = node.inputs[1]
            report.fused.append(writer.replace(node))
            _drop_if_unused(graph, weight)
        elif node.inputs[1] is not None and node.inputs[1].const_value is not None:
            # A MatMul on activations (rotary) is not a weight: not worth a line.
            report.skipped.append({"where": node.name, "reason": f"stays MatMul: {why}"})
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    for router in sorted(routers, key=lambda n: n.name or ""):
        report.skipped.append({"where": router.name, "reason": "router stays float: a few KB, and "
                               "rounding it would move tokens to other experts"})
    if accuracy_level is not None:
        if accuracy_level not in range(5):
            raise QuantizeError(f"accuracy_level {accuracy_level!r}: expected 0-4")
        for node in _moe_nodes(graph, "QMoE") + _moe_nodes(graph, "MatMulNBits"):
            node.attributes["accuracy_level"] = ir.AttrInt64("accuracy_level", accuracy_level)
    if report.fused:
        graph.opset_imports.setdefault(MS_DOMAIN, 1)
        import onnx_ir.passes.common as common_passes

        common_passes.RemoveUnusedNodesPass()(model)
    return report
