"""``hina-bench gqa``: one ``com.microsoft::GroupQueryAttention`` decode step
at the attention shapes of real models."""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .. import __version__
from .cli import csv
from .machine import cpu_name, hinamoe_tier, l3_bytes
from .probes import MachineProbes, probe_bytes
from .quiet import rewarm
from .sessions import make_session

NAME = "gqa"
HELP = "time one GroupQueryAttention decode step at real attention shapes (HinaMoE vs ORT CPU EP)"
DESCRIPTION = """\
Time one com.microsoft::GroupQueryAttention decode step (S = 1) per layer at
the attention shapes of real models, as onnxruntime-genai runs it: float32
(or float16 / bfloat16 with --dtypes; ORT's CPU EP has no bfloat16 GQA, so
bf16 points have no CPU EP column),
rotary inside the op (cos/sin caches), the KV cache shared between past and
present (IOBinding), seqlens_k = context - 1.

Every point runs the same node on HinaMoE and on ONNX Runtime's CPU EP, on
the same cache buffers and inputs. When one layer's cache is smaller than a
few times the L3 cache, several independent caches ("layers") are cycled so
K/V stream from DRAM as in a multi-layer decode.

Reported per point: median latency (after warm-up); effective bandwidth
(GB/s) = K and V bytes read (2 * B * kv_heads * context * head_dim * element
size) / time; %BW = that bandwidth as a % of the point's own read bandwidth
(probe_gbs): after each timed run, outside the timed interval, one pass of a
persistent hinamoe.ReadProbe of max(4 x L3, 256 MiB) (or --bw-bytes),
started once ORT's pool threads stopped spinning and followed by one untimed
rotation of the point's steps (>= 5 ms) that ends with the step just timed;
probe_gbs is the median of these passes, so a point timed in a slow minute
of this shared machine is compared with the bandwidth of that minute (the
CPU EP's points get their own passes). %roof = the bandwidth as a % of the
roofline min(probe_gbs, FMA peak x element size / G) -- each K and V element
meets the G query heads of its KV head once, 2*G FMAs per K+V element pair
(softmax exps not counted), so with G = 8 float16 K/V the FMA rate
(hinamoe.measure_fma_peak(threads), probed before and after the points, the
larger value used), not the memory, bounds it. %BWmax (HinaMoE's in the
table; JSON: pct_bw_max_probe for both EPs) is the older comparison, against
the larger of the read bandwidths probed before and after all points.
--no-probe-between times the runs back to back without probe passes and
compares with that larger value. Then the speed-up over the CPU EP, and the
max relative difference between the two EPs' outputs as a check.

Examples:
  hina-bench gqa                                   # all shapes, contexts, batches, 1 and 2 threads
  hina-bench gqa --quick                           # a short smoke run
  hina-bench gqa --shapes mixtral-8x7b --contexts 2048,32768 --batches 1 --threads 2 --out res/
  hina-bench gqa --list-shapes
"""

DEFAULT_CONTEXTS = (512, 2048, 8192, 32768)
DEFAULT_BATCHES = (1, 4)
DEFAULT_THREADS = (1, 2)


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to measure")
    g.add_argument("--shapes", type=csv(str), default=None, metavar="S1,S2",
                   help="attention shapes (default: all; see --list-shapes)")
    g.add_argument("--contexts", type=csv(int), default=None, metavar="C,...",
                   help="tokens in the KV cache (default: 512,2048,8192,32768)")
    g.add_argument("--batches", type=csv(int), default=None, metavar="B,...",
                   help="batch sizes (default: 1,4)")
    g.add_argument("--threads", type=csv(int), default=None, metavar="T,...",
                   help="intra_op_num_threads values (default: 1,2)")
    g.add_argument("--dtypes", type=csv(str), default=None, metavar="D,...",
                   help="element types of the node: f32, f16, bf16 (default: f32; "
                        "bf16 runs on HinaMoE only: ORT's CPU EP has no bf16 GQA)")
    g.add_argument("--isa", default="auto",
                   help="HinaMoE kernel tier: auto, avx512, avx2, ref, ... (default: auto)")
    g.add_argument("--no-rotary", action="store_true",
                   help="a node without rotary (default: do_rotary=1 with cos/sin caches)")
    g.add_argument("--no-cpu-ep", action="store_true",
                   help="do not run ONNX Runtime's CPU EP (no speed-up columns)")
    g.add_argument("--no-hinamoe", action="store_true",
                   help="only run the CPU EP (e.g. before the EP is built)")
    g.add_argument("--list-shapes", action="store_true",
                   help="print the known attention shapes and exit")

    g = p.add_argument_group("how")
    g.add_argument("--repeats", type=int, default=None,
                   help="timed runs per point, median reported (default 10, quick 5)")
    g.add_argument("--warmup", type=int, default=None,
                   help="untimed runs before timing (default: one pass over the layers, >= 2)")
    g.add_argument("--min-cache-multiple", type=float, default=4.0, metavar="X",
                   help="cycle enough layers' caches to cover X times the L3 cache (default 4)")
    g.add_argument("--max-layers", type=int, default=16,
                   help="at most this many caches are cycled (default 16)")
    g.add_argument("--no-probe-between", action="store_true",
                   help="no read-probe pass after each timed run (timed runs back to back, as "
                        "before the interleaved probe); %%BW is then against the max of the "
                        "probes before/after all points, like %%BWmax")
    g.add_argument("--bw-bytes", type=float, default=None, metavar="GIB",
                   help="bytes streamed per read-bandwidth pass, GiB; one buffer per thread "
                        "count is held for the whole run (default: max(4 x L3, 256 MiB))")
    g.add_argument("--quick", action="store_true",
                   help="smoke run: qwen3-30b-a3b (unless --shapes), contexts 512,2048,8192, "
                        "batch 1, max threads (<= 2), 5 repeats")
    g.add_argument("--seed", type=int, default=0, help="seed for caches and inputs")

    g = p.add_argument_group("output")
    g.add_argument("--out", default=None, metavar="DIR",
                   help="write results.json and gqa-latency.png (latency vs context)")
    g.add_argument("--no-plot", action="store_true", help="no PNG even with --out")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


@dataclass
class GqaPoint:
    shape: str
    ep: str  # "HinaMoE" or "CPU"
    dtype: str  # f32 / f16 / bf16
    threads: int
    batch: int
    context: int
    layers: int  # caches cycled
    kv_bytes: int  # K+V bytes read per step
    median_ms: float
    min_ms: float
    times_ms: list = field(default_factory=list)
    gbs: float = 0.0
    probe_gbs: float | None = None  # median of the read-probe passes taken after each timed run
    probe_passes_gbs: list = field(default_factory=list)
    pct_bw: float | None = None  # of probe_gbs
    pct_bw_max_probe: float | None = None  # of the max of the probes before/after all points
    roof_gbs: float | None = None  # min(probe_gbs, FMA peak x element size / G)
    pct_roof: float | None = None
    speedup_vs_cpu: float | None = None
    max_rel_diff_vs_cpu: float | None = None


class _Layer:
    """One layer's shared KV cache and the IOBinding of one decode step."""

    def __init__(self, cfg, batch: int, context: int, rng: np.random.Generator):
        from ..models import KVCache, random_step

        from ..models import np_dtype

        cap = context + 16
        shape = (batch, cfg.kv_num_heads, cap, cfg.head_dim)
        dt = np_dtype(cfg.dtype)
        self.cache = KVCache(rng.standard_normal(shape, dtype=np.float32).astype(dt, copy=False),
                             rng.standard_normal(shape, dtype=np.float32).astype(dt, copy=False))
        self.step = random_step(cfg, rng, [context - 1] * batch, 1, positions=cap)
        self.out = np.zeros((batch, 1, cfg.num_heads * cfg.head_dim), dt)

    def bind(self, sess):
        from ..models.gqa_layer import ortvalue  # bfloat16-aware, shares the numpy buffer

        io = sess.io_binding()
        # The OrtValues share the numpy buffers; keep both alive with the layer.
        feeds = {name: ortvalue(arr) for name, arr in self.step.feeds().items()}
        k, v, out = ortvalue(self.cache.key), ortvalue(self.cache.value), ortvalue(self.out)
        self.bound = [feeds, k, v, out]
        for name, val in feeds.items():
            io.bind_ortvalue_input(name, val)
        io.bind_ortvalue_input("past_key", k)
        io.bind_ortvalue_input("past_value", v)
        io.bind_ortvalue_output("present_key", k)
        io.bind_ortvalue_output("present_value", v)
        io.bind_ortvalue_output("output", out)
        return io


def _time(sess, layers, repeats: int, warmup: int, between=None):
    """Times of ``repeats`` steps cycling the layers, and layer 0's output.
    ``between()`` (a read-probe pass) runs after each timed step; then one
    untimed pass over the layers ending with the one just timed
    (quiet.rewarm, >= 5 ms), so the next timed step starts as back-to-back
    steps do (ORT's pool threads awake, the caches holding the previous
    layers rather than the probe's buffer, its own layer cold)."""
    bindings = [layer.bind(sess) for layer in layers]
    for i in range(warmup):
        sess.run_with_iobinding(bindings[i % len(bindings)])
    times = []
    for i in range(repeats):
        io = bindings[i % len(bindings)]
        t0 = time.perf_counter()
        sess.run_with_iobinding(io)
        times.append((time.perf_counter() - t0) * 1e3)
        if between is not None:
            between()
            n = len(bindings)
            rewarm([functools.partial(sess.run_with_iobinding, bindings[(i + j) % n]) for j in range(1, n + 1)])
    sess.run_with_iobinding(bindings[0])
    return times, layers[0].out.astype(np.float64)


def run(args) -> int:
    from ..models import ATTENTION_SHAPES, build_gqa_model, canon_dtype, short_dtype

    if args.list_shapes:
        print(f"{'shape':<16}{'heads':>6}{'kv':>4}{'d':>5}  {'sink':>4}  KV MB/token (f32)")
        for s in ATTENTION_SHAPES.values():
            print(f"{s.name:<16}{s.num_heads:>6}{s.kv_num_heads:>4}{s.head_dim:>5}  "
                  f"{'yes' if s.head_sink else 'no':>4}  {s.kv_bytes(1, 1) / 1e6:.4f}")
        return 0

    quick = args.quick
    names = args.shapes or (["qwen3-30b-a3b"] if quick else list(ATTENTION_SHAPES))
    unknown = [n for n in names if n not in ATTENTION_SHAPES]
    if unknown:
        print(f"unknown shape(s) {unknown}; known: {', '.join(ATTENTION_SHAPES)}", file=sys.stderr)
        return 2
    try:
        dtypes = [short_dtype(canon_dtype(d)) for d in (args.dtypes or ["f32"])]
    except ValueError as exc:
        print(f"--dtypes: {exc}", file=sys.stderr)
        return 2
    if any(d not in ("f32", "f16", "bf16") for d in dtypes):
        print("--dtypes: f32, f16 and bf16 only", file=sys.stderr)
        return 2
    contexts = args.contexts or ([512, 2048, 8192] if quick else list(DEFAULT_CONTEXTS))
    batches = args.batches or ([1] if quick else list(DEFAULT_BATCHES))
    cores = os.cpu_count() or 1
    threads = args.threads or ([min(2, cores)] if quick else
                               [t for t in DEFAULT_THREADS if t <= cores] or [1])
    repeats = args.repeats or (5 if quick else 10)
    run_hina, run_cpu = not args.no_hinamoe, not args.no_cpu_ep
    if not (run_hina or run_cpu):
        print("nothing to run (--no-hinamoe and --no-cpu-ep)", file=sys.stderr)
        return 2
    if min(contexts) < 1 or min(batches) < 1 or min(threads) < 1 or repeats < 1:
        print("contexts, batches, threads and repeats must be >= 1", file=sys.stderr)
        return 2

    try:
        from tqdm import tqdm
    except ImportError:  # progress bar is optional
        tqdm = None
    import onnxruntime as ort

    tier = None
    if run_hina:
        if hinamoe_tier(args.isa) is None:
            return 1
        import hinamoe

        tier = hinamoe.gqa_tier(args.isa)  # GQA's own: auto on an AMX CPU runs avx2

    l3 = l3_bytes()
    probes = MachineProbes(threads, probe_bytes(args.bw_bytes, l3), quick,
                           interleave=not args.no_probe_between)
    print(f"machine: {cpu_name()}, {cores} cores, L3 {l3 / 2 ** 20:.0f} MiB; "
          f"onnxruntime {ort.__version__}; HinaMoE tier {tier or '-'} (isa={args.isa})")
    print(probes.describe("before"))

    eps = (["HinaMoE"] if run_hina else []) + (["CPU"] if run_cpu else [])
    # ORT's CPU EP has no bfloat16 GroupQueryAttention: bf16 runs on HinaMoE alone.
    def eps_for(dt):
        return [e for e in eps if not (dt == "bf16" and e == "CPU")]

    total = len(names) * sum(len(eps_for(d)) for d in dtypes) * len(batches) * len(contexts) * len(threads)
    bar = None
    if tqdm is not None and not args.no_progress:
        bar = tqdm(total=total, unit="pt", desc="hina-bench gqa", dynamic_ncols=True, file=sys.stderr)
    points: list[GqaPoint] = []
    t_start = time.time()
    try:
        for name, dt in ((n, d) for n in names for d in dtypes):
            shape = ATTENTION_SHAPES[name]
            cfg = shape.config(do_rotary=not args.no_rotary, dtype=canon_dtype(dt))
            itemsize = 4 if dt == "f32" else 2
            model_bytes = build_gqa_model(cfg, name=name).SerializeToString()
            sessions = {(ep, t): make_session(model_bytes, ep, t, {"isa": args.isa})
                        for ep in eps_for(dt) for t in threads}
            for batch in batches:
                for context in contexts:
                    per_layer = shape.kv_bytes(batch, context + 16, itemsize)
                    n_layers = int(min(args.max_layers,
                                       max(1, -(-args.min_cache_multiple * l3 // per_layer))))
                    if bar:
                        bar.set_postfix_str(f"{name} {dt} B={batch} ctx={context}: {n_layers} cache(s)")
                    rng = np.random.default_rng([args.seed, batch, context])
                    layers = [_Layer(cfg, batch, context, rng) for _ in range(n_layers)]
                    warm = args.warmup if args.warmup is not None else max(2, n_layers)
                    for thr in threads:
                        outs = {}
                        for ep in eps_for(dt):
                            if bar:
                                bar.set_postfix_str(f"{name} {dt} B={batch} ctx={context} {ep} {thr}thr")
                            between = probes.between(thr)
                            times, out = _time(sessions[(ep, thr)], layers, repeats, warm, between)
                            med = statistics.median(times)
                            kv = shape.kv_bytes(batch, context, itemsize)
                            points.append(GqaPoint(
                                shape=name, ep=ep, dtype=dt, threads=thr, batch=batch, context=context,
                                layers=n_layers, kv_bytes=kv, median_ms=med, min_ms=min(times),
                                times_ms=[round(t, 4) for t in times], gbs=kv / (med * 1e-3) / 1e9))
                            probes.record(points[-1], between)
                            outs[ep] = (points[-1], out)
                            if bar:
                                bar.update(1)
                        if "HinaMoE" in outs and "CPU" in outs:
                            hp, ho = outs["HinaMoE"]
                            cp, co = outs["CPU"]
                            hp.speedup_vs_cpu = cp.median_ms / hp.median_ms
                            hp.max_rel_diff_vs_cpu = float(np.abs(ho - co).max()
                                                           / max(np.abs(co).max(), 1e-30))
                    del layers
                    gc.collect()
            del sessions
            gc.collect()
    finally:
        if bar:
            bar.close()

    probes.finish()
    for p in points:  # each K/V element meets the G query heads of its KV head
        shape = ATTENTION_SHAPES[p.shape]
        probes.rate(p, 4 if p.dtype == "f32" else 2, shape.num_heads // shape.kv_num_heads)

    from .report import plot_gqa_latency, print_gqa_table

    print(probes.describe("max of the probes before/after"))
    if probes.interleave:
        print(probes.describe_interleaved(points))
    print_gqa_table(points)
    elapsed = time.time() - t_start
    print(f"({len(points)} points in {elapsed:.0f} s)")
    if probes.warning():
        print(probes.warning(), file=sys.stderr)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = dict(
            command="hina-bench gqa", argv=sys.argv[1:], time=time.strftime("%Y-%m-%d %H:%M:%S"),
            cpu=cpu_name(), cores=cores, l3_bytes=l3, onnxruntime=ort.__version__,
            hinamoe=__version__, tier=tier, isa=args.isa, rotary=not args.no_rotary,
            **probes.meta(), repeats=repeats, seed=args.seed, elapsed_s=elapsed,
            shapes={n: asdict(ATTENTION_SHAPES[n]) for n in names},
            notes=["gbs = K+V bytes read per step (2*B*kv_heads*context*head_dim*itemsize) / median time",
                   "speedup_vs_cpu: CPU EP median / HinaMoE median on the same node and buffers"])
        (out / "results.json").write_text(json.dumps(
            dict(meta=meta, points=[asdict(p) for p in points]), indent=1))
        print(f"wrote {out / 'results.json'}")
        if not args.no_plot:
            try:
                png = plot_gqa_latency(points, out / "gqa-latency.png", meta)
                print(f"wrote {png}")
            except Exception as exc:  # noqa: BLE001 - plotting is optional
                print(f"plot skipped: {exc}", file=sys.stderr)
    return 0
