"""Where one decode step of B sequences spends its time: hina-serve's
runner driven in process on a model folder, ORT's profile summed per op
type over the decode steps (the prefills left out).

    python scripts/batch_step_profile.py MODEL_DIR --batch 8 --prompt 40 --steps 48

Prints ms per step for each op type and provider, the summed node time,
ORT's model_run median and the wall-clock median per step.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import time

import numpy as np


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir", help="a folder hina-serve serves (hina-export, onnxruntime-genai)")
    p.add_argument("--batch", type=int, default=8, help="sequences decoded together (default 8)")
    p.add_argument("--prompt", type=int, default=40, help="random prompt tokens per sequence (default 40)")
    p.add_argument("--steps", type=int, default=48, help="decode steps timed (default 48)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    from hinamoe.models.tiny_lm import make_session
    from hinamoe.serve.model_folder import read_model_folder
    from hinamoe.serve.runner import Runner

    folder = read_model_folder(args.model_dir)
    prefix = os.path.join(tempfile.mkdtemp(prefix="hina-step-"), "profile")
    sess = make_session(str(folder.model_file), "HinaMoE", args.threads, profile_prefix=prefix)
    runner = Runner(sess, folder.layout, folder.kv_shape, folder.rings, share_buffer=folder.share_buffer)
    vocab = runner.vocab or 1000
    rng = np.random.default_rng(args.seed)
    batch, tokens = runner.new_batch(), []
    for _ in range(args.batch):
        logits, caches = runner.prefill(rng.integers(10, vocab - 10, args.prompt), runner.empty_caches(), 0)
        batch.add(caches, args.prompt)
        tokens.append(int(np.argmax(logits)))
    walls, tok = [], np.array(tokens)
    for _ in range(args.steps):
        t0 = time.perf_counter()
        tok = runner.decode(batch, tok).argmax(-1)
        walls.append((time.perf_counter() - t0) * 1e3)
    path = sess.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[args.batch:]
    start = runs[0]["ts"]
    total, count, provider = collections.defaultdict(float), collections.Counter(), {}
    for e in events:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time") or e["ts"] < start:
            continue
        op = e["args"].get("op_name")
        total[op] += e["dur"]
        count[op] += 1
        provider[op] = e["args"].get("provider")
    n = len(runs)
    print(f"{folder.name}: {args.batch} sequences, {args.prompt}-token prompts, {n} decode steps")
    for op, us in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"  {op:34s} {provider[op]:22s} {us / n / 1e3:8.3f} ms  {count[op] // n:4d} nodes/step")
    print(f"nodes {sum(total.values()) / n / 1e3:.3f} ms/step; model_run median "
          f"{np.median([e['dur'] for e in runs]) / 1e3:.3f} ms; wall median {np.median(walls):.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
