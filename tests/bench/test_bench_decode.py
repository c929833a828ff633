"""hina-bench decode with the optimum client (hina-export folders through
load_causal_lm + generate): a short run on tiny exports, the tokens against
PyTorch's greedy generation of the same checkpoint, the JSON, the op
breakdown's placement and the plot; folder detection and its errors. Speed
itself is for the benchmark. The genai client's run is in test_genai.py
(it needs genai's builder and transformers 5)."""

from __future__ import annotations

import importlib.util
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("optimum.onnxruntime")  # load_causal_lm: the export extra

from hinamoe.bench.cli import main  # noqa: E402
from hinamoe.bench.decode import detect_client, ms_per_token_at_depth  # noqa: E402

PROMPT, NEW = 9, 5


def run_decode(tmp_path, model, *extra, rounds=2, seed=0):
    out = tmp_path / "decode.json"
    argv = ["decode", str(model), "--prompt", str(PROMPT), "--new-tokens", str(NEW), "--rounds", str(rounds),
            "--threads", "1", "--seed", str(seed), "--json", str(out), *extra]
    assert main(argv) == 0
    return json.loads(out.read_text())


def check_result(res, rounds, layers, moe_on="HinaMoE"):
    """The fields, and that each op group ran where it should."""
    assert res["eps"].keys() == {"HinaMoE", "CPU"} and len(res["prompt_ids"]) == PROMPT
    for ep, r in res["eps"].items():
        assert len(res["tokens"][ep]) == NEW
        assert [x["round"] for x in r["rounds"]] == list(range(rounds))
        assert all(len(x["decode_ms"]) == NEW - 1 and x["prefill_s"] > 0 for x in r["rounds"])
        s = r["summary"]
        assert 0 < s["decode_ms_p10"] <= s["decode_ms_median"] <= s["decode_ms_p90"]
        assert s["decode_tokens_per_s"] == pytest.approx(1000.0 / s["decode_ms_median"])
        assert s["prefill_tokens_per_s"] == pytest.approx(PROMPT / s["prefill_s_median"])
        ops = r["ops"]
        for group in ("MoE/QMoE", "GroupQueryAttention"):
            assert ops["prefill_ms"][group] > 0 and ops["decode_ms_per_token"][group] > 0
            want = moe_on if ep == "HinaMoE" else "CPUExecutionProvider"
            assert ops["providers"][group] == [want], (ep, group, ops["providers"])
        # every MoE / GQA node is inside a layer; the LM head's MatMul is not
        outside = ops["decode_ms_per_token_outside_layers"]
        assert ops["layers"] == layers and outside["MatMul/MatMulNBits"] > 0
        assert "MoE/QMoE" not in outside and "GroupQueryAttention" not in outside
        assert ms_per_token_at_depth(r, layers) == pytest.approx(s["decode_ms_median"])
        by_ep = ops["decode_ms_per_token_by_provider"]
        assert sum(by_ep.values()) == pytest.approx(sum(ops["decode_ms_per_token"].values()))
        assert (by_ep.get("HinaMoE", 0) > 0) == (ep == "HinaMoE")
        assert ms_per_token_at_depth(r, 2 * layers) > s["decode_ms_median"]
        assert all(x["other_cores"] is None or x["other_cores"] >= 0 for x in r["rounds"])
    h, c = (res["eps"][ep]["summary"] for ep in ("HinaMoE", "CPU"))
    assert res["decode_speedup"] == pytest.approx(h["decode_tokens_per_s"] / c["decode_tokens_per_s"])
    assert res["prefill_speedup"] == pytest.approx(h["prefill_tokens_per_s"] / c["prefill_tokens_per_s"])


def torch_greedy(exp, prompt_ids, new_tokens):
    ids = torch.tensor([prompt_ids], dtype=torch.int64)
    out = exp.torch_model().generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    return out[0, len(prompt_ids):].tolist()


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
def test_optimum_client(arch, tiny_export, tmp_path, seed):
    pytest.importorskip("matplotlib")
    exp = tiny_export.fused(arch)
    plot = tmp_path / "decode.png"
    res = run_decode(tmp_path, exp.model.parent, "--client", "optimum", "--plot", str(plot), seed=seed)
    assert res["meta"]["client"] == "optimum" and res["meta"]["cpu_model"] == res["meta"]["model"]
    check_result(res, rounds=2, layers=exp.torch_model().config.num_hidden_layers)
    assert res["same_tokens"] is True
    want = torch_greedy(exp, res["prompt_ids"], NEW)
    assert res["tokens"]["HinaMoE"] == res["tokens"]["CPU"] == want
    assert plot.stat().st_size > 0


def test_genai_client_on_an_export_folder(tiny_export, tmp_path, seed):
    """A hina-export folder picks genai's loop by itself (its genai_config.json)."""
    pytest.importorskip("onnxruntime_genai")
    exp = tiny_export.fused("qwen3_moe")
    res = run_decode(tmp_path, exp.model.parent, seed=seed)
    assert res["meta"]["client"] == "genai"
    check_result(res, rounds=2, layers=exp.torch_model().config.num_hidden_layers)
    want = torch_greedy(exp, res["prompt_ids"], NEW)
    assert res["tokens"]["HinaMoE"] == res["tokens"]["CPU"] == want


def test_serve_client(tiny_export, tmp_path, seed):
    """--client serve: hina-serve's runner on a hina-export folder, the
    same fields and placement, and PyTorch's greedy tokens (the runner does
    not stop at the end token; generate() may)."""
    exp = tiny_export.fused("qwen3_moe")
    res = run_decode(tmp_path, exp.model.parent, "--client", "serve", seed=seed)
    assert res["meta"]["client"] == "serve"
    check_result(res, rounds=2, layers=exp.torch_model().config.num_hidden_layers)
    ids = torch.tensor([res["prompt_ids"]], dtype=torch.int64)
    out = exp.torch_model().generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW)
    want = out[0, ids.shape[1]:].tolist()
    assert res["tokens"]["HinaMoE"] == res["tokens"]["CPU"]
    assert res["tokens"]["HinaMoE"][:len(want)] == want


def test_optimum_client_bf16_copy_against_fp32(tiny_export, tmp_path, seed):
    """A bf16-expert copy (hinamoe.export.convert) on HinaMoE, the fp32
    original on the CPU EP (which has no bf16 MoE): --cpu-model."""
    from hinamoe.export.convert import convert

    exp = tiny_export.fused("qwen3_moe")
    src = exp.model.parent
    convert(src, tmp_path / "bf16")
    res = run_decode(tmp_path, tmp_path / "bf16", "--cpu-model", str(src), "--client", "optimum",
                     rounds=1, seed=seed)
    assert res["meta"]["cpu_model"] == str(src)
    check_result(res, rounds=1, layers=exp.torch_model().config.num_hidden_layers)  # tokens may differ: bf16 weights are another model


def test_cpu_ep_on_a_bf16_copy_says_what_to_do(tiny_export, tmp_path, capsys):
    from hinamoe.export.convert import convert

    convert(tiny_export.fused("qwen3_moe").model.parent, tmp_path / "bf16")
    assert main(["decode", str(tmp_path / "bf16"), "--prompt", "4", "--new-tokens", "2", "--rounds", "1"]) == 1
    err = capsys.readouterr().err
    assert "CPU could not load" in err and "--cpu-model" in err and "Traceback" not in err


def test_detect_client(tmp_path):
    genai, hina, neither = tmp_path / "g", tmp_path / "h", tmp_path / "n"
    for d in (genai, hina, neither):
        d.mkdir()
    (genai / "genai_config.json").write_text("{}")
    (genai / "model.onnx").write_bytes(b"")
    (hina / "model.onnx").write_bytes(b"")
    (hina / "config.json").write_text("{}")
    (neither / "model.onnx").write_bytes(b"")
    assert detect_client(genai) == "genai" and detect_client(hina) == "optimum"
    # hina-export's fused folders are genai folders too: genai's loop where it is installed.
    (hina / "genai_config.json").write_text("{}")
    (hina / "fusion_report.json").write_text("{}")
    has_genai = importlib.util.find_spec("onnxruntime_genai") is not None
    assert detect_client(hina) == ("genai" if has_genai else "optimum")
    with pytest.raises(ValueError, match="neither an onnxruntime-genai folder"):
        detect_client(neither)
    with pytest.raises(ValueError, match="not a folder"):
        detect_client(tmp_path / "missing")


def test_bad_folders_and_options(tmp_path, tiny_export, capsys):
    hina = tiny_export.fused("qwen3_moe").model.parent
    plain = tmp_path / "plain"  # model.onnx + config.json only (optimum's export)
    plain.mkdir()
    for name in ("model.onnx", "config.json"):
        (plain / name).write_bytes((hina / name).read_bytes())
    cases = [
        (["decode", str(tmp_path)], "neither an onnxruntime-genai folder"),
        (["decode", str(plain), "--client", "genai"], "has no genai_config.json"),
        (["decode", str(hina), "--cpu-model", str(tmp_path)], "has no genai_config.json"),
        (["decode", str(hina), "--client", "optimum", "--cpu-model", str(tmp_path)], "has no model.onnx, config.json"),
        (["decode", str(hina), "--new-tokens", "1"], "--new-tokens >= 2"),
        (["decode", str(hina), "--isa", "nope"], "--isa nope"),
    ]
    for argv, msg in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert msg in err and "Traceback" not in err, (argv, err)


def test_plot_without_matplotlib_fails_before_generating(tmp_path, tiny_export, capsys, monkeypatch):
    """--plot on a Python without matplotlib is refused up front (exit 2, a
    message naming the fix), not after the rounds have run."""

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    hina = tiny_export.fused("qwen3_moe").model.parent
    assert main(["decode", str(hina), "--plot", str(tmp_path / "p.png"), "--json", str(tmp_path / "d.json")]) == 2
    err = capsys.readouterr().err
    assert "--plot needs matplotlib" in err and "Traceback" not in err
    assert not (tmp_path / "d.json").exists()
