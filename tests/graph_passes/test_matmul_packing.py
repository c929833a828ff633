"""MatMul packing pass (graph_passes/matmul_packing.py).

* On real optimum exports of tiny random MoE checkpoints after the other
  fusions: each layer's q, k and v projections are one MatMul and a Split
  (gpt-oss's biases packed too), the routers are left alone, and the model
  computes what it did within float32 rounding on the CPU EP and on
  HinaMoE (inputs whose routing is a near-tie are redrawn).
* Quantised to int4, each layer has one MatMulNBits for q, k and v, and
  the routers stay float MatMuls.
"""

from __future__ import annotations

import onnx_ir as ir
import pytest

from hinamoe.graph_passes import matmul_packing

from support.fusion_checks import assert_same_model, moe_routers, pass_pair, session_maker

ARCHS = ["qwen3_moe", "mixtral", "qwen2_moe", "gpt_oss"]
BEFORE = ["moe-fusion", "gqa", "shapes", "rms-norm"]
DECODE_STEPS = 3
FP32_REL = 1e-4  # of the largest |logit|: another GEMM shape may sum in another order


def _pair(path):
    return pass_pair(path, BEFORE, matmul_packing.NAME, rotary_positions=64)


def _layers(model) -> int:
    return sum(1 for v in model.graph.inputs if v.name.endswith(".key"))


@pytest.mark.parametrize("arch", ARCHS)
def test_qkv_become_one_matmul(arch, tiny_export):
    before, after, report = _pair(tiny_export(arch).model)
    layers = _layers(after)
    qkv = [site for site in report.fused if "q_proj" in site["packed"][0]]
    assert len(qkv) == layers
    # Qwen2-MoE's shared expert: gate, up and its sigmoid gate read the same tokens.
    assert len(report.fused) == layers * (2 if arch == "qwen2_moe" else 1)
    for site in qkv:
        assert [name.split("/")[-2] for name in site["packed"]] == ["q_proj", "k_proj", "v_proj"], site
    routers = moe_routers(ir.to_proto(after))
    for node in after.graph:
        if node.op_type == "MatMul" and node.outputs[0].name in routers:
            assert node.inputs[0].producer() is None or node.inputs[0].producer().op_type != "Split"
    # One router MatMul per layer, left alone (gpt-oss's is a Gemm: never packed).
    assert len(report.skipped) == (0 if arch == "gpt_oss" else layers)
    count = lambda m, op: sum(1 for n in m.graph if n.op_type == op)  # noqa: E731
    assert count(after, "MatMul") <= count(before, "MatMul") - 2 * layers


@pytest.mark.parametrize("ep", ["CPU", "HinaMoE"])
@pytest.mark.parametrize("arch", ARCHS)
def test_same_model_within_rounding(arch, ep, tiny_export, rng):
    before, after, _ = _pair(tiny_export(arch).model)
    assert_same_model(before, after, session_maker(ep), rng, DECODE_STEPS, FP32_REL)


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
def test_int4_export_quantises_the_packed_projections(arch, tiny_export):
    """hina-export --dtype int4: per layer one MatMulNBits for q, k and v
    and one for o (plus the LM head), the routers still float MatMuls."""
    model = ir.load(str(tiny_export.fused(arch, "int4").model))
    layers = _layers(model)
    ops = [n.op_type for n in model.graph]
    assert ops.count("MatMulNBits") == 2 * layers + 1
    assert ops.count("MatMul") + ops.count("Gemm") == layers  # the routers (gpt-oss: Gemm with bias)
    for node in model.graph:
        if node.op_type in ("MatMul", "Gemm"):  # a router: its logits go to the QMoE node
            assert any(u.node.op_type == "QMoE" and u.idx == 1 for u in node.outputs[0].uses()), node.name
