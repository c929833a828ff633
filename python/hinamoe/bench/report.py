"""Terminal table and plot for ``hina-bench`` results."""

from __future__ import annotations

from pathlib import Path


def _fmt(v, spec, empty="-"):
    return empty if v is None else format(v, spec)


def print_table(points, bandwidth=None) -> None:
    """One row per point, grouped by model; speed-ups are CPU EP time / HinaMoE time."""
    head = (f"{'model':<16}{'dtype':>6}{'EP':>8}{'thr':>4}{'n/exp':>6}{'T':>4}"
            f"{'ms':>10}{'GB/s':>8}{'%BW':>6}{'x CPU':>7}{'x CPUf32':>9}{'diff':>9}")
    print()
    print(head)
    print("-" * len(head))
    last = None
    models = list(dict.fromkeys(p.model for p in points))
    order = sorted(points, key=lambda p: (models.index(p.model), p.threads, p.tokens_per_expert,
                                          p.ep != "HinaMoE", ["f32", "f16", "bf16"].index(p.dtype)))
    for p in order:
        group = (p.model, p.threads)
        if last is not None and group != last:
            print()
        last = group
        print(f"{p.model:<16}{p.dtype:>6}{p.ep:>8}{p.threads:>4}{p.tokens_per_expert:>6}"
              f"{p.tokens:>4}{p.median_ms:>10.3f}{p.gbs:>8.1f}{_fmt(p.pct_bw, '.0f'):>6}"
              f"{_fmt(p.speedup_vs_cpu_same, '.2f'):>7}{_fmt(p.speedup_vs_cpu_f32, '.2f'):>9}"
              f"{_fmt(p.max_rel_diff_vs_cpu, '.1e'):>9}")
    print()
    print("n/exp = tokens per active expert; T = tokens; GB/s = weight bytes touched (model "
          "dtype) / median time;\n%BW = of the measured read bandwidth; x CPU = speed-up over "
          "ORT's CPU EP on the same dtype, x CPUf32 = over the CPU EP's f32 model;\n"
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
    styles = {"HinaMoE": "-", "CPU": "--"}
    colors = {"f32": "tab:blue", "f16": "tab:orange", "bf16": "tab:green"}
    for r, thr in enumerate(threads):
        for c, model in enumerate(models):
            ax = axes[r][c]
            sel = [p for p in points if p.model == model and p.threads == thr]
            for ep in ("HinaMoE", "CPU"):
                for dt in ("f32", "f16", "bf16"):
                    line = sorted((p for p in sel if p.ep == ep and p.dtype == dt),
                                  key=lambda p: p.tokens_per_expert)
                    if not line:
                        continue
                    label = f"{'HinaMoE' if ep == 'HinaMoE' else 'ORT CPU EP'} {dt}"
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
