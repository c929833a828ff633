"""hinamoe.export.convert: the dtype pass on an existing model folder. A
hina-export fp32 folder converted to bf16 holds the same graph and weights
as the direct bf16 export of that checkpoint, every other file copied; bad
input is an error. (A genai builder folder: test_genai.py.) And save_model,
which both use, on a model whose Constant values are external data."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import convert_model_to_external_data

from hinamoe.export import ExportError, save_model
from hinamoe.export.convert import convert, main


def initializers(path):
    m = onnx.load(str(path))
    return m, {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
def test_fp32_folder_to_bf16_equals_bf16_export(arch, tiny_export, tmp_path):
    src = tiny_export.fused(arch).model.parent
    want_model, want = initializers(tiny_export.fused(arch, "bf16").model)
    dst = tmp_path / "bf16"
    assert main([str(src), str(dst), "--dtype", "bf16", "--quiet"]) == 0
    got_model, got = initializers(dst / "model.onnx")
    assert [(n.op_type, n.name) for n in got_model.graph.node] == [(n.op_type, n.name) for n in want_model.graph.node]
    assert got.keys() == want.keys()
    moe_weights = {i for n in got_model.graph.node if n.op_type == "MoE" for i in n.input[2:8] if i}
    matmul_weights = {n.input[1] for n in got_model.graph.node if n.op_type == "MatMul" and n.input[1] in got}
    assert moe_weights
    for name, value in got.items():
        assert value.dtype == want[name].dtype, name
        np.testing.assert_array_equal(value, want[name], err_msg=name)
        if name in moe_weights:
            assert value.dtype.name == "bfloat16", name
    # The dense linears at bf16 (routers, where they are MatMuls, stay float32).
    assert "bfloat16" in {got[w].dtype.name for w in matmul_weights} <= {"bfloat16", "float32"}
    side = {f.name for f in src.iterdir() if f.is_file()} - {"model.onnx", "model.onnx_data"}
    for name in side - {"fusion_report.json"}:
        assert (dst / name).read_bytes() == (src / name).read_bytes(), name
    [dtype_pass] = json.loads((dst / "fusion_report.json").read_text())["passes"]
    n_moe = sum(n.op_type == "MoE" for n in got_model.graph.node)
    n_dense = sum(got[w].dtype.name == "bfloat16" for w in matmul_weights)
    assert dtype_pass["name"] == "dtype" and dtype_pass["matched"] == n_moe + n_dense and n_moe > 0


def test_errors(tiny_export, tmp_path):
    src = tiny_export.fused("qwen3_moe").model.parent
    with pytest.raises(ExportError, match="expected one of bf16, fp16"):
        convert(src, tmp_path / "x", "int4")
    with pytest.raises(ExportError, match="must not be the input folder"):
        convert(src, src)
    with pytest.raises(ExportError, match="no model.onnx"):
        convert(tmp_path, tmp_path / "x")
    plain = tmp_path / "plain"  # no MoE node, no MatMul with a weight
    plain.mkdir()
    f32 = onnx.TensorProto.FLOAT
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
                                   [onnx.helper.make_tensor_value_info("x", f32, [2])],
                                   [onnx.helper.make_tensor_value_info("y", f32, [2])])
    onnx.save(onnx.helper.make_model(graph), str(plain / "model.onnx"))
    with pytest.raises(ExportError, match="nothing converted"):
        convert(plain, tmp_path / "y")
    assert not (tmp_path / "y").exists()


def test_save_model_reads_external_constant_values(tmp_path, rng):
    """optimum's export of a model over 2 GB keeps some Constant values in its
    data file; written elsewhere they must still be there (ir.save moves only
    initializers to the new data file)."""
    import onnx_ir as ir
    import onnxruntime as ort

    c = rng.standard_normal((1, 64, 1)).astype(np.float32)
    w = rng.standard_normal((64, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(c, "c_value")),
         helper.make_node("Mul", ["x", "c"], ["xc"]), helper.make_node("MatMul", ["xc", "w"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64, 8])],
        initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    convert_model_to_external_data(model, location="model.onnx_data", size_threshold=0, convert_attribute=True)
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(model, str(src / "model.onnx"))
    x = rng.standard_normal((2, 64, 64)).astype(np.float32)
    want = (x * c) @ w

    out = save_model(ir.load(str(src / "model.onnx")), tmp_path / "out")
    (src / "model.onnx_data").unlink()  # the copy must not need the old file
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
