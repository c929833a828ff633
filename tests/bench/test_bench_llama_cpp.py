"""hina-bench decode's llama.cpp side (hinamoe.bench.llama_cpp) against a
stand-in llama.cpp tree whose three programs record how they were called:
the converter run with the pre-tokenizer fallback on a tokenizer with a
merge, llama-quantize --pure with the type of the model's precision, GGUF
files converted once per checkpoint, llama-bench's JSON read into
prefill / decode tokens/s, and the llama.cpp rounds and ratios in
hina-bench decode's result; errors that say what is missing. Real
llama.cpp speed is for the benchmark (docs/benchmarks.md)."""

from __future__ import annotations

import json
import stat
import sys

import pytest

from hinamoe.bench import llama_cpp

CONVERT = '''
import json, sys
from pathlib import Path
from conversion.base import TextModel
args = sys.argv[1:]
src, out, kind = Path(args[0]), Path(args[args.index("--outfile") + 1]), args[args.index("--outtype") + 1]
tok = json.loads((src / "tokenizer.json").read_text())
merges = tok["model"]["merges"]
a, b = merges[0].split(" ")
assert a + b in tok["model"]["vocab"], "the merge's result must be a token"
log = Path(__file__).parent / "calls.log"
with open(log, "a") as f:
    f.write(f"convert {src.name} {kind} pre={TextModel().get_vocab_base_pre(None)}\\n")
out.write_text(f"gguf {kind}")
'''
BASE = '''
class TextModel:
    def get_vocab_base_pre(self, tokenizer):
        raise NotImplementedError("BPE pre-tokenizer was not recognized")
'''
QUANTIZE = '''#!{py}
import sys
from pathlib import Path
args = sys.argv[1:]
assert args[0] == "--pure", args
Path(args[2]).write_text(Path(args[1]).read_text() + " -> " + args[3])
with open(Path(__file__).parent.parent.parent / "calls.log", "a") as f:
    f.write(f"quantize {{args[3]}}\\n")
'''
BENCH = '''#!{py}
import json, sys
args = sys.argv[1:]
if args == ["--help"]:
    print("  -d, --n-depth <n>   (default: 0)" if {depth} else "  -n, --n-gen <n>")
    sys.exit(0)
p, n = int(args[args.index("-p") + 1]), int(args[args.index("-n") + 1])
d = int(args[args.index("-d") + 1]) if "-d" in args else 0
with open(__file__ + ".log", "a") as f:
    f.write(f"p={{p}} n={{n}} d={{d}}\\n")
tests = []
if p:
    tests.append({{"n_prompt": p, "n_gen": 0, "n_depth": d, "avg_ts": {pp}, "stddev_ts": 1.5, "build_commit": "fake", "build_number": 1}})
if n:
    tests.append({{"n_prompt": 0, "n_gen": n, "n_depth": d, "avg_ts": {tg}, "stddev_ts": 0.5, "build_commit": "fake", "build_number": 1}})
print(json.dumps(tests))
'''


def fake_tree(root, pp=900.0, tg=200.0, depth=True):
    (root / "build" / "bin").mkdir(parents=True)
    (root / "conversion").mkdir()
    (root / "gguf-py").mkdir()
    (root / "convert_hf_to_gguf.py").write_text(CONVERT)
    (root / "conversion" / "__init__.py").write_text("")
    (root / "conversion" / "base.py").write_text(BASE)
    for name, text in (("llama-quantize", QUANTIZE), ("llama-bench", BENCH)):
        p = root / "build" / "bin" / name
        p.write_text(text.format(py=sys.executable, pp=pp, tg=tg, depth=depth))
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return root


def fake_checkpoint(root):
    root.mkdir()
    (root / "config.json").write_text("{}")
    (root / "model.safetensors").write_bytes(b"weights")
    vocab = {chr(0x100 + i): i for i in range(6)}
    vocab["<s>"] = 6
    (root / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab, "merges": []}}))
    return root


def test_gguf_converted_once_and_quantised(tmp_path):
    tree = llama_cpp.find(str(fake_tree(tmp_path / "llama")))
    ckpt = fake_checkpoint(tmp_path / "ckpt")
    work = tmp_path / "gguf"
    q4 = llama_cpp.gguf(tree, ckpt, "Q4_0", work, log=lambda m: None)
    assert q4.read_text() == "gguf f32 -> Q4_0"
    q8 = llama_cpp.gguf(tree, ckpt, "Q8_0", work, log=lambda m: None)
    assert llama_cpp.gguf(tree, ckpt, "Q4_0", work, log=lambda m: None) == q4  # cached
    assert q8.read_text() == "gguf f32 -> Q8_0"
    bf16 = llama_cpp.gguf(tree, ckpt, "BF16", work, log=lambda m: None)
    assert bf16.read_text() == "gguf bf16"  # the converter writes BF16 itself
    calls = (tmp_path / "llama" / "calls.log").read_text().split("\n")
    assert calls[:3] == ["convert checkpoint f32 pre=gpt-2", "quantize Q4_0", "quantize Q8_0"]
    assert calls[3] == "convert checkpoint bf16 pre=gpt-2"
    # The checkpoint itself is untouched (the merge is in a copy).
    assert json.loads((ckpt / "tokenizer.json").read_text())["model"]["merges"] == []


@pytest.mark.parametrize("depth", [True, False], ids=["llama-bench with -d", "older llama-bench"])
def test_run_bench_reads_prefill_and_decode(tmp_path, depth):
    """Prefill from an empty context; decode after the prompt's tokens (-d)
    where llama-bench has it, as HinaMoE's decode is timed."""
    tree = llama_cpp.find(str(fake_tree(tmp_path / "llama", pp=812.5, tg=199.25, depth=depth)))
    r = llama_cpp.run_bench(tree, tmp_path / "m.gguf", 64, 16, 2, reps=1)
    assert r["prefill_tokens_per_s"] == 812.5 and r["decode_tokens_per_s"] == 199.25
    assert all(c[c.index("-t") + 1] == "2" for c in r["commands"]) and r["build"] == "fake (1)"
    calls = (tmp_path / "llama" / "build" / "bin" / "llama-bench.log").read_text().split()
    assert calls == ["p=64", "n=0", "d=0", "p=0", "n=16", f"d={64 if depth else 0}"]
    assert r["decode_depth"] == (64 if depth else 0)


def test_missing_tree_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv("HINAMOE_LLAMA_CPP", raising=False)
    with pytest.raises(ValueError, match="--llama-cpp DIR"):
        llama_cpp.find(None)
    (tmp_path / "t").mkdir()
    with pytest.raises(ValueError, match="llama-bench"):
        llama_cpp.find(str(tmp_path / "t"))


def test_precision_of_models(tmp_path, rng):
    import onnx

    from hinamoe.models import MoEConfig, QMoEConfig, build_moe_model, build_qmoe_model

    cases = {"int4": build_qmoe_model(QMoEConfig(hidden=32, inter=16, experts=2, k=1, bits=4), rng)[0],
             "int8": build_qmoe_model(QMoEConfig(hidden=32, inter=16, experts=2, k=1, bits=8), rng)[0],
             "bf16": build_moe_model(MoEConfig(hidden=32, inter=16, experts=2, k=1, dtype="bfloat16"), rng=rng)[0],
             "fp32": build_moe_model(MoEConfig(hidden=32, inter=16, experts=2, k=1), rng=rng)[0]}
    for want, model in cases.items():
        d = tmp_path / want
        d.mkdir()
        onnx.save(model, str(d / "model.onnx"))
        assert llama_cpp.precision_of(d) == want


def test_decode_with_llama_cpp_rounds(tmp_path, tiny_export, capsys):
    pytest.importorskip("optimum.onnxruntime")
    from hinamoe.bench.cli import main

    exp = tiny_export.fused("qwen3_moe")
    tree = fake_tree(tmp_path / "llama", pp=500.0, tg=100.0)
    out = tmp_path / "d.json"
    argv = ["decode", str(exp.model.parent), "--prompt", "6", "--new-tokens", "3", "--rounds", "2", "--threads", "1",
            "--no-profile", "--llama-cpp", str(tree), "--checkpoint", str(exp.checkpoint),
            "--gguf-dir", str(tmp_path / "gguf"), "--json", str(out)]
    assert main(argv) == 0
    res = json.loads(out.read_text())
    lc = res["llama_cpp"]
    assert lc["gguf_type"] == "F32" and len(lc["rounds"]) == 2
    assert lc["summary"] == {"prefill_tokens_per_s": 500.0, "decode_tokens_per_s": 100.0}
    h = res["eps"]["HinaMoE"]["summary"]
    assert res["decode_vs_llama_cpp"] == pytest.approx(h["decode_tokens_per_s"] / 100.0)
    assert res["prefill_vs_llama_cpp"] == pytest.approx(h["prefill_tokens_per_s"] / 500.0)
    assert "vs llama.cpp: decode" in capsys.readouterr().out
    # --llama-cpp without the checkpoint: a clear error before any round.
    assert main(argv[:argv.index("--checkpoint")] + ["--gguf-dir", str(tmp_path / "gguf")]) == 2
    assert "--checkpoint HF_DIR" in capsys.readouterr().err
