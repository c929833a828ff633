"""``hina-bench decode``: whole-model prefill and decode speed of a model
folder, HinaMoE against ONNX Runtime's CPU EP. The clients that load and
generate (genai's loop, optimum's generate) are in decode_genai.py and
decode_optimum.py; timing rounds, profile breakdown, report and plot here."""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .. import __version__
from . import llama_cpp
from ..serve.model_folder import is_export_folder
from .machine import cpu_name, hinamoe_tier
from .quiet import OtherLoad

NAME = "decode"
HELP = "whole-model prefill/decode tokens/s of a genai or hina-export model folder (HinaMoE vs ORT CPU EP)"
DESCRIPTION = """\
Greedy generation of one model folder on HinaMoE (strict: every MoE and
GroupQueryAttention node on HinaMoE, or the load fails) and on ONNX
Runtime's CPU EP, the two alternating round by round in one run so both see
the same machine state. Two clients, picked from the folder (or --client):

  genai    a folder with genai_config.json (onnxruntime-genai's model
           builder, and hina-export's fused output): genai's generate loop
           (hinamoe.genai)
  optimum  model.onnx + config.json (hina-export's output, where
           onnxruntime-genai is not installed):
           hinamoe.export.load_causal_lm(...).generate()

--client serve times any folder hina-serve reads (hina-export, tiny_lm, genai
folders with plain KV caches) through hinamoe.serve's runner, hina-serve's
own decode loop: one ONNX Runtime call per token, no framework around it
(optimum's generate adds about a millisecond of Python per token).

Per round and EP: a prompt of --prompt random token ids, then --new-tokens
greedy tokens (EOS cannot end it early: min length = max length; genai's
max_length at least the sliding window, which sizes the window buffers).
prefill tokens/s = prompt tokens / time of the prompt's forward and first
token; decode: the time of every later token, reported as the median ms
per token, its 10th/90th percentiles, and tokens/s = 1000 / median ms;
per round also the cores other processes kept busy meanwhile. The model is
loaded before the timed part and released after each round (memory for
one model at a time).

Then one more profiled generation per EP (ORT profiling; not timed): the
time of every node by op type -- MoE/QMoE, GroupQueryAttention,
MatMul/MatMulNBits, the rest -- for the prompt and per decoded token, and
which EP ran each group.

--cpu-model gives the CPU EP another folder of the same model, e.g. the
fp32 original of a copy whose experts are bf16 (which the CPU EP cannot
run; python -m hinamoe.export.convert makes such copies).

With --llama-cpp DIR and --checkpoint HF_DIR (the checkpoint MODEL was
exported from), llama.cpp runs the same weights in the same run: the
checkpoint converted by llama.cpp's convert_hf_to_gguf.py, quantised with
llama-quantize --pure to the type of MODEL's precision (int4 -> Q4_0, int8
-> Q8_0, bf16 -> BF16, fp16 -> F16, fp32 -> F32; --gguf-type to choose),
timed by llama-bench at its defaults (one repetition per round, -t
THREADS: the prompt with -p PROMPT, the decode with -n NEW_TOKENS -d PROMPT,
i.e. after the prompt's tokens of context as HinaMoE decodes) between the
ONNX Runtime rounds; ratios "vs llama.cpp" = HinaMoE tokens/s / llama.cpp
tokens/s.

Needs onnxruntime-genai for genai folders (and, for the builder,
transformers 5), the export extra for hina-export folders.

Examples:
  hina-bench decode gptoss-genai --prompt 128 --new-tokens 64 --rounds 5 --threads 2
  hina-bench decode gptoss-genai-bf16 --cpu-model gptoss-genai --json decode.json --plot decode.png
  hina-bench decode qwen3-export --client optimum
  hina-bench decode qwen3-int4 --checkpoint qwen3-hf --llama-cpp ~/llama.cpp --prompt 512
"""

OP_GROUPS = (("MoE/QMoE", ("MoE", "QMoE")), ("GroupQueryAttention", ("GroupQueryAttention",)),
             ("MatMul/MatMulNBits", ("MatMul", "MatMulNBits", "Gemm")))
EPS = ("HinaMoE", "CPU")
# A node inside decoder layer N: "/model/layers.N/..." (genai's builder and optimum's export).
LAYER = re.compile(r"layers[./_](\d+)[./_]")
CLIENTS = {"genai": ".decode_genai", "optimum": ".decode_optimum", "serve": ".decode_serve"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model folder: onnxruntime-genai (genai_config.json) or hina-export "
                                 "(model.onnx + config.json)")
    p.add_argument("--client", choices=("auto", *CLIENTS), default="auto",
                   help="genai (genai's generate loop) or optimum (load_causal_lm + generate); "
                        "default: from the folder's files")
    p.add_argument("--cpu-model", default=None,
                   help="folder the CPU EP runs instead of MODEL (same model, e.g. its fp32 original)")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens (default 128)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens to generate (default 64)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per EP (default 3)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    p.add_argument("--isa", default="auto", help="HinaMoE isa option (default auto)")
    p.add_argument("--seed", type=int, default=0, help="prompt token seed")
    p.add_argument("--no-profile", action="store_true", help="skip the profiled op breakdown")
    p.add_argument("--llama-cpp", default=None, metavar="DIR",
                   help="llama.cpp source tree with build/bin/llama-bench and llama-quantize (or "
                        "$HINAMOE_LLAMA_CPP): time llama.cpp on the same checkpoint (needs --checkpoint)")
    p.add_argument("--checkpoint", default=None, metavar="HF_DIR",
                   help="the HF checkpoint MODEL was exported from (for --llama-cpp)")
    p.add_argument("--gguf-type", default=None, choices=sorted(set(llama_cpp.GGUF_TYPES.values())),
                   help="llama.cpp type (default: the one matching MODEL's precision)")
    p.add_argument("--gguf-dir", default=None, help="where converted GGUF files are kept (default: "
                                                    "~/.cache/hinamoe/gguf)")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--plot", default=None, help="write a plot here (needs matplotlib)")


def _progress(iterable, total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, file=sys.stderr)


def detect_client(path: str | Path) -> str:
    """The client a model folder needs: genai (genai_config.json: the
    builder's folders, and hina-export's where onnxruntime-genai is
    installed) or optimum (model.onnx + config.json, hina-export's output)."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path} is not a folder")
    if (path / "genai_config.json").is_file():
        if not is_export_folder(path) or importlib.util.find_spec("onnxruntime_genai") is not None:
            return "genai"
    if is_export_folder(path):
        return "optimum"
    raise ValueError(f"{path}: neither an onnxruntime-genai folder (genai_config.json) nor a hina-export "
                     "folder (model.onnx + config.json)")


def _client_module(name: str):
    """The client's module, or an error naming what is missing."""
    mod = importlib.import_module(CLIENTS[name], __package__)
    try:
        if name == "genai":
            import onnxruntime_genai  # noqa: F401
        elif name == "optimum":
            import optimum.onnxruntime  # noqa: F401
            import torch  # noqa: F401
    except ImportError as e:
        raise ImportError(f"the {name} client needs {mod.NEEDS} ({e})") from None
    return mod


def _check_files(name: str, path: Path) -> None:
    if name == "serve":
        return  # the client reads the folder and names what is wrong
    want = ["genai_config.json"] if name == "genai" else ["model.onnx", "config.json"]
    missing = [f for f in want if not (path / f).is_file()]
    if missing:
        raise ValueError(f"--client {name}: {path} has no {', '.join(missing)}")


def op_breakdown(profile_path: str | Path) -> dict:
    """Node time by op group from an ORT profile: the first model run (the
    prompt) and the mean per later run (one decoded token), in ms, plus the
    EPs each group ran on, the decoder layers seen (node names with
    ``layers.N``) and the decode time of the nodes outside them (embedding,
    LM head, mask arithmetic), which does not grow with depth."""
    with open(profile_path) as f:
        events = json.load(f)
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session" and e["name"] == "model_run")
    out = {"prefill_ms": {}, "decode_ms_per_token": {}, "providers": {}, "layers": 0,
           "decode_ms_per_token_outside_layers": {}, "decode_ms_per_token_by_provider": {}}
    if not runs:
        return out
    group_of = {op: g for g, ops in OP_GROUPS for op in ops}
    nodes = [e for e in events if e.get("cat") == "Node" and "op_name" in e.get("args", {})]

    def layer_of(e) -> int | None:
        m = LAYER.search(e["name"])
        return int(m.group(1)) if m else None

    # A layer is an index with attention or experts in it (genai's builder
    # names the final norm "layers.<n_layers>/final_norm_layernorm").
    layers = {layer_of(e) for e in nodes if group_of.get(e["args"]["op_name"]) in ("MoE/QMoE", "GroupQueryAttention")}
    layers.discard(None)
    if not layers:
        layers = {i for i in map(layer_of, nodes) if i is not None}
    prefill, decode, outside, providers, by_provider = {}, {}, {}, {}, {}
    for e in nodes:
        args = e["args"]
        group = group_of.get(args["op_name"], "other")
        layer = layer_of(e) in layers
        ms = e["dur"] / 1000.0
        if runs[0][0] <= e["ts"] <= runs[0][1]:
            prefill[group] = prefill.get(group, 0.0) + ms
        else:
            decode[group] = decode.get(group, 0.0) + ms
            provider = args.get("provider", "?")
            by_provider[provider] = by_provider.get(provider, 0.0) + ms
            if not layer:
                outside[group] = outside.get(group, 0.0) + ms
        providers.setdefault(group, set()).add(args.get("provider", "?"))
    n_decode = max(1, len(runs) - 1)
    out["prefill_ms"] = prefill
    out["decode_ms_per_token"] = {g: v / n_decode for g, v in decode.items()}
    out["providers"] = {g: sorted(p) for g, p in providers.items()}
    out["layers"] = len(layers)
    out["decode_ms_per_token_outside_layers"] = {g: v / n_decode for g, v in outside.items()}
    out["decode_ms_per_token_by_provider"] = {p: v / n_decode for p, v in by_provider.items()}
    return out


def ms_per_token_at_depth(ep_result: dict, depth: int) -> float | None:
    """Estimated decode ms per token of the same model with `depth` layers:
    the measured median, with the profiled time of the nodes inside the
    layers scaled by depth / layers (the rest -- nodes outside the layers,
    and the client's own time per token -- kept as measured)."""
    ops = ep_result.get("ops")
    if not ops or not ops.get("layers"):
        return None
    inside = sum(ops["decode_ms_per_token"].values()) - sum(ops["decode_ms_per_token_outside_layers"].values())
    return ep_result["summary"]["decode_ms_median"] + inside * (depth / ops["layers"] - 1.0)


def _summary(rounds: list[dict], prompt_len: int) -> dict:
    steps = [s for r in rounds for s in r["decode_ms"]]
    q = np.percentile(steps, [10, 50, 90]) if steps else [float("nan")] * 3
    prefill_s = statistics.median(r["prefill_s"] for r in rounds)
    return {"prefill_tokens_per_s": prompt_len / prefill_s, "prefill_s_median": prefill_s,
            "decode_ms_p10": float(q[0]), "decode_ms_median": float(q[1]), "decode_ms_p90": float(q[2]),
            "decode_tokens_per_s": 1000.0 / float(q[1])}


class LoadError(RuntimeError):
    pass


def _load(client, ep: str, args, profile_prefix: str | None = None):
    try:
        return client.load(ep, args.threads, args.isa, profile_prefix=profile_prefix)
    except Exception as e:  # noqa: BLE001 -- ORT / genai errors, with what to do
        hint = "" if ep == "HinaMoE" else (" (a model whose MoE experts are bf16 needs --cpu-model with its"
                                           " fp32 original: the CPU EP has no bf16 MoE)")
        raise LoadError(f"{ep} could not load {client.path}: {e}{hint}") from e


def run(args) -> int:
    try:
        return _run(args)
    except LoadError as e:
        print(f"hina-bench decode: {e}", file=sys.stderr)
        return 1


def _run(args) -> int:
    paths = {"HinaMoE": Path(args.model), "CPU": Path(args.cpu_model or args.model)}
    try:
        if args.prompt < 1 or args.new_tokens < 2 or args.rounds < 1 or args.threads < 1:
            raise ValueError("--prompt, --rounds and --threads must be >= 1, --new-tokens >= 2")
        if args.plot and importlib.util.find_spec("matplotlib") is None:
            # Say so before minutes of generation, not after.
            raise ValueError("--plot needs matplotlib (pip install matplotlib, or hinamoe[bench])")
        name = detect_client(paths["HinaMoE"]) if args.client == "auto" else args.client
        for p in paths.values():
            _check_files(name, p)
        mod = _client_module(name)
        clients = {ep: mod.Client(p) for ep, p in paths.items()}
        if clients["HinaMoE"].vocab_size != clients["CPU"].vocab_size:
            raise ValueError(f"--cpu-model has vocabulary {clients['CPU'].vocab_size}, "
                             f"{args.model} {clients['HinaMoE'].vocab_size}: not the same model")
        llama = _llama_setup(args, paths["HinaMoE"])
    except (ValueError, ImportError, RuntimeError) as e:
        print(f"hina-bench decode: {e}", file=sys.stderr)
        return 2
    if hinamoe_tier(args.isa) is None:  # says why
        return 2
    rng = np.random.default_rng(args.seed)
    prompt = rng.integers(0, min(clients["HinaMoE"].vocab_size, 256), size=args.prompt)
    rounds = {ep: [] for ep in EPS}
    tokens = {}
    sides = EPS + (("llama.cpp",) if llama else ())
    order = [(i, ep) for i in range(args.rounds) for ep in (sides if i % 2 == 0 else sides[::-1])]
    llama_rounds = []
    for i, ep in _progress(order, len(order), "decode rounds"):
        if ep == "llama.cpp":
            load = OtherLoad(children_are_ours=True)
            r = llama_cpp.run_bench(llama["tree"], llama["gguf"], args.prompt, args.new_tokens, args.threads, reps=1)
            llama_rounds.append({"round": i, **r, "other_cores": load.cores_used()})
            continue
        c = clients[ep]
        handle = _load(c, ep, args)
        load = OtherLoad()
        t_prompt, steps, toks = c.generate(handle, prompt, args.new_tokens)
        others = load.cores_used()
        c.release(handle)
        gc.collect()
        rounds[ep].append({"round": i, "prefill_s": t_prompt, "decode_ms": [s * 1000.0 for s in steps],
                           "other_cores": others})
        tokens[ep] = toks
    result = {
        "meta": {"hinamoe": __version__, "cpu": cpu_name(), "model": str(paths["HinaMoE"]), "client": name,
                 "cpu_model": str(paths["CPU"]), "prompt": args.prompt, "new_tokens": args.new_tokens,
                 "rounds": args.rounds, "threads": args.threads, "isa": args.isa,
                 "time": time.strftime("%Y-%m-%d %H:%M:%S")},
        "same_tokens": tokens["HinaMoE"] == tokens["CPU"],
        "prompt_ids": [int(t) for t in prompt],
        "tokens": tokens,  # each EP's last round
        "eps": {ep: {"summary": _summary(rounds[ep], args.prompt), "rounds": rounds[ep]} for ep in EPS},
    }
    if not args.no_profile:
        with tempfile.TemporaryDirectory() as tmp:
            for ep in _progress(EPS, len(EPS), "profiled runs"):
                c = clients[ep]
                handle = _load(c, ep, args, profile_prefix=str(Path(tmp) / ep))
                c.generate(handle, prompt, args.new_tokens)
                profile = c.release(handle)
                gc.collect()
                if profile is None:
                    raise RuntimeError(f"{ep}: ONNX Runtime wrote no profile")
                result["eps"][ep]["ops"] = op_breakdown(profile)
    h, c = (result["eps"][ep]["summary"] for ep in EPS)
    result["decode_speedup"] = h["decode_tokens_per_s"] / c["decode_tokens_per_s"]
    result["prefill_speedup"] = h["prefill_tokens_per_s"] / c["prefill_tokens_per_s"]
    if llama:
        med = {k: statistics.median(r[f"{k}_tokens_per_s"] for r in llama_rounds) for k in ("prefill", "decode")}
        result["llama_cpp"] = {"gguf": str(llama["gguf"]), "gguf_type": llama["type"], "rounds": llama_rounds,
                               "summary": {"prefill_tokens_per_s": med["prefill"], "decode_tokens_per_s": med["decode"]},
                               "build": llama_rounds[-1].get("build"),
                               "decode_depth": llama_rounds[-1].get("decode_depth", 0)}
        result["decode_vs_llama_cpp"] = h["decode_tokens_per_s"] / med["decode"]
        result["prefill_vs_llama_cpp"] = h["prefill_tokens_per_s"] / med["prefill"]
    _print(result)
    busiest = max([r.get("other_cores") or 0.0 for ep in EPS for r in rounds[ep]] +
                  [r.get("other_cores") or 0.0 for r in llama_rounds], default=0.0)
    warning = OtherLoad.warning(busiest)
    if warning:
        print(warning.replace("this run", "a round (other_cores per round in the JSON)"), file=sys.stderr)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    if args.plot:
        _plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _print(result: dict) -> None:
    m = result["meta"]
    cpu = f" (CPU EP: {m['cpu_model']})" if m["cpu_model"] != m["model"] else ""
    print(f"{m['model']}{cpu}, {m['client']} client: prompt {m['prompt']}, {m['new_tokens']} new tokens, "
          f"{m['rounds']} rounds, {m['threads']} threads, {m['cpu']}")
    print(f"{'EP':8} {'prefill tok/s':>14} {'decode tok/s':>13} {'ms/token p10/p50/p90':>24}")
    for ep, r in result["eps"].items():
        s = r["summary"]
        print(f"{ep:8} {s['prefill_tokens_per_s']:14.1f} {s['decode_tokens_per_s']:13.2f} "
              f"{s['decode_ms_p10']:8.2f}/{s['decode_ms_median']:.2f}/{s['decode_ms_p90']:.2f}")
    lc = result.get("llama_cpp")
    if lc:
        s = lc["summary"]
        print(f"{'llama.cpp':8} {s['prefill_tokens_per_s']:14.1f} {s['decode_tokens_per_s']:13.2f} "
              f"{'(' + lc['gguf_type'] + ', llama-bench)':>24}")
        if lc.get("decode_depth", 0) != result["meta"]["prompt"]:
            print(f"  note: this llama-bench has no -d: its decode starts from an empty context, "
                  f"HinaMoE's after {result['meta']['prompt']} tokens")
    print(f"decode speed-up {result['decode_speedup']:.2f}x, prefill {result['prefill_speedup']:.2f}x, "
          f"same tokens: {result['same_tokens']}")
    if lc:
        print(f"vs llama.cpp: decode {result['decode_vs_llama_cpp']:.2f}x, prefill {result['prefill_vs_llama_cpp']:.2f}x")
    for ep, r in result["eps"].items():
        ops = r.get("ops")
        if not ops:
            continue
        per_tok = ops["decode_ms_per_token"]
        parts = ", ".join(f"{g} {v:.3f} ms ({'/'.join(ops['providers'].get(g, []))})" for g, v in
                          sorted(per_tok.items(), key=lambda kv: -kv[1]))
        print(f"{ep} per decoded token: {parts}")
        by_ep = ops.get("decode_ms_per_token_by_provider", {})
        total = sum(by_ep.values())
        if ep == "HinaMoE" and total > 0:
            outside = total - by_ep.get("HinaMoE", 0.0)
            print(f"  nodes outside HinaMoE: {outside:.3f} ms per decoded token, {100 * outside / total:.0f}% of the "
                  "node time")


def _llama_setup(args, model: Path) -> dict | None:
    """The llama.cpp side (tree, GGUF file, type), or None without --llama-cpp."""
    if not args.llama_cpp and not args.checkpoint:
        return None
    if not args.checkpoint:
        raise ValueError("--llama-cpp needs --checkpoint HF_DIR (the checkpoint the model was exported from)")
    tree = llama_cpp.find(args.llama_cpp)
    kind = args.gguf_type
    if kind is None:
        prec = llama_cpp.precision_of(model) if (model / "model.onnx").is_file() else None
        if prec is None:
            raise ValueError(f"cannot tell {model}'s precision (no MoE/QMoE node): give --gguf-type")
        kind = llama_cpp.GGUF_TYPES[prec]
    workdir = args.gguf_dir or Path.home() / ".cache" / "hinamoe" / "gguf"
    gguf = llama_cpp.gguf(tree, args.checkpoint, kind, workdir, log=lambda m: print(m, file=sys.stderr))
    return {"tree": tree, "gguf": gguf, "type": kind}


def _plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    eps = list(result["eps"])
    sides = eps + (["llama.cpp"] if "llama_cpp" in result else [])
    summaries = [result["eps"][ep]["summary"] for ep in eps] + ([result["llama_cpp"]["summary"]] if "llama_cpp" in result else [])
    ax1.bar(sides, [s["decode_tokens_per_s"] for s in summaries], color=["C0", "C1", "C2"][:len(sides)])
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
