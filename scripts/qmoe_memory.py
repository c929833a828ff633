"""Resident memory of a session above its QMoE weight bytes: HinaMoE vs
ORT's CPU EP, one large QMoE layer, each EP in a fresh process.

    python scripts/qmoe_memory.py [--model qwen3-30b-a3b] [--experts 128] [--bits 4] [--block 32]

Prints VmRSS before session creation, after it and after the first run, and
(after first run - before) - packed weight bytes (codes + scales).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile


def vmrss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def child(path: str, ep: str, hidden: int, experts: int, k: int, threads: int) -> None:
    import numpy as np
    import onnxruntime as ort

    import hinamoe  # noqa: F401  (registers the EP)

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    providers = [("HinaMoE", {})] if ep == "HinaMoE" else ["CPUExecutionProvider"]
    if ep == "HinaMoE":
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, hidden)).astype(np.float32)
    lg = rng.standard_normal((4, experts)).astype(np.float32)
    before = vmrss_bytes()
    sess = ort.InferenceSession(path, so, providers=providers)
    created = vmrss_bytes()
    sess.run(None, {"input": x, "router_probs": lg})
    first = vmrss_bytes()
    print(json.dumps(dict(ep=ep, before=before, created=created, first_run=first)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3-30b-a3b")
    p.add_argument("--experts", type=int, default=0, help="default: the model's E")
    p.add_argument("--bits", type=int, default=4, choices=[4, 8])
    p.add_argument("--block", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        path, ep, hidden, experts, k, threads = a.child
        child(path, ep, int(hidden), int(experts), int(k), int(threads))
        return 0

    import numpy as np

    from hinamoe.models import QMoEConfig, build_qmoe_model, get_shape

    shape = get_shape(a.model)
    e = a.experts or shape.experts
    cfg = QMoEConfig(hidden=shape.hidden, inter=shape.inter, experts=e, k=shape.k, bits=a.bits,
                     block_size=a.block, random_codes=True)
    weight_bytes = cfg.packed_bytes() * e
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "qmoe.onnx")
        model, _ = build_qmoe_model(cfg, np.random.default_rng(0))
        with open(path, "wb") as f:
            f.write(model.SerializeToString())
        del model
        print(f"{a.model}: E={e} H={shape.hidden} I={shape.inter} int{a.bits} block {a.block}: "
              f"packed weights {weight_bytes / 2**20:.1f} MiB")
        for ep in ("HinaMoE", "CPU"):
            out = subprocess.run([sys.executable, __file__, "--child", path, ep, str(shape.hidden), str(e),
                                  str(shape.k), str(a.threads)], capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            above = r["first_run"] - r["before"] - weight_bytes
            print(f"{ep:>8}: RSS +{(r['created'] - r['before']) / 2**20:.1f} MiB at session creation, "
                  f"+{(r['first_run'] - r['before']) / 2**20:.1f} MiB after the first run; "
                  f"{above / 2**20:+.1f} MiB above the weight bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
