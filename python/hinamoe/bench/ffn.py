"""``hina-bench ffn``: one ``com.microsoft::MoE`` node at real expert shapes."""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, asdict, replace
from pathlib import Path

import numpy as np

from .. import __version__
from . import cpu_mask
from .cli import csv
from .machine import cpu_name, hinamoe_tier, l3_bytes
from .probes import MachineProbes, probe_bytes
from .quiet import rewarm
from .roofline import fma_bits_for_tier, on_tiles
from .sessions import make_session

NAME = "ffn"
HELP = "time a single MoE FFN node at real expert shapes (HinaMoE vs ORT CPU EP and llama.cpp's ggml)"
DESCRIPTION = """\
Time one com.microsoft::MoE node at the expert shapes of real models.

For every model, dtype, thread count and tokens-per-expert value n, the router
logits are crafted so that each active expert receives exactly n tokens
(k experts per token, T = n tokens with k active experts). The layer holds fewer
experts than the real model (shapes are exact) but at least ~4x the last-level
cache, and the active experts rotate between timed repetitions, so the weights
stream from DRAM as in decode.

Reported per point: median latency (after warm-up); effective bandwidth
(GB/s) = expert weight bytes touched / time (bytes in the model's dtype);
%BW = that bandwidth as a % of the point's own read bandwidth (probe_gbs):
after each timed run, outside the timed interval, one pass of a persistent
hinamoe.ReadProbe of max(4 x L3, 256 MiB) (or --bw-bytes), started once
ORT's pool threads stopped spinning and followed by one untimed rotation of
the point's steps (>= 5 ms) that ends with the step just timed; probe_gbs is
the median of these passes, so a point timed in a slow minute of this shared
machine is compared with the bandwidth of that minute. %roof = the bandwidth
as a % of the roofline min(probe_gbs, FMA peak x bytes per weight / n) -- at
n tokens per expert each weight takes n FMAs, so from a few tokens on the
cores' FMA rate (hinamoe.measure_fma_peak(threads, bits) on the vectors of
the HinaMoE tier's kernels: 512-bit on avx512 and amx, else 256; probed
before and after the points, the larger value used) bounds the stream;
on the amx tier, points that run on bf16 tiles (bf16 MoE; QMoE from 16
tokens per expert, 64 on the -al4 rows) use the tile rate instead
(hinamoe.measure_tile_peak: TDPBF16PS multiply-adds/s; JSON roof_engine). %BWmax (JSON:
pct_bw_max_probe) is the older comparison, against the larger of the read
bandwidths probed before and after all points. --no-probe-between times the
runs back to back without probe passes and compares with that larger value.
Then the speed-up over ONNX Runtime's CPU EP on the same node (same dtype
where the CPU EP has it, and always against the CPU EP running the f32
model); the CPU EP's points get their own probe passes. The CPU EP has no
bf16 MoE, and converts f16 weights to f32 when the session is created.

x ggml (JSON: speedup_vs_ggml) = ggml time / HinaMoE time on the same
point (> 1: HinaMoE is faster). When llama.cpp's ggml is found (--ggml-lib,
$HINAMOE_GGML_LIB, or an installed llama-cpp-python built from source), each
HinaMoE point also runs the MoE FFN as llama.cpp builds it on ggml's CPU
backend (softmax + top-k routing, ggml_mul_mat_id for gate, up and down on
[in, out, expert] tensors, ggml_swiglu_split, routing weights, sum over k)
with the same weight values (rewritten once in GGUF's layout and
memory-mapped, as llama.cpp maps a model), inputs, routing, dtype and
thread count. The two are timed in turn in one run: each timed run follows
an untimed rotation of its own side's steps, so both find the same cache
state (the timed experts cold); the ggml rows get their own probe passes.
diff vs ggml (JSON: max_rel_diff_vs_ggml) checks that both computed the
same thing (ggml rounds activations to the weight type; HinaMoE does not).
Without ggml the note under the table says how to get it; --no-ggml skips it.

Examples:
  hina-bench ffn                                  # default: 3 models, all points
  hina-bench ffn --quick                          # a 1-2 minute smoke run
  hina-bench ffn --models mixtral-8x7b --dtypes bf16,f32 --tokens 1,2,4 --out res/
  hina-bench ffn --no-cpu-ep --threads 2 --tokens 1,2,4,8   # HinaMoE vs ggml
  hina-bench ffn --list-models
"""

DEFAULT_TOKENS = (1, 2, 4, 8, 16)
DEFAULT_DTYPES = ("f32", "f16", "bf16")
DEFAULT_THREADS = (1, 2)
def add_arguments(p: argparse.ArgumentParser) -> None:
    from ..models import DEFAULT_BENCH_MODELS

    g = p.add_argument_group("what to measure")
    g.add_argument("--models", type=csv(str), default=None, metavar="M1,M2",
                   help="model shapes (default: %s; see --list-models). "
                        "NAME:E overrides the number of experts instantiated"
                        % ",".join(DEFAULT_BENCH_MODELS))
    g.add_argument("--tokens", type=csv(int), default=None, metavar="N,...",
                   help="tokens per expert (default: 1,2,4,8,16)")
    g.add_argument("--dtypes", type=csv(str), default=None, metavar="D,...",
                   help="HinaMoE weight/activation dtypes: f32,f16,bf16 (default: all three); "
                        "int4,int8: com.microsoft::QMoE layers (f32 activations), each run with "
                        "accuracy_level absent and 4 (rows int4 / int4-al4), HinaMoE and the CPU EP")
    g.add_argument("--block-size", type=int, default=32, metavar="B",
                   help="block_size of the int4/int8 (QMoE) layers; 0 = row-wise scales (default 32)")
    g.add_argument("--threads", type=csv(int), default=None, metavar="T,...",
                   help="intra_op_num_threads values (default: 1,2)")
    g.add_argument("--isa", default="auto",
                   help="HinaMoE kernel tier: auto, avx512, avx2, ref, ... (default: auto). "
                        "The CPU EP keeps the best instruction set of the CPU; to compare "
                        "avx2 with the CPU EP on AVX2, run 'hina-bench --cpu-as avx2 ffn'")
    g.add_argument("--numa-sim", type=int, default=0, metavar="N", choices=[0, 2, 4, 8],
                   help="run HinaMoE under a simulated N-node topology (provider option "
                        "numa=fake:N; 2, 4 or 8): shows what the NUMA partitioning costs on "
                        "this machine, not a multi-node gain (default: 0 = numa=auto)")
    g.add_argument("--active", type=int, default=0, metavar="A",
                   help="active experts per step (default: k of the model); "
                        "tokens per step = n*A/k")
    g.add_argument("--no-cpu-ep", action="store_true",
                   help="do not run ONNX Runtime's CPU EP (no speed-up columns)")
    g.add_argument("--no-hinamoe", action="store_true",
                   help="only run the CPU EP (e.g. before the EP is built)")
    g.add_argument("--list-models", action="store_true",
                   help="print the known model shapes and exit")
    g.add_argument("--ggml-lib", default=None, metavar="PATH",
                   help="directory of llama.cpp's libggml.so, libggml-base.so and libggml-cpu.so "
                        "for the ggml column (default: $HINAMOE_GGML_LIB, else an installed "
                        "llama-cpp-python)")
    g.add_argument("--no-ggml", action="store_true",
                   help="no ggml column even where ggml is found")

    g = p.add_argument_group("how")
    g.add_argument("--repeats", type=int, default=None,
                   help="timed repetitions per point, median reported (default 10, quick 5)")
    g.add_argument("--warmup", type=int, default=None,
                   help="untimed runs before timing (default: one full rotation, >= 2)")
    g.add_argument("--min-cache-multiple", type=float, default=4.0, metavar="X",
                   help="grow the number of experts until the layer is >= X times the "
                        "L3 cache (default 4)")
    g.add_argument("--no-probe-between", action="store_true",
                   help="no read-probe pass after each timed run (timed runs back to back, as "
                        "before the interleaved probe); %%BW is then against the max of the "
                        "probes before/after all points, like %%BWmax")
    g.add_argument("--bw-bytes", type=float, default=None, metavar="GIB",
                   help="bytes streamed per read-bandwidth pass, GiB; one buffer per thread "
                        "count is held for the whole run (default: max(4 x L3, 256 MiB))")
    g.add_argument("--quick", action="store_true",
                   help="smoke run: qwen3-30b-a3b only (unless --models), tokens 1,4,16, "
                        "dtypes f32,bf16, max threads, 5 repeats")
    g.add_argument("--seed", type=int, default=0, help="seed for weights and inputs")
    g.add_argument("--workdir", default=None,
                   help="where model files are written (default: a temp dir, removed)")

    g = p.add_argument_group("output")
    g.add_argument("--out", default=None, metavar="DIR",
                   help="write results.json and latency.png (latency vs tokens per expert)")
    g.add_argument("--no-plot", action="store_true", help="no PNG even with --out")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


# --------------------------------------------------------------------- data


@dataclass
class Point:
    model: str
    dtype: str  # f32/f16/bf16 of the model
    ep: str  # "HinaMoE" or "CPU"
    threads: int
    tokens_per_expert: int
    tokens: int
    experts: int  # instantiated
    active_experts: int
    bytes_touched: int
    median_ms: float
    min_ms: float
    times_ms: list = field(default_factory=list)
    gbs: float = 0.0
    probe_gbs: float | None = None  # median of the read-probe passes taken after each timed run
    probe_passes_gbs: list = field(default_factory=list)
    pct_bw: float | None = None  # of probe_gbs
    pct_bw_max_probe: float | None = None  # of the max of the probes before/after all points
    roof_gbs: float | None = None  # min(probe_gbs, compute peak x bytes per weight / n)
    roof_engine: str | None = None  # the compute peak's: "fma" or "tiles" (amx tier)
    pct_roof: float | None = None
    speedup_vs_cpu_same: float | None = None
    speedup_vs_cpu_f32: float | None = None
    max_rel_diff_vs_cpu: float | None = None
    speedup_vs_ggml: float | None = None  # ggml time / HinaMoE time, same point
    max_rel_diff_vs_ggml: float | None = None


# QMoE layers of --dtypes: alias -> label; label -> (bits, accuracy_level).
QUANT_ALIASES = {"int4": "int4", "i4": "int4", "q4": "int4", "int8": "int8", "i8": "int8", "q8": "int8"}
QUANT_LABELS = {"int4": (4, None), "int4-al4": (4, 4), "int8": (8, None), "int8-al4": (8, 4)}


def _resolve_models(names):
    from ..models import get_shape

    out = []
    for spec in names:
        name, _, e = spec.partition(":")
        shape = get_shape(name)
        out.append((shape, int(e) if e else 0))
    return out


def _plan_experts(shape, override: int, dtype_itemsize_min: int, l3: int, multiple: float,
                  active: int) -> int:
    """Experts to instantiate: override, else the shape's bench default, grown
    (up to the real E) until the layer is >= multiple x L3 in the smallest dtype,
    and rounded to a multiple of the active set so rotation stays disjoint."""
    if override:
        return override
    e = shape.default_bench_experts
    while e < shape.experts and e * shape.expert_bytes(dtype_itemsize_min) < multiple * l3:
        e *= 2
    e = min(e, shape.experts)
    if e % active and e > active:
        e = max(active, (e // active) * active)
    return max(e, active)


# --------------------------------------------------------------------- timing


def _time_point(sess, cfg, plan, xs, repeats: int, warmup: int, between=None):
    """Times of ``repeats`` runs, rotating the active experts, and the first
    step's output. ``between()`` (a read-probe pass) runs after each timed
    run; then one untimed rotation of the steps ending with the one just
    timed (quiet.rewarm, >= 5 ms), so the next timed run starts as
    back-to-back runs do (ORT's pool threads awake, the caches holding the
    previous steps rather than the probe's buffer, its own experts cold)."""
    from ..models import MoERunner

    runners = []
    for step in range(plan.period):
        r = MoERunner(sess, cfg)
        r.set_inputs(xs[step % len(xs)], plan.logits(step))
        runners.append(r)
    for i in range(warmup):
        runners[i % len(runners)].run()
    times = []
    for i in range(repeats):
        r = runners[i % len(runners)]
        t0 = time.perf_counter()
        r.run()
        times.append((time.perf_counter() - t0) * 1e3)
        if between is not None:
            between()
            n = len(runners)
            rewarm([runners[(i + j) % n].run for j in range(1, n + 1)])
    first_out = runners[0]
    first_out.run()
    return times, np.array(first_out.output, copy=True)


# --------------------------------------------------------------------- main


@dataclass
class Plan:
    """What one `hina-bench ffn` run times, from its options."""
    models: list
    tokens: list
    dtypes: list  # float dtypes of --dtypes (f32, f16, bf16)
    quant: list  # QMoE labels of --dtypes (int4, int8)
    threads: list
    repeats: int
    run_hina: bool
    run_cpu: bool

    def layers(self) -> list[tuple[str, list[str]]]:
        """(dtype label, EPs) of every layer: HinaMoE for --dtypes; the CPU EP
        for f32 (always, as the baseline) and f16 when asked; QMoE at each
        bit width with accuracy_level absent and 4, both EPs side by side."""
        out = []
        for d in ("f32", "f16", "bf16"):
            eps = (["HinaMoE"] if self.run_hina and d in self.dtypes else []) + (
                ["CPU"] if self.run_cpu and (d == "f32" or (d == "f16" and d in self.dtypes)) else [])
            if eps:
                out.append((d, eps))
        q_eps = (["HinaMoE"] if self.run_hina else []) + (["CPU"] if self.run_cpu else [])
        for q in self.quant:
            for label in (q, q + "-al4"):
                out.append((label, q_eps))
        return out


def _plan(args) -> Plan | str:
    """The run's plan, or a message saying what is wrong with the options."""
    from ..models import DEFAULT_BENCH_MODELS, canon_dtype, short_dtype

    quick = args.quick
    asked = args.dtypes or (["f32", "bf16"] if quick else list(DEFAULT_DTYPES))
    try:
        dtypes = [short_dtype(canon_dtype(d)) for d in asked if d.lower() not in QUANT_ALIASES]
    except ValueError as e:
        return (f"--dtypes: {e}; float types (f32, f16, bf16) or {', '.join(sorted(QUANT_ALIASES))} "
                "(the quantised ones run with and without accuracy_level 4)")
    cores = os.cpu_count() or 1
    plan = Plan(models=args.models or (["qwen3-30b-a3b"] if quick else list(DEFAULT_BENCH_MODELS)),
                tokens=args.tokens or ([1, 4, 16] if quick else list(DEFAULT_TOKENS)),
                dtypes=dtypes,
                quant=[QUANT_ALIASES[d.lower()] for d in asked if d.lower() in QUANT_ALIASES],
                threads=args.threads or ([min(2, cores)] if quick else
                                         [t for t in DEFAULT_THREADS if t <= cores] or [1]),
                repeats=args.repeats or (5 if quick else 10),
                run_hina=not args.no_hinamoe, run_cpu=not args.no_cpu_ep)
    if not (plan.run_hina or plan.run_cpu):
        return "nothing to run (--no-hinamoe and --no-cpu-ep)"
    if any(t < 1 for t in plan.tokens) or any(t < 1 for t in plan.threads):
        return "tokens and threads must be >= 1"
    return plan


def _list_models() -> int:
    from ..models import list_shapes

    print(f"{'model':<18}{'H':>6}{'I':>7}{'E':>5}{'k':>3}  {'MB/expert f32':>13}  bench E")
    for s in list_shapes():
        print(f"{s.name:<18}{s.hidden:>6}{s.inter:>7}{s.experts:>5}{s.k:>3}  "
              f"{s.expert_bytes(4) / 1e6:>13.1f}  {s.default_bench_experts}")
    return 0


def _build_layer(shape, d: str, experts: int, args, mdir: Path):
    """One MoE (float d) or QMoE (quantised label d) layer of `experts`
    experts: (config, model path or bytes, bytes per expert)."""
    from ..models import (MoEConfig, QMoEConfig, build_moe_model, build_qmoe_model, canon_dtype,
                          model_path)

    rng = np.random.default_rng([args.seed, experts, shape.hidden])
    if d in QUANT_LABELS:
        cfg = QMoEConfig(hidden=shape.hidden, inter=shape.inter, experts=experts, k=shape.k,
                         bits=QUANT_LABELS[d][0], block_size=args.block_size,
                         accuracy_level=QUANT_LABELS[d][1], random_codes=True)
        model, _ = build_qmoe_model(cfg, rng, name="qmoe")
        return cfg, model.SerializeToString(), cfg.packed_bytes()  # codes + scales
    cfg = MoEConfig(hidden=shape.hidden, inter=shape.inter, experts=experts, k=shape.k,
                    activation="swiglu", swiglu_fusion=1, dtype=canon_dtype(d))
    model, _ = build_moe_model(cfg, rng=rng, external_dir=mdir, keep_weights=False, name="moe")
    return cfg, model_path(model), cfg.expert_weight_bytes()


def _inputs(shape, cfg, tokens: list[int], active: int, seed: int) -> dict:
    """Two input batches per tokens-per-expert value, the same for every EP."""
    from ..models import np_dtype

    xs_by_n = {}
    for n in tokens:
        if (n * active) % shape.k:
            raise ValueError(f"n={n} x active={active} not a multiple of k")
        xr = np.random.default_rng([seed, n, 7])
        xs_by_n[n] = [xr.standard_normal((n * active // shape.k, shape.hidden)).astype(np.float32)
                      .astype(np_dtype(cfg.dtype)) for _ in range(2)]
    return xs_by_n


def _time_layer(shape, layer: dict, cfg, src, eps, plan: Plan, args, probes, glayer, progress) -> list[Point]:
    """The points of one layer: every EP x thread count x tokens per expert,
    ggml beside HinaMoE where it runs; each EP's output compared with the
    first EP's (max_rel_diff_vs_cpu, on the second EP's point)."""
    from ..models import RoutingPlan, np_dtype
    from . import ggml_ffn

    name, d, experts, active = layer["model"], layer["dtype"], layer["experts"], layer["active"]
    touched = active * layer["expert_bytes"]
    xs_by_n = _inputs(shape, cfg, plan.tokens, active, args.seed)
    points: list[Point] = []
    ref_out: dict = {}
    for ep in eps:
        for thr in plan.threads:
            progress(None, f"{name} {d} {ep} {thr}thr: session")
            sess = make_session(src, ep, thr, {
                "isa": args.isa, "numa": f"fake:{args.numa_sim}" if args.numa_sim else "auto"})
            for n in plan.tokens:
                progress(None, f"{name} {d} {ep} {thr}thr n={n}")
                rplan = RoutingPlan(experts, layer["k"], n, active, dtype=np_dtype(cfg.dtype))
                warm = args.warmup if args.warmup is not None else max(2, rplan.period)
                between = probes.between(thr)
                with_ggml = glayer is not None and ep == "HinaMoE"
                if with_ggml:
                    glayer.set_threads(thr)
                    gbetween = probes.between(thr)
                    times, out, gtimes, gout = ggml_ffn.time_point(
                        sess, cfg, rplan, xs_by_n[n], plan.repeats, warm, between, gbetween, glayer)
                else:
                    times, out = _time_point(sess, cfg, rplan, xs_by_n[n], plan.repeats, warm, between)
                med = statistics.median(times)
                pt = Point(model=name, dtype=d, ep=ep, threads=thr, tokens_per_expert=n,
                           tokens=rplan.num_tokens, experts=experts, active_experts=active,
                           bytes_touched=touched, median_ms=med, min_ms=min(times),
                           times_ms=[round(t, 4) for t in times], gbs=touched / (med * 1e-3) / 1e9)
                probes.record(pt, between)
                if with_ggml:
                    gmed = statistics.median(gtimes)
                    gpt = replace(pt, ep="ggml", median_ms=gmed, min_ms=min(gtimes),
                                  times_ms=[round(t, 4) for t in gtimes], gbs=touched / (gmed * 1e-3) / 1e9)
                    probes.record(gpt, gbetween)
                    pt.max_rel_diff_vs_ggml = ggml_ffn.max_rel_diff(gout, out)
                    points.append(gpt)
                    progress(1, None)
                o64 = out.astype(np.float64)
                if (n, thr) in ref_out:
                    a, b = ref_out[(n, thr)], o64
                    pt.max_rel_diff_vs_cpu = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))
                else:
                    ref_out[(n, thr)] = o64
                points.append(pt)
                progress(1, None)
            del sess
            gc.collect()
    return points


def _rate(points: list[Point], probes, tier) -> None:
    """%BW, roofline and speed-ups of every point; each EP's diff against the
    other on HinaMoE's point."""
    from ..models import canon_dtype, np_dtype

    for p in points:  # each weight element takes one FMA per token
        item = QUANT_LABELS[p.dtype][0] / 8 if p.dtype in QUANT_LABELS else np_dtype(canon_dtype(p.dtype)).itemsize
        probes.rate(p, item, p.tokens_per_expert,
                    tiles=p.ep == "HinaMoE" and on_tiles(tier, p.dtype, p.tokens_per_expert))
    _fill_speedups(points)
    # the max_rel_diff is recorded on the second EP's point; copy to HinaMoE's
    for p in points:
        if p.ep == "CPU" and p.max_rel_diff_vs_cpu is not None:
            for q in points:
                if (q.ep == "HinaMoE" and q.model == p.model and q.dtype == p.dtype
                        and q.threads == p.threads and q.tokens_per_expert == p.tokens_per_expert):
                    q.max_rel_diff_vs_cpu = p.max_rel_diff_vs_cpu
            p.max_rel_diff_vs_cpu = None


def _write(out: Path, points: list[Point], meta: dict, plot: bool) -> None:
    from .report import plot_latency

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(dict(meta=meta, points=[asdict(p) for p in points]), indent=1))
    print(f"wrote {out / 'results.json'}")
    if plot:
        try:
            print(f"wrote {plot_latency(points, out / 'latency.png', meta)}")
        except Exception as exc:  # noqa: BLE001 - plotting is optional
            print(f"plot skipped: {exc}", file=sys.stderr)


def _fill_speedups(points: list[Point]) -> None:
    cpu = {(p.model, p.dtype, p.threads, p.tokens_per_expert): p.median_ms
           for p in points if p.ep == "CPU"}
    ggml = {(p.model, p.dtype, p.threads, p.tokens_per_expert): p.median_ms
            for p in points if p.ep == "ggml"}
    for p in points:
        if p.ep != "HinaMoE":
            continue
        same = cpu.get((p.model, p.dtype, p.threads, p.tokens_per_expert))
        f32 = cpu.get((p.model, "f32", p.threads, p.tokens_per_expert))
        if same:
            p.speedup_vs_cpu_same = same / p.median_ms
        if f32:
            p.speedup_vs_cpu_f32 = f32 / p.median_ms
        g = ggml.get((p.model, p.dtype, p.threads, p.tokens_per_expert))
        if g:
            p.speedup_vs_ggml = g / p.median_ms


def run(args) -> int:
    from ..models import canon_dtype, np_dtype

    if args.list_models:
        return _list_models()
    plan = _plan(args)
    if isinstance(plan, str):
        print(f"hina-bench ffn: {plan}", file=sys.stderr)
        return 2
    try:
        from tqdm import tqdm
    except ImportError:  # progress bar is optional
        tqdm = None
    import onnxruntime as ort

    tier = None
    if plan.run_hina:
        tier = hinamoe_tier(args.isa)
        if tier is None:
            return 1

    cores = os.cpu_count() or 1
    l3 = l3_bytes()
    probes = MachineProbes(plan.threads, probe_bytes(args.bw_bytes, l3), args.quick,
                           interleave=not args.no_probe_between, fma_bits=fma_bits_for_tier(tier),
                           tiles=tier == "amx")
    print(f"machine: {cpu_name()}, {cores} cores, L3 {l3 / 2 ** 20:.0f} MiB; "
          f"onnxruntime {ort.__version__}; HinaMoE tier {tier or '-'} (isa={args.isa}"
          + (f", numa=fake:{args.numa_sim}" if args.numa_sim else "") + ")")
    print(probes.describe("before"))
    from . import ggml_ffn

    ggml, ggml_note = ggml_ffn.open_ggml(args) if plan.run_hina else (None, "")
    if ggml_note:
        print(ggml_note)

    layer_dtypes = plan.layers()
    specs = _resolve_models(plan.models)
    min_item = min([np_dtype(canon_dtype(d)).itemsize for d, _ in layer_dtypes if d not in QUANT_LABELS]
                   + [1] * bool(plan.quant))

    # ggml runs beside HinaMoE's float layers (llama.cpp's q4_0/q8_0 are other formats).
    def with_ggml_layer(d, eps):
        return ggml is not None and "HinaMoE" in eps and d not in QUANT_LABELS

    total = (sum(len(eps) + with_ggml_layer(d, eps) for d, eps in layer_dtypes)
             * len(specs) * len(plan.threads) * len(plan.tokens))
    bar = None
    if tqdm is not None and not args.no_progress:
        bar = tqdm(total=total, unit="pt", desc="hina-bench ffn", dynamic_ncols=True, file=sys.stderr)

    def progress(done, note):
        if bar is not None:
            if note:
                bar.set_postfix_str(note)
            if done:
                bar.update(done)

    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="hina-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    points: list[Point] = []
    layers = []
    t_start = time.time()
    try:
        for shape, e_override in specs:
            active = args.active or shape.k
            if active < shape.k:
                print(f"--active {active} < k={shape.k} for {shape.name}", file=sys.stderr)
                return 2
            experts = _plan_experts(shape, e_override, min_item, l3, args.min_cache_multiple, active)
            for d, eps in layer_dtypes:
                progress(None, f"{shape.name} {d}: building {experts} experts")
                mdir = workdir / f"{shape.name}-{d}"
                cfg, src, expert_bytes = _build_layer(shape, d, experts, args, mdir)
                glayer = None
                if with_ggml_layer(d, eps):
                    progress(None, f"{shape.name} {d}: ggml weights")
                    gpath = mdir / "ggml.weights"
                    glayer = ggml_ffn.GgmlMoE(ggml, cfg, gpath, ggml_ffn.write_ggml_weights(src, cfg, gpath),
                                              plan.threads[0])
                layer = dict(model=shape.name, dtype=d, experts=experts, active=active,
                             hidden=shape.hidden, inter=shape.inter, k=shape.k,
                             layer_bytes=expert_bytes * experts, expert_bytes=expert_bytes,
                             cache_multiple=expert_bytes * experts / l3)
                layers.append(layer)
                points += _time_layer(shape, layer, cfg, src, eps, plan, args, probes, glayer, progress)
                if glayer is not None:
                    glayer.close()
                shutil.rmtree(mdir, ignore_errors=True)
    finally:
        if bar:
            bar.close()
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    probes.finish()
    _rate(points, probes, tier)

    from .report import print_table

    print(probes.describe("max of the probes before/after"))
    if probes.interleave:
        print(probes.describe_interleaved(points))
    print_table(points)
    if ggml_note and ggml is None:
        print(ggml_note)
    for p in points:
        lim = ggml_ffn.DIFF_LIMIT.get(p.dtype)
        if p.max_rel_diff_vs_ggml is not None and lim and p.max_rel_diff_vs_ggml > lim:
            print(f"warning: {p.model} {p.dtype} n={p.tokens_per_expert}: HinaMoE and ggml differ by "
                  f"{p.max_rel_diff_vs_ggml:.1e} (> {lim:.0e}): not the same computation", file=sys.stderr)
    elapsed = time.time() - t_start
    print(f"({len(points)} points in {elapsed:.0f} s)")
    if probes.warning():
        print(probes.warning(), file=sys.stderr)
    if args.out:
        meta = dict(
            command="hina-bench ffn", argv=sys.argv[1:], time=time.strftime("%Y-%m-%d %H:%M:%S"),
            cpu=cpu_name(), cpu_as=cpu_mask.active(), cores=cores, l3_bytes=l3,
            onnxruntime=ort.__version__, hinamoe=__version__,
            tier=tier, isa=args.isa, numa_sim=args.numa_sim,
            **probes.meta(), repeats=plan.repeats, seed=args.seed,
            layers=layers, elapsed_s=elapsed,
            ggml=(dict(available=True, version=ggml.version, commit=ggml.commit,
                       lib_dir=str(ggml.lib_dir), origin=ggml.origin,
                       cpu_features=ggml.cpu_features) if ggml is not None else
                  dict(available=False, note=ggml_note or "--no-ggml")),
            notes=["gbs = active experts' weight bytes in the model dtype / median time",
                   "CPU EP converts f16 weights to f32 at session creation",
                   "speedup_vs_cpu_same: CPU EP on the same dtype model (f32/f16)",
                   "speedup_vs_cpu_f32: CPU EP on the f32 model",
                   "speedup_vs_ggml: ggml time / HinaMoE time on the same point (ep 'ggml': "
                   "llama.cpp's MoE FFN graph on ggml's CPU backend)"])
        _write(Path(args.out), points, meta, not args.no_plot)
    return 0
