"""``python -m hinamoe.models.example``: a small MoE layer on HinaMoE and on
ONNX Runtime's CPU EP, side by side.

Builds one ``com.microsoft::MoE`` node (H=256, I=512, E=8, k=2, SwiGLU with
interleaved gate/up rows, float32, weights as initializers), runs the same
inputs on both execution providers and prints a summary of each output, the
largest difference between them and the median run times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hinamoe.models.example",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=16, help="tokens in the batch (default 16)")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0 = ORT default)")
    ap.add_argument("--repeats", type=int, default=20, help="timed runs (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    import onnxruntime as ort

    from .moe_layer import MoEConfig, build_moe_model, random_input, random_logits

    try:
        import hinamoe

        hinamoe.register()
    except Exception as exc:  # noqa: BLE001
        print(f"HinaMoE is not available: {exc}", file=sys.stderr)
        return 1

    cfg = MoEConfig(hidden=256, inter=512, experts=8, k=2, activation="swiglu",
                    swiglu_fusion=1, dtype="float32", normalize_routing_weights=1)
    rng = np.random.default_rng(args.seed)
    model, _ = build_moe_model(cfg, rng=rng)
    data = model.SerializeToString()
    x = random_input(cfg, args.tokens, rng)
    logits = random_logits(cfg, args.tokens, rng)
    print(f"model: one com.microsoft::MoE node, {cfg.describe()}, "
          f"{cfg.total_weight_bytes() / 2 ** 20:.1f} MiB of expert weights")
    print(f"input: {x.shape} {x.dtype}, router logits {logits.shape}")

    def session(providers):
        so = ort.SessionOptions()
        if args.threads:
            so.intra_op_num_threads = args.threads
        return ort.InferenceSession(data, so, providers=providers)

    results = {}
    for label, providers in (("HinaMoE", [hinamoe.get_ep_name(), "CPUExecutionProvider"]),
                             ("CPU EP", ["CPUExecutionProvider"])):
        sess = session(providers)
        feeds = {"input": x, "router_probs": logits}
        out = sess.run(None, feeds)[0]
        ms = _time(lambda: sess.run(None, feeds), args.repeats)
        results[label] = out
        print(f"{label:>8}: providers {sess.get_providers()[0]:<20} output {out.shape} "
              f"mean {out.mean():+.6f} std {out.std():.6f} "
              f"min {out.min():+.4f} max {out.max():+.4f}   median {ms:.3f} ms")
        if label == "HinaMoE" and sess.get_providers()[0] != "HinaMoE":
            print("HinaMoE was not used by the session", file=sys.stderr)
            return 1
    diff = np.abs(results["HinaMoE"].astype(np.float64) - results["CPU EP"]).max()
    scale = np.abs(results["CPU EP"]).max()
    print(f"max |HinaMoE - CPU EP| = {diff:.3e} (output max {scale:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
