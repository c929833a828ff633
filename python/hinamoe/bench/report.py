"""Terminal table and plot for ``hina-bench`` results."""

from __future__ import annotations

from pathlib import Path


# Row order of dtypes (int4/int8: QMoE layers; -al4: accuracy_level=4).
DTYPE_ORDER = ["f32", "f16", "bf16", "int4", "int4-al4", "int8", "int8-al4"]

def _fmt(v, spec, empty="-"):
    return empty if v is None else format(v, spec)


def _bw_note(points) -> str:
    """What %BW is compared with: the points' own interleaved probes, or
    (--no-probe-between) the max of the probes before/after all points."""
    if any(getattr(p, "probe_gbs", None) for p in points):
        return "%BW = of the point's own read bandwidth (median of one probe pass after each timed run)"
    return "%BW = of the max of the read-bandwidth probes before/after all points (--no-probe-between)"


def print_table(points) -> None:
    """One row per point, grouped by model; speed-ups are CPU EP (or ggml) time / HinaMoE time."""
    head = (f"{'model':<16}{'dtype':>6}{'EP':>8}{'thr':>4}{'n/exp':>6}{'T':>4}"
            f"{'ms':>10}{'GB/s':>8}{'%BW':>6}{'%BWmax':>7}{'%roof':>6}{'x CPU':>7}{'x CPUf32':>9}{'x ggml':>7}{'diff':>9}")
    print()
    print(head)
    print("-" * len(head))
    last = None
    models = list(dict.fromkeys(p.model for p in points))
    order = sorted(points, key=lambda p: (models.index(p.model), p.threads, p.tokens_per_expert,
                                          p.ep != "HinaMoE", DTYPE_ORDER.index(p.dtype)))
    for p in order:
        group = (p.model, p.threads)
        if last is not None and group != last:
            print()
        last = group
        print(f"{p.model:<16}{p.dtype:>6}{p.ep:>8}{p.threads:>4}{p.tokens_per_expert:>6}"
              f"{p.tokens:>4}{p.median_ms:>10.3f}{p.gbs:>8.1f}{_fmt(p.pct_bw, '.0f'):>6}"
              f"{_fmt(p.pct_bw_max_probe, '.0f'):>7}{_fmt(p.pct_roof, '.0f'):>6}"
              f"{_fmt(p.speedup_vs_cpu_same, '.2f'):>7}{_fmt(p.speedup_vs_cpu_f32, '.2f'):>9}"
              f"{_fmt(getattr(p, 'speedup_vs_ggml', None), '.2f'):>7}"
              f"{_fmt(p.max_rel_diff_vs_cpu, '.1e'):>9}")
    print()
    print("n/exp = tokens per active expert; T = tokens; GB/s = weight bytes touched (model "
          "dtype) / median time;\n" + _bw_note(points) + ";\n"
          "%BWmax = of the max of the read-bandwidth probes before/after all points;\n"
          "%roof = of min(the read bandwidth %BW uses, compute peak x bytes per weight / n/exp): the FMA peak,\n"
          "  or on the amx tier's tile points (bf16; QMoE from 16 tokens per expert, 64 on -al4) the tile peak;\n"
          "x CPU = speed-up over ORT's CPU EP on the same dtype, x CPUf32 = over the CPU EP's f32 model;\n"
          "x ggml = ggml time / HinaMoE time (> 1: HinaMoE faster; EP ggml = llama.cpp's MoE FFN on ggml);\n"
          "diff = max |HinaMoE - CPU EP| / max |CPU EP| on the same inputs.")


def plot_latency(points, path, meta=None) -> Path:
    """Latency vs tokens per expert: one panel per (model, threads), one line
    per (EP, dtype) -- the layout of the HinaMoE paper's Fig. 10."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(p.model for p in points))
    threads = sorted({p.threads for p in points})
    fig, axes = plt.subplots(len(threads), len(models), squeeze=False,
                             figsize=(4.6 * len(models), 3.6 * len(threads)))
    styles = {"HinaMoE": "-", "CPU": "--", "ggml": ":"}
    names = {"HinaMoE": "HinaMoE", "CPU": "ORT CPU EP", "ggml": "ggml"}
    colors = {"f32": "tab:blue", "f16": "tab:orange", "bf16": "tab:green", "int4": "tab:red",
              "int4-al4": "tab:purple", "int8": "tab:brown", "int8-al4": "tab:gray"}
    for r, thr in enumerate(threads):
        for c, model in enumerate(models):
            ax = axes[r][c]
            sel = [p for p in points if p.model == model and p.threads == thr]
            for ep in ("HinaMoE", "CPU", "ggml"):
                for dt in DTYPE_ORDER:
                    line = sorted((p for p in sel if p.ep == ep and p.dtype == dt),
                                  key=lambda p: p.tokens_per_expert)
                    if not line:
                        continue
                    label = f"{names[ep]} {dt}"
                    ax.plot([p.tokens_per_expert for p in line], [p.median_ms for p in line],
                            styles[ep], marker="o", ms=4, color=colors[dt], label=label)
            ax.set_xscale("log", base=2)
            ns = sorted({p.tokens_per_expert for p in sel})
            ax.set_xticks(ns)
            ax.set_xticklabels([str(n) for n in ns])
            ax.set_ylim(bottom=0)
            e = sel[0].experts if sel else "?"
            ax.set_title(f"{model} ({thr} thr, {e} experts)", fontsize=10)
            ax.set_xlabel("tokens per expert")
            ax.set_ylabel("latency (ms)")
            ax.grid(alpha=0.3)
            if r == 0 and c == 0:
                ax.legend(fontsize=8)
    if meta:
        fig.suptitle(f"MoE FFN latency - {meta.get('cpu', '')}, onnxruntime "
                     f"{meta.get('onnxruntime', '')}, tier {meta.get('tier') or '-'}",
                     fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def print_gqa_table(points) -> None:
    """``hina-bench gqa``: one row per (shape, batch, threads, context), the
    EPs side by side; speed-up = CPU EP time / HinaMoE time."""
    shapes = list(dict.fromkeys(p.shape for p in points))
    by_key = {}
    for p in points:
        by_key.setdefault((p.shape, p.dtype, p.batch, p.threads, p.context), {})[p.ep] = p
    head = (f"{'shape':<16}{'dtype':>6}{'B':>3}{'thr':>4}{'context':>8}{'HinaMoE ms':>12}{'GB/s':>7}{'%BW':>6}"
            f"{'%BWmax':>7}{'%roof':>6}{'CPU EP ms':>11}{'GB/s':>7}{'%BW':>6}{'x CPU':>7}{'diff':>9}")
    print()
    print(head)
    print("-" * len(head))
    last = None
    for key in sorted(by_key, key=lambda k: (shapes.index(k[0]), k[1], k[2], k[3], k[4])):
        if last is not None and key[:4] != last:
            print()
        last = key[:4]
        h, c = by_key[key].get("HinaMoE"), by_key[key].get("CPU")
        cols = f"{key[0]:<16}{key[1]:>6}{key[2]:>3}{key[3]:>4}{key[4]:>8}"
        for p, w in ((h, 12), (c, 11)):
            cols += (f"{_fmt(p and p.median_ms, '.3f'):>{w}}{_fmt(p and p.gbs, '.1f'):>7}"
                     f"{_fmt(p and p.pct_bw, '.0f'):>6}")
            if p is h:
                cols += f"{_fmt(h and h.pct_bw_max_probe, '.0f'):>7}{_fmt(h and h.pct_roof, '.0f'):>6}"
        cols += (f"{_fmt(h and h.speedup_vs_cpu, '.2f'):>7}"
                 f"{_fmt(h and h.max_rel_diff_vs_cpu, '.1e'):>9}")
        print(cols)
    print()
    print("GB/s = K+V bytes read per decode step / median time;\n" + _bw_note(points) + ";\n"
          "%BWmax = HinaMoE's, of the max of the read-bandwidth probes before/after all points;\n"
          "%roof = of min(the read bandwidth %BW uses, FMA peak x element size / G);\n"
          "x CPU = speed-up over ORT's CPU EP on the same node; diff = max |HinaMoE - CPU EP| / max |CPU EP|.")


def plot_gqa_latency(points, path, meta=None) -> Path:
    """``hina-bench gqa``: latency vs context, one panel per (shape, batch),
    one line per (EP, dtype, threads)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    shapes = list(dict.fromkeys(p.shape for p in points))
    batches = sorted({p.batch for p in points})
    threads = sorted({p.threads for p in points})
    dtypes = [d for d in ("f32", "f16") if any(p.dtype == d for p in points)]
    fig, axes = plt.subplots(len(batches), len(shapes), squeeze=False,
                             figsize=(4.6 * len(shapes), 3.6 * len(batches)))
    styles = {"HinaMoE": "-", "CPU": "--"}
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for r, b in enumerate(batches):
        for c, shape in enumerate(shapes):
            ax = axes[r][c]
            sel = [p for p in points if p.shape == shape and p.batch == b]
            series = [(dt, thr) for dt in dtypes for thr in threads]
            for ep in ("HinaMoE", "CPU"):
                for i, (dt, thr) in enumerate(series):
                    line = sorted((p for p in sel if p.ep == ep and p.threads == thr and p.dtype == dt),
                                  key=lambda p: p.context)
                    if line:
                        ax.plot([p.context for p in line], [p.median_ms for p in line], styles[ep],
                                marker="o", ms=4, color=colors[i % len(colors)],
                                label=f"{'HinaMoE' if ep == 'HinaMoE' else 'ORT CPU EP'} {dt} {thr} thr")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            plain = FuncFormatter(lambda v, _: f"{v:g}")
            ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))  # 1, 2, 5, 10, ...
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)
            ctx = sorted({p.context for p in sel})
            ax.set_xticks(ctx)
            ax.set_xticklabels([str(x) for x in ctx])
            ax.set_title(f"{shape} (batch {b})", fontsize=10)
            ax.set_xlabel("context (tokens in the KV cache)")
            ax.set_ylabel("latency per layer (ms)")
            ax.grid(alpha=0.3)
            if r == 0 and c == 0:
                ax.legend(fontsize=8)
    if meta:
        fig.suptitle(f"GQA decode latency - {meta.get('cpu', '')}, onnxruntime "
                     f"{meta.get('onnxruntime', '')}, tier {meta.get('tier') or '-'}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
