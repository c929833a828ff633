"""hina-export folders are onnxruntime-genai folders: genai_config.json is
written beside the fused graph, and genai's own generate loop on HinaMoE
(``hinamoe.genai.model``, strict) gives the CPU EP's greedy tokens and
logits (and PyTorch's first token), every MoE / QMoE /
GroupQueryAttention / MatMulNBits node placed on HinaMoE.

Needs onnxruntime-genai (the runtime only; the ``test`` extra has it)."""

from __future__ import annotations

import glob
import json

import numpy as np
import onnx
import pytest
import torch

from support.export_fixtures import ARCHS

og = pytest.importorskip("onnxruntime_genai")

import hinamoe.genai  # noqa: E402
from hinamoe.serve.model_folder import read_model_folder  # noqa: E402

from support.genai_support import cpu_model, greedy  # noqa: E402

NEW_TOKENS = 10
ATOL = RTOL = 2e-4  # fp32 both sides; summation order only
HINAMOE_OPS = ("MoE", "QMoE", "GroupQueryAttention", "MatMulNBits")


def test_genai_config_describes_the_export(tiny_export):
    folder = tiny_export.fused("qwen3_moe").model.parent
    cfg = json.loads((folder / "config.json").read_text())
    genai = json.loads((folder / "genai_config.json").read_text())
    dec = genai["model"]["decoder"]
    assert genai["model"]["type"] == "qwen3"
    assert dec["num_hidden_layers"] == cfg["num_hidden_layers"]
    assert (dec["num_attention_heads"], dec["num_key_value_heads"], dec["head_size"]) == (
        cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"])
    assert genai["model"]["context_length"] == cfg["max_position_embeddings"]
    assert genai["model"]["vocab_size"] == cfg["vocab_size"]
    # Every layer's attention is one GroupQueryAttention node: genai may bind
    # each cache as past and present at once.
    assert genai["search"]["past_present_share_buffer"] is True
    # hina-serve still reads it as hina-export's folder (its KV layout).
    assert read_model_folder(folder).kind == "export"


@pytest.mark.parametrize("arch", ARCHS)
def test_genai_greedy_on_hinamoe_matches_pytorch(arch, tiny_export, rng, tmp_path):
    """genai's loop on HinaMoE: the first token PyTorch's, every token and
    logit the CPU EP's on the same graph, every HinaMoE op placed there."""
    exp = tiny_export.fused(arch)
    pt = exp.torch_model()
    prompt = rng.integers(3, pt.config.vocab_size, size=int(rng.integers(5, 12)))
    want = pt.generate(torch.from_numpy(prompt[None, :]), max_new_tokens=1, min_new_tokens=1,
                       do_sample=False)[0, prompt.size:].tolist()

    prefix = str(tmp_path / "hina")
    model = hinamoe.genai.model(exp.model.parent, profile_prefix=prefix)
    got, got_logits = greedy(model, prompt, NEW_TOKENS)
    del model  # writes the profile
    # The prompt's token is PyTorch's; later ones may part from PyTorch's
    # where a router's logits are nearly tied (a different expert set then
    # moves the logits by more than rounding), so they are held to the CPU
    # EP's on the same graph.
    assert got[0] == want[0], f"{arch}: genai on HinaMoE {got} vs PyTorch {want}"
    cpu_tokens, cpu_logits = greedy(cpu_model(exp.model.parent), prompt, NEW_TOKENS)
    assert got == cpu_tokens, f"{arch}: genai on HinaMoE {got} vs on the CPU EP {cpu_tokens}"
    for step in range(NEW_TOKENS):
        g, w = got_logits[step], cpu_logits[step]
        err = np.abs(g.astype(np.float64) - w)
        assert np.all(err <= ATOL + RTOL * np.abs(w)), f"{arch} step {step}: max error {err.max():.3g}"

    [profile] = glob.glob(prefix + "*.json")
    ran = hinamoe.genai.profile_providers(profile)
    graph = onnx.load(str(exp.model), load_external_data=False).graph
    ours = {n.name: n.op_type for n in graph.node if n.op_type in HINAMOE_OPS}
    assert "GroupQueryAttention" in ours.values() and {"MoE", "QMoE"} & set(ours.values())
    for name, op in ours.items():
        assert ran.get(name, (None, None))[1] == "HinaMoE", f"{arch}: {op} {name} ran on {ran.get(name)}"


def test_genai_greedy_int4_export_matches_cpu_ep(tiny_export, rng, monkeypatch):
    """int4 (QMoE with float16 scales, MatMulNBits): genai on HinaMoE against
    genai on the CPU EP, the CPU EP kept on float arithmetic; logits at the
    scale quantised arithmetic differs by (see test_genai.py)."""
    monkeypatch.setenv("ORT_QMOE_CPU_QNBIT_GEMM", "fp32")
    folder = tiny_export.fused("qwen3_moe", "int4").model.parent
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    prompt = rng.integers(3, vocab, size=9)
    got, got_logits = greedy(hinamoe.genai.model(folder), prompt, NEW_TOKENS)
    want, want_logits = greedy(cpu_model(folder), prompt, NEW_TOKENS)
    assert len(got) == NEW_TOKENS
    atol = 2e-2 * max(float(np.abs(w).max()) for w in want_logits)
    first = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), NEW_TOKENS)
    # Logits are compared up to the first differing token (a near tie can
    # flip it; after that the sequences differ).
    for step in range(min(first + 1, NEW_TOKENS)):
        err = np.abs(got_logits[step].astype(np.float64) - want_logits[step])
        assert np.all(err <= atol), f"step {step}: max error {err.max():.3g} (atol {atol:.3g})"
    assert first >= NEW_TOKENS // 2, f"HinaMoE {got} vs CPU EP {want}"


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen2_moe"])
def test_genai_bf16_export_every_linear_on_hinamoe(arch, tiny_export, rng, tmp_path):
    """--dtype bf16 stores the experts and the dense linears at bf16: every
    MoE and bf16 MatMul node runs on HinaMoE (the CPU EP has no bf16
    MatMul), and the logits follow the fp32 export's within bf16 rounding."""
    folder = tiny_export.fused(arch, "bf16").model.parent
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    bf16 = onnx.TensorProto.BFLOAT16
    weights = {t.name: t.data_type for t in graph.initializer}
    matmuls = [n.name for n in graph.node if n.op_type == "MatMul" and weights.get(n.input[1]) == bf16]
    assert len(matmuls) >= 2 * json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    prompt = rng.integers(3, vocab, size=7)
    prefix = str(tmp_path / "hina")
    model = hinamoe.genai.model(folder, profile_prefix=prefix)
    _, got = greedy(model, prompt, 4)
    del model
    [profile] = glob.glob(prefix + "*.json")
    ran = hinamoe.genai.profile_providers(profile)
    for name in matmuls + [n.name for n in graph.node if n.op_type == "MoE"]:
        assert ran.get(name, (None, None))[1] == "HinaMoE", f"{name} ran on {ran.get(name)}"
    _, want = greedy(hinamoe.genai.model(tiny_export.fused(arch).model.parent), prompt, 4)
    scale = max(float(np.abs(w).max()) for w in want)
    err = max(float(np.abs(g - w).max()) for g, w in zip(got[:1], want[:1]))  # the prompt step: same inputs
    assert err <= 3e-2 * scale, f"bf16 logits off the fp32 export's by {err:.3g} (scale {scale:.3g})"
