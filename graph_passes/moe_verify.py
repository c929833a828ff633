"""Numeric check of a candidate MoE fusion: the block as exported (cut out of
the model) and the single com.microsoft::MoE node that would replace it run
on ONNX Runtime's CPU EP on the same random tokens, and must agree.

The structural match already pins down the router, the expert branches and
the accumulation; this check is the last guard against a wrong graph (a
token gathered from the wrong row, a routing weight taken from the wrong
column) that structure alone would not see."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

# Sizes of the token batches tried: a single token (decode) and a batch
# where some experts receive no token at all.
TOKEN_COUNTS = (1, 7)
# Protobuf cannot hold more than 2 GB; larger blocks are not checked.
MAX_CHECK_BYTES = 1 << 30


def _session(model_bytes: bytes):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def _block_model(graph: ir.Graph, inputs: list[ir.Value], output: ir.Value,
                 opset_version: int, ir_version: int) -> bytes:
    sub = ir.convenience.extract(graph, inputs=inputs, outputs=[output])
    sub.opset_imports.setdefault("", opset_version)
    model = ir.Model(sub, ir_version=ir_version)
    return ir.to_proto(model).SerializeToString()


def _moe_model(attrs: dict, fc1: np.ndarray, fc2: np.ndarray, hidden: int, experts: int,
               opset_version: int) -> bytes:
    elem = helper.np_dtype_to_tensor_dtype(fc1.dtype)
    node = helper.make_node("MoE", ["x", "logits", "fc1", "", "fc2"], ["y"],
                            domain="com.microsoft", **attrs)
    graph = helper.make_graph(
        [node], "moe_check",
        [helper.make_tensor_value_info("x", elem, ["T", hidden]),
         helper.make_tensor_value_info("logits", elem, ["T", experts])],
        [helper.make_tensor_value_info("y", elem, ["T", hidden])],
        initializer=[numpy_helper.from_array(fc1, "fc1"), numpy_helper.from_array(fc2, "fc2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset_version),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = min(model.ir_version, 10)
    return model.SerializeToString()


def _feed_shape(value: ir.Value, tokens: int, width: int, rank: int = 2) -> tuple[int, ...]:
    """[T, width], or [1, T, width] for a rank-3 value (the [B, S, H]
    hidden states the block reads its shapes from). `rank` when the graph
    does not say."""
    rank = len(value.shape) if value.shape is not None else rank
    return (1,) * (rank - 2) + (tokens, width)


def checkable(fc1: np.ndarray, fc2: np.ndarray) -> bool:
    """Whether the block is small enough to be cut out and run."""
    return fc1.nbytes + fc2.nbytes <= MAX_CHECK_BYTES


def check_fusion(graph: ir.Graph, *, tokens: ir.Value, logits: ir.Value,
                 extra_inputs: list[ir.Value], output: ir.Value, attrs: dict,
                 fc1: np.ndarray, fc2: np.ndarray, opset_version: int,
                 ir_version: int) -> str | None:
    """None when the block and the MoE node agree, else what differs.

    `tokens` [T, H] and `logits` [T, E] feed both; `extra_inputs` are other
    values the block reads (the [B, S, H] hidden states its shapes come
    from), fed with the same tokens reshaped."""
    experts, _, hidden = fc1.shape
    np_dtype = fc1.dtype
    inputs = [tokens, logits, *extra_inputs]
    # The exported graph often leaves these values untyped; the cut-out
    # model needs types on its inputs and output.
    for value in [*inputs, output]:
        if value.type is None:
            value.type = ir.TensorType(ir.DataType.from_numpy(np_dtype))
    try:
        return _compare(graph, tokens, logits, extra_inputs, output, attrs, fc1, fc2,
                        opset_version, ir_version)
    except Exception as exc:  # noqa: BLE001 - any failure means "not proven equal"
        return f"could not check the fusion numerically: {type(exc).__name__}: {exc}"


def _compare(graph, tokens, logits, extra_inputs, output, attrs, fc1, fc2,
             opset_version, ir_version) -> str | None:
    experts, _, hidden = fc1.shape
    np_dtype = fc1.dtype
    inputs = [tokens, logits, *extra_inputs]
    block = _session(_block_model(graph, inputs, output, opset_version, ir_version))
    fused = _session(_moe_model(attrs, fc1, fc2, hidden, experts, opset_version))
    rng = np.random.default_rng(0)
    for t in TOKEN_COUNTS:
        x = rng.standard_normal((t, hidden)).astype(np_dtype)
        lg = (rng.standard_normal((t, experts)) * 2).astype(np_dtype)
        feeds = {tokens.name: x.reshape(_feed_shape(tokens, t, hidden)),
                 logits.name: lg.reshape(_feed_shape(logits, t, experts))}
        for value in extra_inputs:
            feeds[value.name] = x.reshape(_feed_shape(value, t, hidden, rank=3))
        want = block.run(None, feeds)[0].reshape(t, hidden).astype(np.float64)
        got = fused.run(None, {"x": x, "logits": lg})[0].astype(np.float64)
        tol = (1e-4 if np_dtype == np.float32 else 2e-2) * (np.abs(want).max() + 1e-3)
        err = float(np.abs(got - want).max())
        if not err <= tol:
            return (f"the fused MoE node differs from the exported block by {err:.3g} "
                    f"(tolerance {tol:.3g}) on {t} random token(s)")
    return None
