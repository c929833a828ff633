"""hina-export end to end (export -> passes -> saved folder + report), its
errors, and `optimum-cli export hina`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch

from hinamoe.export import cli

from support.export_fixtures import ARCHS
from support.export_reference import compare_steps, decode_tokens, left_padded_batch, ort_steps, torch_steps
from support.fusion_checks import profile_nodes
from support.sessions import cpu_session


def _run_cli(args, capsys):
    code = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("arch", [
    "qwen2_moe",  # shared expert, no renormalisation: the most to get right
    *(pytest.param(a, marks=pytest.mark.slow) for a in ARCHS if a != "qwen2_moe")])
def test_hina_export_end_to_end(arch, tiny_export, tmp_path, capsys, rng):
    """Full hina-export: the folder has the model, its external data, configs
    and the report; the table is printed; the result matches PyTorch on the
    CPU EP and generates PyTorch's tokens on HinaMoE, with every fused MoE and
    GroupQueryAttention node run by HinaMoE."""
    from hinamoe.export import load_causal_lm

    ckpt = tiny_export.checkpoint(arch)
    out = tmp_path / "out"
    code, stdout, _ = _run_cli([ckpt, out, "--quiet"], capsys)
    assert code == 0
    for name in ("model.onnx", "model.onnx_data", "config.json", "generation_config.json",
                 "tokenizer.json", "fusion_report.json"):
        assert (out / name).is_file(), name
    assert not list(out.glob("hina-export-*")), "temporary folder left behind"
    report = json.loads((out / "fusion_report.json").read_text())
    model = onnx.load(str(out / "model.onnx"))
    assert report["nodes_after"] == len(model.graph.node)
    unfused = onnx.load(str(tiny_export(arch).model))
    assert report["nodes_before"] == len(unfused.graph.node)
    assert f"nodes: {report['nodes_before']} -> {report['nodes_after']}" in stdout
    assert f"wrote {out / 'model.onnx'}" in stdout

    pt = tiny_export(arch).torch_model()
    ids, mask = left_padded_batch(rng, pt.config.vocab_size, lengths=(6, 3),
                                  pad_id=pt.config.pad_token_id)
    got = ort_steps(cpu_session(str(out / "model.onnx")), ids, mask, decode_steps=3)
    want = torch_steps(pt, ids, mask, decode_steps=3, tokens=decode_tokens(got))
    compare_steps(got, want, mask, 1e-4, 1e-4)

    import onnxruntime as ort

    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "gen")
    om = load_causal_lm(out, providers=["HinaMoE"], session_options=so)
    kw = dict(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
              max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert torch.equal(om.generate(**kw), pt.generate(**kw))
    placed = profile_nodes(om.session.end_profiling())
    # One MoE and one GroupQueryAttention per layer, each run by HinaMoE.
    layers = pt.config.num_hidden_layers
    fused = [n.name for n in model.graph.node if n.op_type in ("MoE", "GroupQueryAttention")]
    assert sum(n.op_type == "MoE" for n in model.graph.node) == layers
    assert sum(n.op_type == "GroupQueryAttention" for n in model.graph.node) == layers
    assert {name: placed.get(name) for name in fused} == {name: "HinaMoE" for name in fused}


@pytest.fixture
def llama_checkpoint(tmp_path):
    """A real (non-MoE) HF checkpoint folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    path = tmp_path / "llama"
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def test_non_moe_architecture_lists_supported(llama_checkpoint, tmp_path, capsys):
    code, _, err = _run_cli([llama_checkpoint, tmp_path / "o"], capsys)
    assert code == 2
    assert "unsupported architecture 'llama'" in err
    for name in ("Mixtral", "Qwen2-MoE", "Qwen3-MoE", "gpt-oss"):
        assert name in err


@pytest.mark.parametrize("case", ["missing", "file", "no_config", "no_weights", "bad_json"])
def test_bad_model_dir(case, tmp_path, capsys):
    path = tmp_path / "ckpt"
    expect = {"missing": "does not exist", "file": "is not a directory",
              "no_config": "no config.json", "no_weights": "no weights",
              "bad_json": "not valid JSON"}[case]
    if case == "file":
        path.write_text("x")
    elif case != "missing":
        path.mkdir()
        if case == "no_weights":
            (path / "config.json").write_text(json.dumps({"model_type": "mixtral"}))
        elif case == "bad_json":
            (path / "config.json").write_text("{model_type: mixtral")
    code, out, err = _run_cli([path, tmp_path / "o"], capsys)
    assert code == 2 and expect in err, err
    assert not (tmp_path / "o").exists()


def test_bad_options(tiny_export, tmp_path, capsys):
    ckpt = tiny_export.checkpoint("mixtral")
    code, _, err = _run_cli([ckpt, tmp_path / "o", "--no-fuse", "--dtype", "bf16"], capsys)
    assert code == 2 and "needs fusion" in err
    code, _, err = _run_cli([ckpt, tmp_path / "o", "--accuracy-level", "4"], capsys)
    assert code == 2 and "--accuracy-level" in err and "int4" in err
    with pytest.raises(SystemExit) as e:
        cli.main([str(ckpt), str(tmp_path / "o"), "--dtype", "int3"])
    assert e.value.code == 2
    assert "invalid choice: 'int3'" in capsys.readouterr().err


def test_help_explains(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for words in ("MODEL_DIR", "OUTPUT_DIR", "--dtype", "--no-fuse", "--opset", "fusion_report.json",
                  "Qwen3-MoE", "load_causal_lm"):
        assert words in text, words


def _optimum_cli(*args, timeout=600):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "optimum.commands.optimum_cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_optimum_cli_lists_export_hina():
    res = _optimum_cli("export", "--help")
    assert res.returncode == 0, res.stderr
    assert "hina" in res.stdout and "onnx" in res.stdout
    res = _optimum_cli("export", "hina", "--help")
    assert res.returncode == 0 and "--no-fuse" in res.stdout, res.stderr
    assert "--block-size" in res.stdout and "int4" in res.stdout


def test_optimum_cli_namespace_listed_twice(tmp_path):
    """A second site directory holding the same registration file (a venv
    over a site-packages that also has hinamoe): `export hina` registers once
    and optimum-cli keeps working."""
    import optimum.commands.register as reg

    src = next(Path(p) / "register_hina.py" for p in reg.__path__ if (Path(p) / "register_hina.py").exists())
    second = tmp_path / "optimum" / "commands" / "register"
    second.mkdir(parents=True)
    shutil.copy(src, second / "register_hina.py")
    env = dict(os.environ, PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    res = subprocess.run([sys.executable, "-c", "import optimum.commands.register as r; print(len(r.__path__))"],
                         capture_output=True, text=True, env=env)
    assert res.returncode == 0 and int(res.stdout) >= 2, res.stderr  # the namespace spans both directories
    res = subprocess.run([sys.executable, "-m", "optimum.commands.optimum_cli", "export", "--help"],
                         capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.count("hina") >= 1 and "onnx" in res.stdout


def test_optimum_cli_export_hina_error(tmp_path):
    res = _optimum_cli("export", "hina", tmp_path / "missing", tmp_path / "o")
    assert res.returncode == 2 and "does not exist" in res.stderr, res.stderr


@pytest.mark.slow
def test_optimum_cli_export_hina_runs(tiny_export, tmp_path):
    res = _optimum_cli("export", "hina", tiny_export.checkpoint("qwen3_moe"), tmp_path / "o", "--quiet")
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "o" / "model.onnx").is_file()
    assert (tmp_path / "o" / "fusion_report.json").is_file()
    assert "nodes:" in res.stdout
