"""hina-export --dtype int4|int8 end to end: the exported model is 4/8-bit
(QMoE experts, MatMulNBits elsewhere, routers float), the report says so, and
``load_causal_lm(...).generate()`` on it gives the tokens and logits of the
same model with its weights dequantised to float (QMoE -> MoE, MatMulNBits ->
MatMul, run by other kernels); bad --block-size values are clear CLI errors.

Tolerances against the dequantised model: with float activations both sides
compute the same float32 products and differ in summation order only
(~1e-6 of logits of RMS ~1 seen), so 1e-4 as for the fp32 exports and the
same greedy tokens. ORT's CPU EP rounds the activations of block-wise int8
experts to int8 by default (test_quantize_pass proves exactly how); the tight
comparison switches that off, and test_int8_default_cpu_activations checks the
default against a bound on the median token: its logits' RMS error within 3%
of their RMS (0.2-0.6% seen here). Not on every token: where the rounding
flips a router's top-k choice, that token's logits move by ~10% of their RMS
(seen with seed 2522190573), a real effect of int8 activations, not an error.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from hinamoe.export import cli

from support.export_fixtures import ARCHS
from support.export_reference import compare_steps, decode_tokens, left_padded_batch, ort_steps
from support.fusion_checks import profile_nodes
from support.quant_reference import dequantised_twin
from support.sessions import cpu_session

# Where the quantised model runs (on HinaMoE, the profile must show every
# QMoE and GroupQueryAttention node there).
PROVIDERS = ["CPUExecutionProvider", "HinaMoE"]
CPU_FLOAT_ACTIVATIONS = ("ORT_QMOE_CPU_QNBIT_GEMM", "fp32")
RTOL = ATOL = 1e-4
DEFAULT_INT8_BOUND = 0.03  # median token's RMS error / RMS of its logits, see the module docstring
FLOAT_NOISE = 1e-4  # what float activations differ by: the int8 rounding must show above it
ARCH_PARAMS = ["qwen2_moe", "gpt_oss",  # the two MoE matchers, shared expert, biases, clamp
               *(pytest.param(a, marks=pytest.mark.slow) for a in ARCHS
                 if a not in ("qwen2_moe", "gpt_oss"))]


def _twin(exp) -> str:
    """The dequantised model next to the export (it shares model.onnx_data)."""
    path = exp.model.parent / "dequantised.onnx"
    if not path.exists():
        onnx.save(dequantised_twin(str(exp.model)), str(path))
    return str(path)


def _check_quantised_graph(model: onnx.ModelProto, report: dict, config, bits: int):
    layers = config.num_hidden_layers
    ops = report["ops_after"]
    assert "com.microsoft::MoE" not in ops
    assert ops["com.microsoft::QMoE"] == layers
    [quant] = [p for p in report["passes"] if p["name"] == "quantize"]
    qmoe = [s for s in quant["fused"] if s["op"] == "QMoE"]
    nbits = {s["layer"]: s for s in quant["fused"] if s["op"] == "MatMulNBits"}
    block = "block_sparse_moe" if config.model_type == "mixtral" else "mlp"
    assert [s["layer"] for s in qmoe] == [f"/model/layers.{i}/{block}" for i in range(layers)]
    assert all(s["bits"] == bits and s["block_size"] == 32 for s in quant["fused"])
    # bytes: bits per weight + a scale per 32, float16 for QMoE (its T2) and
    # float32 for MatMulNBits (its T1; K padded to 32)
    for s in qmoe:
        assert s["scales"] == "float16"
        assert s["weight_bytes_after"] * 64 == s["weight_bytes_before"] * (2 * bits + 1), s
    for s in nbits.values():
        assert s["weight_bytes_before"] == s["K"] * s["N"] * 4
        assert s["weight_bytes_after"] == s["N"] * -(-s["K"] // 32) * (32 * bits // 8 + 4), s
    # attention projections and lm_head (+ the shared expert) are MatMulNBits;
    # q/k/v (and the shared expert's gate, up and sigmoid gate) packed first
    # into one MatMul per layer (matmul_packing.py)
    linears = [f"/model/layers.{i}/self_attn/{p}_proj/MatMul" for i in range(layers)
               for p in "qkvo"] + ["/lm_head/MatMul"]
    if config.model_type == "qwen2_moe":
        linears += [f"/model/layers.{i}/mlp/shared_expert{p}/MatMul" for i in range(layers)
                    for p in ("/gate_proj", "/up_proj", "/down_proj", "_gate")]
    [packing] = [p for p in report["passes"] if p["name"] == "matmul-packing"]
    packed = {name for site in packing["fused"] for name in site["packed"]}
    assert {f"/model/layers.{i}/self_attn/{p}_proj/MatMul" for i in range(layers) for p in "qkv"} <= packed
    want = [name for name in linears if name not in packed] + [site["layer"] for site in packing["fused"]]
    assert sorted(nbits) == sorted(want)
    assert ops["com.microsoft::MatMulNBits"] == len(want)
    # What stays MatMul: rotary (no constant weight) and the routers.
    inits = {i.name for i in model.graph.initializer}
    float_matmuls = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits]
    assert all(name.endswith(f"/{block}/gate/MatMul") for name in float_matmuls), float_matmuls
    routers = [s["where"] for s in quant["skipped"] if s["reason"].startswith("router stays float")]
    assert len(routers) == layers and set(float_matmuls) <= set(routers)
    assert all(r.endswith((f"/{block}/gate/MatMul", "/mlp/router/Gemm")) for r in routers), routers
    qmoe_nodes = [n for n in model.graph.node if n.op_type == "QMoE"]
    # Qwen2-MoE does not renormalise: its QMoE nodes get router_weights (input 14).
    with_rw = [len(n.input) > 14 and n.input[14] != "" for n in qmoe_nodes]
    assert with_rw == [config.model_type == "qwen2_moe"] * layers


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype", ["int4", "int8"])
@pytest.mark.parametrize("arch", ARCH_PARAMS)
def test_quantised_export_generates_like_dequantised(arch, dtype, provider, tiny_export, rng,
                                                     monkeypatch, tmp_path):
    from hinamoe.export import load_causal_lm

    if dtype == "int8":
        monkeypatch.setenv(*CPU_FLOAT_ACTIVATIONS)
    exp = tiny_export.fused(arch, dtype)
    model = onnx.load(str(exp.model), load_external_data=False)
    report = json.loads((exp.model.parent / "fusion_report.json").read_text())
    pt_config = exp.torch_model().config
    _check_quantised_graph(model, report, pt_config, int(dtype[3:]))

    twin = _twin(exp)
    ids, mask = left_padded_batch(rng, pt_config.vocab_size, lengths=(6, 3),
                                  pad_id=pt_config.pad_token_id)
    so = None
    if provider == "HinaMoE":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.enable_profiling = True
        so.profile_file_prefix = str(tmp_path / "gen")
    om = load_causal_lm(exp.model.parent, providers=[provider], session_options=so)
    got = ort_steps(om.session, ids, mask, decode_steps=3)
    want = ort_steps(cpu_session(twin), ids, mask, decode_steps=3, tokens=decode_tokens(got))
    compare_steps(got, want, mask, RTOL, ATOL)

    ref = load_causal_lm(twin, providers=["CPUExecutionProvider"])
    kw = dict(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
              max_new_tokens=8, min_new_tokens=8, do_sample=False)
    tokens = om.generate(**kw)
    assert tokens.shape == (2, ids.shape[1] + 8)
    assert torch.equal(tokens, ref.generate(**kw))
    if provider == "HinaMoE":
        # Every QMoE and GroupQueryAttention node ran on HinaMoE (ORT profile).
        placed = profile_nodes(om.session.end_profiling())
        ours = [n.name for n in model.graph.node if n.op_type in ("QMoE", "GroupQueryAttention")]
        assert any(n.op_type == "QMoE" for n in model.graph.node)
        assert {name: placed.get(name) for name in ours} == {name: "HinaMoE" for name in ours}


def test_int8_default_cpu_activations(tiny_export, rng):
    """int8 with the CPU EP's default (int8 activations in the experts): the
    median token's logits stay within DEFAULT_INT8_BOUND of the dequantised
    model's, and above float noise (the rounding is really on)."""
    exp = tiny_export.fused("qwen2_moe", "int8")
    twin = _twin(exp)
    config = exp.torch_model().config
    ids, mask = left_padded_batch(rng, config.vocab_size, lengths=(5, 2), pad_id=config.pad_token_id)
    got = ort_steps(cpu_session(str(exp.model)), ids, mask, decode_steps=2)
    want = ort_steps(cpu_session(twin), ids, mask, decode_steps=2, tokens=decode_tokens(got))
    errors = []  # per token of every step: RMS of the error / RMS of the logits
    for step, ((g, _), (w, _)) in enumerate(zip(got, want)):
        real = mask.astype(bool) if step == 0 else slice(None)
        g, w = g[real].reshape(-1, g.shape[-1]), w[real].reshape(-1, w.shape[-1])
        errors += list(np.sqrt(np.mean((g - w) ** 2, -1) / np.mean(w ** 2, -1)))
    assert len(errors) == int(mask.sum()) + 2 * 2
    median = float(np.median(errors))
    assert FLOAT_NOISE < median < DEFAULT_INT8_BOUND, f"per-token errors {np.round(errors, 4)}"


def _run_cli(args, capsys):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_int4_block_16_on_hf_tiny_sizes(tiny_export, tmp_path, capsys):
    """The CLI with --block-size 16 on hf_tiny's own Qwen3-MoE (hidden 80,
    experts 48: multiples of 16, not of 32): QMoE at block 16, table printed."""
    out = tmp_path / "q"
    code, stdout, err = _run_cli([tiny_export.checkpoint("qwen3_moe"), out, "--dtype", "int4",
                                  "--block-size", "16", "--quiet"], capsys)
    assert code == 0, err
    report = json.loads((out / "fusion_report.json").read_text())
    [quant] = [p for p in report["passes"] if p["name"] == "quantize"]
    assert {(s["op"], s["bits"], s["block_size"]) for s in quant["fused"]} == {
        ("QMoE", 4, 16), ("MatMulNBits", 4, 16)}
    assert "quantize: " in stdout and "op=QMoE, bits=4, block_size=16" in stdout
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    levels = {n.op_type: [a.i for a in n.attribute if a.name == "accuracy_level"]
              for n in model.graph.node if n.op_type in ("QMoE", "MatMulNBits")}
    assert levels == {"QMoE": [4], "MatMulNBits": [4]}, levels   # the command line's default: int8 tokens
    scales = [i for i in model.graph.initializer if i.name.endswith("fc1_scales")]
    assert len(scales) == 2 and all(list(i.dims)[-1] == 80 // 16 for i in scales)
    sess = cpu_session(str(out / "model.onnx"))
    assert {o.name for o in sess.get_outputs()} >= {"logits"}


@pytest.mark.parametrize("args, message", [
    (["--dtype", "int4", "--block-size", "24"], "power of two >= 16"),
    (["--dtype", "int8", "--block-size", "8"], "power of two >= 16"),
    (["--dtype", "int4", "--block-size", "0"], "power of two >= 16"),
    (["--dtype", "bf16", "--block-size", "32"], "does not apply to --dtype bf16"),
    (["--dtype", "int4", "--no-fuse"], "needs fusion"),
])
def test_cli_bad_quant_options(args, message, tiny_export, tmp_path, capsys):
    code, _, err = _run_cli([tiny_export.checkpoint("qwen3_moe", quantisable=True),
                             tmp_path / "o", *args], capsys)
    assert code == 2 and message in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("arch, dtype, message", [
    # hf_tiny's Qwen2-MoE experts are 40 wide: no power of two >= 16 divides 40
    ("qwen2_moe", "int4", "intermediate size 40 not a multiple of block size 32"),
    # Mixtral's 80: --block-size 16 fits
    ("mixtral", "int8", "--block-size 16 divides both"),
])
def test_cli_expert_sizes_not_a_multiple(arch, dtype, message, tiny_export, tmp_path, capsys):
    """Checked from config.json before the (long) export starts."""
    code, _, err = _run_cli([tiny_export.checkpoint(arch), tmp_path / "o", "--dtype", dtype], capsys)
    assert code == 2 and message in err, err
    assert not (tmp_path / "o").exists()


def test_help_explains_quantisation(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for words in ("int4", "int8", "--block-size", "QMoE", "MatMulNBits", "power of two >= 16",
                  "routers stay fp32"):
        assert words in text, words


@pytest.mark.slow
def test_optimum_cli_export_hina_int8(tiny_export, tmp_path):
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONWARNINGS="ignore")
    res = subprocess.run([sys.executable, "-m", "optimum.commands.optimum_cli", "export", "hina",
                          str(tiny_export.checkpoint("gpt_oss", quantisable=True)), str(tmp_path / "o"),
                          "--dtype", "int8", "--block-size", "16", "--quiet"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tmp_path / "o" / "fusion_report.json").read_text())
    assert report["ops_after"]["com.microsoft::QMoE"] == 2
    assert "op=QMoE, bits=8, block_size=16" in res.stdout
