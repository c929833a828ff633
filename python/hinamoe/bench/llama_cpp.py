"""llama.cpp as the whole-model peer of ``hina-bench decode``: the same HF
checkpoint converted with llama.cpp's own ``convert_hf_to_gguf.py``,
quantised with ``llama-quantize --pure`` to the type matching HinaMoE's
precision, and timed with ``llama-bench`` (prefill = pp, decode = tg).

llama.cpp is not a dependency: point ``--llama-cpp`` (or
``$HINAMOE_LLAMA_CPP``) at a source tree with a build (``build/bin``), e.g.
the one vendored in the llama-cpp-python sdist (docs/benchmarks.md says how
to build it).

Random-weight checkpoints (hinamoe.models.hf_real_shape) carry a byte-level
BPE tokenizer the converter does not recognise: the conversion runs in a
subprocess in which an unknown pre-tokenizer is taken as GPT-2's, from a copy
of the checkpoint folder (weights linked) whose tokenizer has one merge (the
last single-character token renamed to the merge of the first two), as
llama.cpp's BPE loader wants at least one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# HinaMoE precision -> the llama.cpp type with the same bits.
GGUF_TYPES = {"int4": "Q4_0", "int8": "Q8_0", "bf16": "BF16", "fp16": "F16", "fp32": "F32"}

# Runs convert_hf_to_gguf.py with an unknown BPE pre-tokenizer taken as GPT-2's.
_CONVERT = r"""
import runpy, sys
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, str(__import__("pathlib").Path(script).parent))
from conversion import base
_orig = base.TextModel.get_vocab_base_pre
def _pre(self, tokenizer):
    try:
        return _orig(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"
base.TextModel.get_vocab_base_pre = _pre
runpy.run_path(script, run_name="__main__")
"""


@dataclass
class LlamaCpp:
    root: Path

    @property
    def bench(self) -> Path:
        return self.root / "build" / "bin" / "llama-bench"

    @property
    def quantize(self) -> Path:
        return self.root / "build" / "bin" / "llama-quantize"

    @property
    def convert(self) -> Path:
        return self.root / "convert_hf_to_gguf.py"


def find(path: str | None) -> LlamaCpp:
    """The llama.cpp tree at `path` (or $HINAMOE_LLAMA_CPP), or ValueError saying what is missing."""
    root = path or os.environ.get("HINAMOE_LLAMA_CPP")
    if not root:
        raise ValueError("no llama.cpp tree: give --llama-cpp DIR or set HINAMOE_LLAMA_CPP")
    lc = LlamaCpp(Path(root))
    missing = [str(p) for p in (lc.bench, lc.quantize, lc.convert) if not p.is_file()]
    if missing:
        raise ValueError(f"llama.cpp tree {root}: missing {', '.join(missing)} (build llama-bench and "
                         "llama-quantize into build/bin: docs/benchmarks.md)")
    return lc


def _checkpoint_key(ckpt: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(ckpt.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:16]


def _convertible_copy(ckpt: Path, dst: Path) -> Path:
    """ckpt with its files linked and a tokenizer.json that has a merge."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in ckpt.iterdir():
        target = dst / f.name
        if f.is_file() and not target.exists() and f.name != "tokenizer.json":
            os.symlink(f.resolve(), target)
    tok_path = ckpt / "tokenizer.json"
    if tok_path.is_file():
        tok = json.loads(tok_path.read_text())
        model = tok.get("model", {})
        if model.get("type") == "BPE" and not model.get("merges"):
            # The last one-character token becomes the merge of the first two
            # (ids and vocabulary size stay; llama-bench never tokenises text).
            vocab = model.get("vocab", {})
            singles = sorted((i, t) for t, i in vocab.items() if len(t) == 1)
            if len(singles) >= 3:
                (_, a), (_, b), (last_id, last) = singles[0], singles[1], singles[-1]
                del vocab[last]
                vocab[a + b] = last_id
                model["merges"] = [f"{a} {b}"]
        (dst / "tokenizer.json").write_text(json.dumps(tok))
    return dst


def gguf(lc: LlamaCpp, checkpoint: str | Path, gguf_type: str, workdir: str | Path, log=print) -> Path:
    """The checkpoint as GGUF of `gguf_type` (Q4_0, Q8_0, BF16, F16, F32),
    converted and quantised once per checkpoint state into workdir."""
    ckpt = Path(checkpoint)
    if not (ckpt / "config.json").is_file():
        raise ValueError(f"{ckpt} is not a HF checkpoint folder (no config.json)")
    work = Path(workdir) / f"{ckpt.name}-{_checkpoint_key(ckpt)}"
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"model-{gguf_type}.gguf"
    if out.is_file():
        return out
    base_type = "bf16" if gguf_type == "BF16" else "f32"
    base = work / f"model-{base_type}.gguf"
    if not base.is_file():
        log(f"llama.cpp: converting {ckpt} to GGUF ({base_type})")
        src = _convertible_copy(ckpt, work / "checkpoint")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(lc.root / "gguf-py"), os.environ.get("PYTHONPATH", "")])}
        r = subprocess.run([sys.executable, "-c", _CONVERT, str(lc.convert), str(src), "--outfile", str(base),
                            "--outtype", base_type], env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{r.stderr[-3000:]}")
    if gguf_type.lower() == base_type:
        return base
    log(f"llama.cpp: llama-quantize --pure {gguf_type}")
    r = subprocess.run([str(lc.quantize), "--pure", str(base), str(out), gguf_type], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"llama-quantize failed:\n{r.stderr[-3000:]}")
    return out


@functools.lru_cache(maxsize=None)
def _has_depth(bench: Path) -> bool:
    """Whether this llama-bench takes -d (--n-depth, mid-2025 on); asked
    once per binary, not every round."""
    r = subprocess.run([str(bench), "--help"], capture_output=True, text=True)
    return "--n-depth" in r.stdout + r.stderr


def run_bench(lc: LlamaCpp, model: Path, prompt: int, new_tokens: int, threads: int, reps: int = 3,
              extra: list[str] | None = None) -> dict:
    """llama-bench's prefill (pp) and decode (tg) tokens/s: mean and stddev
    over `reps` repetitions, as llama-bench reports them. Two runs: the
    prompt from an empty context, then the new tokens after `prompt` tokens
    of context (-d), as HinaMoE decodes them; a llama-bench without -d
    decodes from an empty context (`decode_depth` 0 then)."""
    base = [str(lc.bench), "-m", str(model), "-t", str(threads), "-r", str(reps), "-o", "json", *(extra or [])]
    depth = prompt if _has_depth(lc.bench) else 0
    runs = [base + ["-p", str(prompt), "-n", "0"],
            base + ["-p", "0", "-n", str(new_tokens)] + (["-d", str(depth)] if depth else [])]
    out: dict = {"commands": runs, "decode_depth": depth}
    for cmd in runs:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"llama-bench failed ({' '.join(cmd)}):\n{r.stderr[-3000:]}")
        for test in json.loads(r.stdout):
            key = "prefill" if test.get("n_prompt", 0) > 0 else "decode"
            out[f"{key}_tokens_per_s"] = test["avg_ts"]
            out[f"{key}_tokens_per_s_stddev"] = test["stddev_ts"]
            out["build"] = f"{test.get('build_commit', '?')} ({test.get('build_number', '?')})"
            out["cpu_info"] = test.get("cpu_info")
    return out


def precision_of(folder: str | Path) -> str | None:
    """int4 / int8 (QMoE bits), bf16 / fp16 / fp32 (MoE expert weights) of
    a model folder's model.onnx, or None without MoE nodes."""
    import onnx

    model = onnx.load(str(Path(folder) / "model.onnx"), load_external_data=False)
    types = {onnx.TensorProto.BFLOAT16: "bf16", onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.FLOAT: "fp32"}
    inits = {t.name: t.data_type for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "QMoE":
            bits = next((a.i for a in node.attribute if a.name == "expert_weight_bits"), 4)
            return f"int{bits}"
        if node.op_type == "MoE" and len(node.input) > 2:
            return types.get(inits.get(node.input[2]), "fp32")
    return None
