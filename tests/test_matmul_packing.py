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

import numpy as np
import onnx_ir as ir
import pytest

from conftest import cpu_session, hina_session
from fusion_checks import clear_routing_steps, greedy_steps, moe_routers, with_outputs
from hinamoe.graph_passes import matmul_packing, run_passes

ARCHS = ["qwen3_moe", "mixtral", "qwen2_moe", "gpt_oss"]
BEFORE = ["moe-fusion", "gqa", "shapes", "rms-norm"]
DECODE_STEPS = 3
FP32_REL = 1e-4  # of the largest |logit|: another GEMM shape may sum in another order


def _pair(path):
    kw = {"rotary_positions": 64}
    before, _ = run_passes(ir.load(str(path)), only=BEFORE, **kw)
    after, report = run_passes(ir.load(str(path)), only=BEFORE + [matmul_packing.NAME], **kw)
    return before, after, report.passes[-1]


def _layers(model) -> int:
    return sum(1 for v in model.graph.inputs if v.name.endswith(".key"))


def _batch(rng, vocab):
    lengths = (int(rng.integers(5, 9)), int(rng.integers(2, 5)))
    S = max(lengths)
    ids = rng.integers(1, vocab - 1, size=(2, S)).astype(np.int64)
    mask = np.zeros((2, S), np.int64)
    for b, n in enumerate(lengths):
        mask[b, S - n:] = 1
    return ids, mask


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
    make = cpu_session if ep == "CPU" else (
        lambda m: hina_session(m, no_fallback=False, cpu_fallback_provider=True))
    before_proto = ir.to_proto(before)
    routers = moe_routers(before_proto)
    vocab = after.graph.outputs[0].shape[-1]
    ids, mask, want, tokens = clear_routing_steps(lambda: _batch(rng, vocab),
                                                  make(with_outputs(before_proto, routers)), routers, DECODE_STEPS)
    got, _ = greedy_steps(make(ir.to_proto(after).SerializeToString()), ids, mask, DECODE_STEPS, tokens=tokens)
    for step, (g, w) in enumerate(zip(got, want)):
        for name in g:
            scale = float(np.abs(w[name]).max()) + 1e-6
            err = float(np.abs(g[name] - w[name]).max())
            assert err <= FP32_REL * scale, f"step {step} {name}: {err:.3g} > {FP32_REL * scale:.3g}"


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
