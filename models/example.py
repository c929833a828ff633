"""``python -m hinamoe.models.example``: a small random MoE language model
generating on HinaMoE and on ONNX Runtime's CPU EP, side by side.

Builds the model offline with numpy and onnx (``hinamoe.models.tiny_lm``:
embedding, per layer a fused RMSNorm, packed QKV MatMul,
com.microsoft::GroupQueryAttention with rotary, o_proj MatMul, fused RMSNorm
and a com.microsoft::MoE of float32 SwiGLU experts; final norm and LM head;
random weights), generates greedily from a random prompt on both execution
providers with the KV cache shared between past and present, and prints
prefill and decode tokens per second of each, whether both produced the
same tokens, and where the MoE and GroupQueryAttention nodes ran (ORT's
profile of a short extra run). HinaMoE runs MoE and GroupQueryAttention;
every other node runs on the CPU EP in both sessions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def _fmt_placement(placed: dict[str, list[str]]) -> str:
    ours = [f"{op}: {'+'.join(placed[op])}" for op in ("MoE", "GroupQueryAttention") if op in placed]
    rest: dict[str, list[str]] = {}
    for op, provs in placed.items():
        if op not in ("MoE", "GroupQueryAttention"):
            rest.setdefault("+".join(provs), []).append(op)
    others = "; ".join(f"on {p}: {', '.join(ops)}" for p, ops in rest.items())
    return ", ".join(ours) + (f"; {others}" if others else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hinamoe.models.example",
                                 description=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    from .tiny_lm import add_config_arguments

    add_config_arguments(ap)
    ap.add_argument("--prompt", type=int, default=32, help="prompt tokens (default 32)")
    ap.add_argument("--new-tokens", type=int, default=32,
                    help="tokens to generate (default 32; the first comes from the prompt call)")
    ap.add_argument("--threads", type=int, default=2,
                    help="intra-op threads of both sessions (default 2; 0 = ORT's default)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed generations per EP after a warm-up, alternating EPs; medians shown (default 3)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompt (default 0)")
    ap.add_argument("--isa", default="auto", help="HinaMoE kernel tier (provider option isa, default auto)")
    ap.add_argument("--save", metavar="DIR", help="also write the model folder (model.onnx + tiny_lm.json) to DIR")
    ap.add_argument("--no-profile", action="store_true", help="skip the profiled placement run")
    args = ap.parse_args(argv)

    from .tiny_lm import (Generator, build_tiny_lm, config_from_args, make_session, op_counts,
                          placement, random_prompt, save_tiny_lm, weight_bytes)

    try:
        import hinamoe

        hinamoe.register()
    except Exception as exc:  # noqa: BLE001
        print(f"HinaMoE is not available: {exc}", file=sys.stderr)
        return 1

    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        ap.error(str(exc))
    total = args.prompt + args.new_tokens
    if args.prompt < 1 or args.new_tokens < 1:
        ap.error("--prompt and --new-tokens must be >= 1")
    if total > cfg.max_length:
        ap.error(f"--prompt + --new-tokens = {total} exceeds --max-length {cfg.max_length}")

    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    model, weights = build_tiny_lm(cfg, rng=rng)
    build_s = time.perf_counter() - t0
    prompt = random_prompt(cfg, args.prompt, rng)
    ops = op_counts(model)
    print(f"model: tiny random MoE language model, {cfg.describe()}; "
          f"{weight_bytes(weights) / 2 ** 20:.1f} MiB of float32 weights, built offline in {build_s:.2f} s")
    print(f"graph: {len(model.graph.node)} nodes: "
          + ", ".join(f"{op} {n}" for op, n in sorted(ops.items(), key=lambda kv: -kv[1])))
    if args.save:
        print(f"saved: {save_tiny_lm(args.save, cfg, model)}")
    threads = f"{args.threads} threads" if args.threads else "ORT's default threads"
    print(f"generate: {args.prompt} random prompt tokens, {args.new_tokens} new tokens, greedy, batch 1, "
          f"{threads}; medians of {args.repeats} runs after a warm-up")

    options = {"isa": args.isa}
    eps = {"HinaMoE": "HinaMoE", "CPU EP": "CPU"}
    gens, runs = {}, {label: [] for label in eps}
    for label, ep in eps.items():
        sess = make_session(model, ep, args.threads, provider_options=options if ep == "HinaMoE" else None)
        if ep == "HinaMoE" and sess.get_providers()[0] != hinamoe.get_ep_name():
            print(f"HinaMoE was not used by the session: {sess.get_providers()}", file=sys.stderr)
            return 1
        gens[label] = Generator(sess, cfg, capacity=total)
        gens[label].generate(prompt, min(args.new_tokens, 4))  # warm-up
    for _ in range(max(1, args.repeats)):
        for label, gen in gens.items():
            runs[label].append(gen.generate(prompt, args.new_tokens))

    speed = {}
    for label, rs in runs.items():
        pre = statistics.median(r.prefill_s for r in rs)
        dec = statistics.median(r.decode_s for r in rs)
        steps = args.new_tokens - 1
        speed[label] = (args.prompt / pre, steps / dec if steps else float("nan"))
        dec_txt = (f"decode {speed[label][1]:9.1f} tok/s ({dec / steps * 1e3:.3f} ms/token)"
                   if steps else "decode (no decode steps)")
        print(f"{label:>9}: prefill {speed[label][0]:9.1f} tok/s ({pre * 1e3:.2f} ms)   {dec_txt}   "
              f"providers {gens[label].sess.get_providers()}")
    if args.new_tokens > 1:
        print(f"HinaMoE / CPU EP: prefill {speed['HinaMoE'][0] / speed['CPU EP'][0]:.2f}x, "
              f"decode {speed['HinaMoE'][1] / speed['CPU EP'][1]:.2f}x")

    a, b = runs["HinaMoE"][-1], runs["CPU EP"][-1]
    same = np.array_equal(a.tokens, b.tokens)
    if same:
        print(f"same tokens on both EPs: yes ({a.tokens.size} of {a.tokens.size})")
    else:
        j = int(np.argmax(a.tokens[0] != b.tokens[0]))
        print(f"same tokens on both EPs: no (first difference at new token {j}; top-2 logit margin there "
              f"{a.margins[0, j]:.2e} on HinaMoE, {b.margins[0, j]:.2e} on the CPU EP)")
    print(f"tokens (HinaMoE): {' '.join(str(t) for t in a.tokens[0])}")

    if not args.no_profile:
        placed = placement(model, cfg, "HinaMoE", args.threads, provider_options=options)
        print(f"placement (ORT profile of a HinaMoE session): {_fmt_placement(placed)}")
        if placed.get("MoE") != ["HinaMoE"] or placed.get("GroupQueryAttention") != ["HinaMoE"]:
            print("MoE / GroupQueryAttention did not all run on HinaMoE", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
