"""``hina-bench decode``: whole-model prefill and decode speed of an
onnxruntime-genai model folder, HinaMoE against ONNX Runtime's CPU EP."""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .. import __version__
from .common import cpu_name

NAME = "decode"
HELP = "whole-model prefill/decode tokens/s of a genai model folder (HinaMoE vs ORT CPU EP)"
DESCRIPTION = """\
Greedy generation through onnxruntime-genai on one model folder (the genai
model builder's output, or any folder with a genai_config.json), on HinaMoE
(hinamoe.genai, strict) and on ONNX Runtime's CPU EP, the two alternating
round by round in one run so both see the same machine state.

Per round and EP: a prompt of --prompt random token ids, then --new-tokens
greedy tokens (EOS suppressed; genai's max_length at least the sliding
window, which sizes the window buffers). prefill tokens/s = prompt tokens / time of
the prompt call; decode: the time of every later generate_next_token()
(one token each), reported as the median ms per token, its 10th/90th
percentiles, and tokens/s = 1000 / median ms. The model is loaded before
the timed part and released after each round (memory for one model at a
time).

Then one more profiled generation per EP (ORT profiling; not timed): the
time of every node by op type -- MoE/QMoE, GroupQueryAttention,
MatMul/MatMulNBits, the rest -- for the prompt and per decoded token, and
which EP ran each group.

Needs onnxruntime-genai (and, for the builder, transformers 5).

Examples:
  hina-bench decode gptoss-genai --prompt 128 --new-tokens 64 --rounds 5 --threads 2
  hina-bench decode model-dir --json decode.json --plot decode.png
"""

OP_GROUPS = (("MoE/QMoE", ("MoE", "QMoE")), ("GroupQueryAttention", ("GroupQueryAttention",)),
             ("MatMul/MatMulNBits", ("MatMul", "MatMulNBits", "Gemm")))
EPS = ("HinaMoE", "CPU")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="onnxruntime-genai model folder")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens to generate (default 64)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per EP (default 3)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    p.add_argument("--isa", default="auto", help="HinaMoE isa option (default auto)")
    p.add_argument("--seed", type=int, default=0, help="prompt token seed")
    p.add_argument("--no-profile", action="store_true", help="skip the profiled op breakdown")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--plot", default=None, help="write a plot here (needs matplotlib)")


def _progress(iterable, total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, file=sys.stderr)


def _model(path: str, ep: str, threads: int, isa: str, profile_prefix: str | None = None):
    import onnxruntime_genai as og

    import hinamoe.genai

    session = {"intra_op_num_threads": threads}
    if profile_prefix is not None:
        session["enable_profiling"] = profile_prefix
    if ep == "HinaMoE":
        cfg = hinamoe.genai.config(path, isa=isa)
    else:
        cfg = og.Config(path)
        cfg.clear_providers()
    cfg.overlay(json.dumps({"model": {"decoder": {"session_options": session}}}))
    return og.Model(cfg)


def _generate(model, prompt: np.ndarray, new_tokens: int, min_max_length: int = 0):
    """Greedy generation; (prompt seconds, [seconds per later token], tokens).
    min_max_length: a floor for genai's max_length, which also sizes the
    window buffers of sliding layers (ORT refuses one below the window)."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    total = prompt.size + new_tokens
    params.set_search_options(max_length=max(total, min_max_length), min_length=total, do_sample=False)
    gen = og.Generator(model, params)
    t0 = time.perf_counter()
    gen.append_tokens(prompt[None, :].astype(np.int32))
    gen.generate_next_token()  # the first new token comes from the prompt's logits
    t_prompt = time.perf_counter() - t0
    steps = []
    while len(steps) < new_tokens - 1 and not gen.is_done():
        t = time.perf_counter()
        gen.generate_next_token()
        steps.append(time.perf_counter() - t)
    tokens = [int(x) for x in gen.get_sequence(0)[prompt.size:total]]
    del gen
    return t_prompt, steps, tokens


def op_breakdown(profile_path: str | Path) -> dict:
    """Node time by op group from an ORT profile: the first model run (the
    prompt) and the mean per later run (one decoded token), in ms, plus the
    EPs each group ran on."""
    with open(profile_path) as f:
        events = json.load(f)
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session" and e["name"] == "model_run")
    out = {"prefill_ms": {}, "decode_ms_per_token": {}, "providers": {}}
    if not runs:
        return out
    group_of = {op: g for g, ops in OP_GROUPS for op in ops}
    prefill, decode, providers = {}, {}, {}
    for e in events:
        args = e.get("args", {})
        if e.get("cat") != "Node" or "op_name" not in args:
            continue
        group = group_of.get(args["op_name"], "other")
        target = prefill if runs[0][0] <= e["ts"] <= runs[0][1] else decode
        target[group] = target.get(group, 0.0) + e["dur"] / 1000.0
        providers.setdefault(group, set()).add(args.get("provider", "?"))
    n_decode = max(1, len(runs) - 1)
    out["prefill_ms"] = prefill
    out["decode_ms_per_token"] = {g: v / n_decode for g, v in decode.items()}
    out["providers"] = {g: sorted(p) for g, p in providers.items()}
    return out


def _summary(rounds: list[dict], prompt_len: int) -> dict:
    steps = [s for r in rounds for s in r["decode_ms"]]
    q = np.percentile(steps, [10, 50, 90]) if steps else [float("nan")] * 3
    prefill_s = statistics.median(r["prefill_s"] for r in rounds)
    return {"prefill_tokens_per_s": prompt_len / prefill_s, "prefill_s_median": prefill_s,
            "decode_ms_p10": float(q[0]), "decode_ms_median": float(q[1]), "decode_ms_p90": float(q[2]),
            "decode_tokens_per_s": 1000.0 / float(q[1])}


def run(args) -> int:
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        print("hina-bench decode needs onnxruntime-genai (pip install onnxruntime-genai)", file=sys.stderr)
        return 2
    rng = np.random.default_rng(args.seed)
    genai_cfg = json.loads((Path(args.model) / "genai_config.json").read_text())["model"]
    vocab = genai_cfg["vocab_size"]
    window = genai_cfg.get("decoder", {}).get("sliding_window", {}).get("window_size", 0)
    prompt = rng.integers(0, min(vocab, 256), size=args.prompt)
    rounds = {ep: [] for ep in EPS}
    tokens = {}
    order = [(i, ep) for i in range(args.rounds) for ep in (EPS if i % 2 == 0 else EPS[::-1])]
    for i, ep in _progress(order, len(order), "decode rounds"):
        model = _model(args.model, ep, args.threads, args.isa)
        t_prompt, steps, toks = _generate(model, prompt, args.new_tokens, window)
        del model
        gc.collect()
        rounds[ep].append({"round": i, "prefill_s": t_prompt, "decode_ms": [s * 1000.0 for s in steps]})
        tokens[ep] = toks
    result = {
        "meta": {"hinamoe": __version__, "cpu": cpu_name(), "model": str(args.model), "prompt": args.prompt,
                 "new_tokens": args.new_tokens, "rounds": args.rounds, "threads": args.threads, "isa": args.isa,
                 "time": time.strftime("%Y-%m-%d %H:%M:%S")},
        "same_tokens": tokens["HinaMoE"] == tokens["CPU"],
        "eps": {ep: {"summary": _summary(rounds[ep], args.prompt), "rounds": rounds[ep]} for ep in EPS},
    }
    if not args.no_profile:
        with tempfile.TemporaryDirectory() as tmp:
            for ep in _progress(EPS, len(EPS), "profiled runs"):
                prefix = str(Path(tmp) / ep)
                model = _model(args.model, ep, args.threads, args.isa, profile_prefix=prefix)
                _generate(model, prompt, args.new_tokens, window)
                del model
                gc.collect()
                result["eps"][ep]["ops"] = op_breakdown(next(Path(tmp).glob(ep + "*.json")))
    h, c = (result["eps"][ep]["summary"] for ep in EPS)
    result["decode_speedup"] = h["decode_tokens_per_s"] / c["decode_tokens_per_s"]
    result["prefill_speedup"] = h["prefill_tokens_per_s"] / c["prefill_tokens_per_s"]
    _print(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        _plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _print(result: dict) -> None:
    m = result["meta"]
    print(f"{m['model']}: prompt {m['prompt']}, {m['new_tokens']} new tokens, {m['rounds']} rounds, "
          f"{m['threads']} threads, {m['cpu']}")
    print(f"{'EP':8} {'prefill tok/s':>14} {'decode tok/s':>13} {'ms/token p10/p50/p90':>24}")
    for ep, r in result["eps"].items():
        s = r["summary"]
        print(f"{ep:8} {s['prefill_tokens_per_s']:14.1f} {s['decode_tokens_per_s']:13.2f} "
              f"{s['decode_ms_p10']:8.2f}/{s['decode_ms_median']:.2f}/{s['decode_ms_p90']:.2f}")
    print(f"decode speed-up {result['decode_speedup']:.2f}x, prefill {result['prefill_speedup']:.2f}x, "
          f"same tokens: {result['same_tokens']}")
    for ep, r in result["eps"].items():
        ops = r.get("ops")
        if not ops:
            continue
        per_tok = ops["decode_ms_per_token"]
        parts = ", ".join(f"{g} {v:.3f} ms ({'/'.join(ops['providers'].get(g, []))})" for g, v in
                          sorted(per_tok.items(), key=lambda kv: -kv[1]))
        print(f"{ep} per decoded token: {parts}")


def _plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    eps = list(result["eps"])
    ax1.bar(eps, [result["eps"][ep]["summary"]["decode_tokens_per_s"] for ep in eps], color=["C0", "C1"])
    ax1.set_ylabel("decode tokens/s")
    ax1.set_title(f"decode, {result['meta']['threads']} threads")
    groups = [g for g, _ in OP_GROUPS] + ["other"]
    bottom = np.zeros(len(eps))
    for g in groups:
        vals = np.array([result["eps"][ep].get("ops", {}).get("decode_ms_per_token", {}).get(g, 0.0) for ep in eps])
        ax2.bar(eps, vals, bottom=bottom, label=g)
        bottom += vals
    ax2.set_ylabel("node time per decoded token (ms, ORT profile)")
    ax2.legend(fontsize=8)
    fig.suptitle(Path(result["meta"]["model"]).name)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
