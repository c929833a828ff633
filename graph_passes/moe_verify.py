"""Numeric check of a candidate MoE fusion: the block as exported (cut out of
the model) and the single com.microsoft::MoE node that would replace it run
on ONNX Runtime's CPU EP on the same random tokens, and must agree.

The structural match already pins down the router, the expert branches and
the accumulation; this check is the last guard against a wrong graph (a
token gathered from the wrong row, a routing weight taken from the wrong
column) that structure alone would not see."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnx import helper, numpy_helper

from .moe_block import MoEBlock

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
    # Weights in the export's external data file are read in here: a model
    # handed to ORT as bytes finds no file next to it.
    for value in sub.initializers.values():
        if isinstance(value.const_value, ir.ExternalTensor):
            value.const_value = ir.tensor(value.const_value.numpy(), name=value.const_value.name)
    model = ir.Model(sub, ir_version=ir_version)
    return ir.to_proto(model).SerializeToString()


def _moe_model(block: MoEBlock, opset_version: int) -> bytes:
    experts, _, hidden = block.fc1.shape
    elem = helper.np_dtype_to_tensor_dtype(block.fc1.dtype)
    names = ["fc1", "fc1_bias", "fc2", "fc2_bias"]
    inits = [numpy_helper.from_array(np.ascontiguousarray(w), n)
             for n, w in zip(names, block.weights()) if w is not None]
    present = {i.name for i in inits}
    node = helper.make_node("MoE", ["x", "logits", *[n if n in present else "" for n in names]],
                            ["y"], domain="com.microsoft", **block.attributes())
    x_shape = ["T", hidden] if block.input_ranks[block.tokens] == 2 else [1, "T", hidden]
    graph = helper.make_graph(
        [node], "moe_check",
        [helper.make_tensor_value_info("x", elem, x_shape),
         helper.make_tensor_value_info("logits", elem, ["T", experts])],
        [helper.make_tensor_value_info("y", elem, x_shape)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset_version),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = min(model.ir_version, 10)
    return model.SerializeToString()


def checkable(block: MoEBlock) -> bool:
    """Whether the block is small enough to be cut out and run."""
    return sum(w.nbytes for w in block.weights() if w is not None) <= MAX_CHECK_BYTES


def check_fusion(graph: ir.Graph, block: MoEBlock, *, opset_version: int,
                 ir_version: int) -> str | None:
    """None when the block and its MoE node agree on random tokens, else
    what differs. Every value the block reads is fed the same tokens in its
    rank ([T, H] or [1, T, H]); the router logits are random."""
    np_dtype = block.fc1.dtype
    # The exported graph often leaves these values untyped; the cut-out
    # model needs types on its inputs and output.
    for value in [*block.input_ranks, block.output]:
        if value.type is None:
            value.type = ir.TensorType(ir.DataType.from_numpy(np_dtype))
    try:
        return _compare(graph, block, opset_version, ir_version)
    except Exception as exc:  # noqa: BLE001 - any failure means "not proven equal"
        return f"could not check the fusion numerically: {type(exc).__name__}: {exc}"


def _compare(graph, block: MoEBlock, opset_version, ir_version) -> str | None:
    experts, _, hidden = block.fc1.shape
    np_dtype = block.fc1.dtype
    inputs = list(block.input_ranks)
    cut = _session(_block_model(graph, inputs, block.output, opset_version, ir_version))
    fused = _session(_moe_model(block, opset_version))
    rng = np.random.default_rng(0)
    # Random tokens, then a batch in which every expert is some token's first
    # choice and some token's second: random logits alone can leave an
    # expert's branch unexercised (7 tokens miss one of 8 experts ~1 in 10).
    for t in (*TOKEN_COUNTS, 2 * experts):
        x = rng.standard_normal((t, hidden)).astype(np_dtype)
        lg = rng.standard_normal((t, experts)) * 2
        if t == 2 * experts:
            rows = np.arange(t)
            lg[rows, rows % experts] += 16
            lg[rows, (rows + 1 + rows // experts) % experts] += 8
        lg = lg.astype(np_dtype)
        feeds = {v.name: x.reshape((1,) * (rank - 2) + (t, hidden))
                 for v, rank in block.input_ranks.items()}
        feeds[block.logits.name] = lg
        want = cut.run(None, feeds)[0].reshape(t, hidden).astype(np.float64)
        x_fused = feeds[block.tokens.name]
        got = fused.run(None, {"x": x_fused, "logits": lg})[0].reshape(t, hidden)
        tol = (1e-4 if np_dtype == np.float32 else 2e-2) * (np.abs(want).max() + 1e-3)
        err = float(np.abs(got.astype(np.float64) - want).max())
        if not err <= tol:
            return (f"the fused MoE node differs from the exported block by {err:.3g} "
                    f"(tolerance {tol:.3g}) on {t} random token(s)")
    return None
