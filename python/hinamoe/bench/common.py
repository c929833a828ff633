"""What every hina-bench subcommand shares: list options, machine facts,
sessions on HinaMoE or the CPU EP, and the read-bandwidth probes the
results are measured against."""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

L3_BYTES_DEFAULT = 32 * 2 ** 20
PROBE_MIN_BYTES = 256 * 2 ** 20


def csv(kind):
    """argparse type for a comma-separated list of `kind`."""
    def parse(text: str):
        items = [s.strip() for s in text.split(",") if s.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        try:
            return [kind(s) for s in items]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc
    return parse


def l3_bytes() -> int:
    try:
        base = Path("/sys/devices/system/cpu/cpu0/cache")
        best = 0
        for idx in base.glob("index*"):
            level = int((idx / "level").read_text())
            if level == 3:
                size = (idx / "size").read_text().strip()
                mult = {"K": 1024, "M": 2 ** 20}.get(size[-1], 1)
                best = max(best, int(size.rstrip("KM")) * mult)
        return best or L3_BYTES_DEFAULT
    except Exception:
        return L3_BYTES_DEFAULT


def probe_bytes(bw_bytes_gib: float | None, l3: int) -> int:
    """Bytes of the read probe's buffer: --bw-bytes (GiB) when given, else
    max(4 x L3, 256 MiB), enough that a pass streams from DRAM."""
    if bw_bytes_gib:
        return int(bw_bytes_gib * 2 ** 30)
    return max(4 * l3, PROBE_MIN_BYTES)


def cpu_name() -> str:
    """The CPU's model name, with "(seen as avx2)" under hina-bench --cpu-as."""
    from .cpu_mask import active

    seen_as = f" (seen as {active()}: hina-bench --cpu-as)" if active() else ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + seen_as
    except OSError:
        pass
    import platform

    return (platform.processor() or platform.machine()) + seen_as


def hinamoe_tier(isa: str = "auto") -> str | None:
    """Registers the EP and returns the kernel tier `isa` selects on this CPU;
    if the EP is not usable or the CPU cannot run that tier, prints why and
    returns None (before any model is built)."""
    try:
        import hinamoe

        hinamoe.register()
        if isa == "auto":
            return hinamoe.best_tier()
        why = hinamoe.tier_unavailable_reason(isa)
    except Exception as exc:  # noqa: BLE001
        print(f"hina-bench: the HinaMoE EP is not usable: {exc}\n"
              "  (build/install it, or pass --no-hinamoe to time the CPU EP alone)",
              file=sys.stderr)
        return None
    if why:
        print(f"hina-bench: --isa {isa}: {why}", file=sys.stderr)
        return None
    return isa


def session_options(threads: int, profile_prefix: str | None = None):
    """ORT session options of every benchmark: `threads` intra-op threads,
    one inter-op, errors only; profiling to `profile_prefix` when given."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


def make_session(model, ep: str, threads: int, hina_options: dict):
    """A session on HinaMoE (CPU EP fallback disabled, so every node must be
    ours) or on the CPU EP alone; `model` is a path or serialized bytes."""
    import onnxruntime as ort

    so = session_options(threads)
    if ep == "HinaMoE":
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        providers = [("HinaMoE", hina_options)]
    else:
        providers = ["CPUExecutionProvider"]
    sess = ort.InferenceSession(model, so, providers=providers)
    if ep == "HinaMoE" and sess.get_providers()[0] != "HinaMoE":
        raise RuntimeError(f"HinaMoE not used: {sess.get_providers()}")
    return sess


class OtherLoad:
    """CPU time that other processes used on this machine while a benchmark
    ran, from /proc/stat (all CPUs' busy time) minus this process's own
    (resource.getrusage): with 2 cores, one busy neighbour halves a
    2-thread run and can leave a thread off-CPU for a whole time slice, so
    numbers taken beside one are not the machine's. `cores_used()` is the
    average number of cores the others kept busy; Linux only (None elsewhere)."""

    def __init__(self, children_are_ours: bool = False):
        # children_are_ours: the CPU time of child processes waited for
        # meanwhile (llama-bench in hina-bench decode) is the benchmark's own.
        self.children = children_are_ours
        self.t0 = self._sample()

    def _sample(self):
        import os
        import resource
        import time

        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        tick = os.sysconf("SC_CLK_TCK")
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        busy = (sum(fields[:8]) - idle) / tick  # user..steal, seconds
        own = [resource.getrusage(resource.RUSAGE_SELF)]
        if self.children:
            own.append(resource.getrusage(resource.RUSAGE_CHILDREN))
        return time.monotonic(), busy, sum(ru.ru_utime + ru.ru_stime for ru in own)

    def cores_used(self) -> float | None:
        t1 = self._sample()
        if self.t0 is None or t1 is None or t1[0] <= self.t0[0]:
            return None
        others = (t1[1] - self.t0[1]) - (t1[2] - self.t0[2])
        return max(0.0, others / (t1[0] - self.t0[0]))

    @staticmethod
    def warning(used: float | None, threshold: float = 0.15) -> str | None:
        """A line for stderr when the others used `threshold` cores or more."""
        if used is None or used < threshold:
            return None
        return (f"warning: other processes kept {used:.2f} cores busy during this run; "
                "its timings are not this machine's (rerun on a quiet machine)")


class _PerThreadProbe:
    """A machine probe run per thread count before and after a benchmark;
    the larger value is used (another process on the machine lowers a probe
    more than it raises one). Subclasses give measure(threads) and fmt(value)."""

    what = "probe"

    def __init__(self, threads: list[int]):
        self.runs: dict[int, list[float]] = {t: [] for t in threads}
        self.ok = True

    def measure(self, threads: int) -> float:
        raise NotImplementedError

    def fmt(self, value: float) -> str:
        raise NotImplementedError

    def probe(self) -> None:
        if not self.ok:
            return
        for t in self.runs:
            try:
                self.runs[t].append(float(self.measure(t)))
            except Exception as exc:  # noqa: BLE001
                print(f"note: {self.what} unavailable ({exc})", file=sys.stderr)
                self.ok = False
                return

    def best(self) -> dict[int, float | None]:
        return {t: (max(v) if v else None) for t, v in self.runs.items()}

    def describe(self) -> str:
        return ", ".join(f"{t} thr {self.fmt(v)}" if v else f"{t} thr n/a" for t, v in self.best().items())


class BandwidthProbe(_PerThreadProbe):
    """Read bandwidth in GB/s per thread count, from one persistent
    hinamoe.ReadProbe (the kernel library's AVX2 reader) per thread count,
    set up once: probe() takes the median of `repeats` passes, and reader()
    hands out the same object for passes interleaved with a point's runs.
    Holds len(threads) x nbytes of memory until close()."""

    what = "read-bandwidth probe"

    def __init__(self, threads: list[int], nbytes: int, repeats: int):
        super().__init__(threads)
        self.nbytes, self.repeats = nbytes, repeats
        self._readers: dict = {}

    def reader(self, threads: int):
        """The persistent hinamoe.ReadProbe of `threads` (made, and warmed up
        by one pass, on first use)."""
        r = self._readers.get(threads)
        if r is None:
            import hinamoe

            r = hinamoe.ReadProbe(self.nbytes, threads)
            r.pass_gbs()  # warm-up
            self._readers[threads] = r
        return r

    def measure(self, threads: int) -> float:
        r = self.reader(threads)
        return statistics.median(r.pass_gbs() for _ in range(self.repeats))

    def fmt(self, value: float) -> str:
        return f"{value:.1f} GB/s"

    def close(self) -> None:
        for r in self._readers.values():
            r.close()
        self._readers.clear()


def wait_until_quiet(window_s: float = 0.005, busy: float = 0.25, max_s: float = 0.5) -> float:
    """Sleeps until this process keeps less than `busy` of a core busy over a
    `window_s` window (at most `max_s`); returns the seconds waited. After a
    Run, ONNX Runtime's intra-op pool threads spin for tens of ms
    (session.intra_op.allow_spinning, on by default); on a machine with no
    spare core they take a core from a read-probe pass started at once
    (measured here: 2 threads, 2 cores, ~0.6x the bandwidth)."""
    import time

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_s:
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(window_s)
        if time.process_time() - cpu < busy * (time.perf_counter() - wall):
            break
    return time.perf_counter() - t0


def rewarm(steps, min_s: float = 0.005) -> None:
    """Runs the untimed `steps` (callables; the rotation of a point's steps
    that ends with the one just timed) in order, again until `min_s` passed,
    so that the next timed step finds the caches (data, page-table entries)
    and ORT's pool threads as back-to-back runs leave them rather than as the
    probe pass and the idle wait before it did (measured here, GQA decode at
    2 threads: after the wait, the pass and one re-run of the same step, the
    next timed step took ~20% longer than back to back)."""
    import time

    t_end = time.perf_counter() + min_s
    while True:
        for step in steps:
            step()
        if time.perf_counter() >= t_end:
            return


class InterleavedProbe:
    """Read-probe passes taken between a point's timed runs (call it after
    each one, outside the timed interval): their median is the bandwidth of
    the minutes the point was measured in. Each pass waits until ORT's pool
    threads stopped spinning (wait_until_quiet). With no reader it records
    nothing."""

    def __init__(self, reader):
        self.reader = reader
        self.passes: list[float] = []

    def __call__(self) -> None:
        if self.reader is not None:
            wait_until_quiet()
            self.passes.append(self.reader.pass_gbs())

    def median(self) -> float | None:
        return statistics.median(self.passes) if self.passes else None


class FmaProbe(_PerThreadProbe):
    """Float lane-FMA rate per thread count (hinamoe.measure_fma_peak) on
    vectors of `bits` (those of the kernels the roofline is for)."""

    what = "FMA-rate probe"

    def __init__(self, threads: list[int], bits: int = 256):
        super().__init__(threads)
        self.bits = bits

    def measure(self, threads: int) -> float:
        import hinamoe

        return hinamoe.measure_fma_peak(threads=threads, bits=self.bits)

    def fmt(self, value: float) -> str:
        return f"{value / 1e9:.1f} G lane-FMA/s ({self.bits}-bit)"


class TileProbe(_PerThreadProbe):
    """AMX multiply-adds per second per thread count (hinamoe.measure_tile_peak,
    TDPBF16PS): the compute roofline of the amx tier's tile kernels."""

    what = "tile-rate probe"

    def measure(self, threads: int) -> float:
        import hinamoe

        return hinamoe.measure_tile_peak(threads=threads, kind="bf16")

    def fmt(self, value: float) -> str:
        return f"{value / 1e12:.2f} T bf16 multiply-adds/s (TDPBF16PS)"


def on_tiles(tier: str | None, dtype: str, tokens_per_expert: int) -> bool:
    """Whether a `hina-bench ffn` point runs on the amx tier's bf16 tiles: bf16
    MoE weights always (the HiNa micro-kernel), QMoE from 16 tokens per
    expert for int4 and 32 for int8 (64 and 128 with int8 tokens, the -al4
    rows; ops.md)."""
    if tier != "amx":
        return False
    if dtype == "bf16":
        return True
    if dtype.startswith("int"):
        least = (64 if dtype.endswith("-al4") else 16) * (2 if dtype.startswith("int8") else 1)
        return tokens_per_expert >= least
    return False


def fma_bits_for_tier(tier: str | None) -> int:
    """The FMA width of a HinaMoE tier's float kernels: 512 on avx512 (and
    amx, whose f32/f16 MoE and QMoE run those), else 256."""
    return 512 if tier in ("avx512", "amx") else 256


def roofline_gbs(bandwidth_gbs: float | None, fma_per_s: float | None, bytes_per_elem: int,
                 fmas_per_elem: int) -> float | None:
    """The fastest a stream can run (GB/s) when each element read takes
    `fmas_per_elem` FMAs (a weight at n tokens per expert: n; a K/V element
    in GQA decode: G): the lower of the read bandwidth and FMA rate x bytes
    per element / FMAs per element."""
    if not bandwidth_gbs:
        return None
    if not fma_per_s:
        return bandwidth_gbs
    return min(bandwidth_gbs, fma_per_s * bytes_per_elem / fmas_per_elem / 1e9)


class MachineProbes:
    """What every benchmark is measured against: read bandwidth and FMA rate
    per thread count, probed before and after all points, the read bandwidth
    also during each point (between(threads): one pass after each timed run,
    on the same persistent buffer), and the CPU other processes used
    meanwhile. A point's %BW and roofline use its own interleaved probe: this
    machine's bandwidth moves by tens of % from minute to minute, so a point
    is compared with the bandwidth of its own minutes; %BW against the max of
    the before/after probes is kept as pct_bw_max_probe."""

    def __init__(self, threads: list[int], bw_bytes: int, quick: bool, interleave: bool = True,
                 fma_bits: int = 256, tiles: bool = False):
        self.interleave = interleave
        self.load = OtherLoad()
        self.bandwidth = BandwidthProbe(threads, bw_bytes, repeats=3 if quick else 5)
        self.fma = FmaProbe(threads, fma_bits)
        self.tile = TileProbe(threads) if tiles else None
        self.others: float | None = None
        self._probe()

    def _probe(self) -> None:
        self.bandwidth.probe()
        self.fma.probe()
        if self.tile is not None:
            self.tile.probe()

    def describe(self, when: str) -> str:
        tile = f"\ntile peak ({when}): {self.tile.describe()}" if self.tile is not None else ""
        return (f"read bandwidth ({when}; {self.bandwidth.nbytes / 2 ** 20:.0f} MiB passes): "
                f"{self.bandwidth.describe()}\n"
                f"FMA peak ({when}): {self.fma.describe()}" + tile)

    def between(self, threads: int) -> InterleavedProbe | None:
        """Passes to take after each timed run of a point on `threads` threads
        (None with interleave=False: the timed runs go back to back)."""
        if not self.interleave:
            return None
        return InterleavedProbe(self.bandwidth.reader(threads) if self.bandwidth.ok else None)

    @staticmethod
    def record(point, probe: InterleavedProbe | None) -> None:
        """Stores a point's interleaved passes: probe_gbs (their median) and probe_passes_gbs."""
        if probe is not None:
            point.probe_gbs = probe.median()
            point.probe_passes_gbs = [round(g, 2) for g in probe.passes]

    def describe_interleaved(self, points) -> str:
        """One line per thread count: the range of the points' probe medians."""
        lines = []
        for t in self.bandwidth.runs:
            meds = [p.probe_gbs for p in points if p.threads == t and p.probe_gbs]
            if meds:
                lines.append(f"read bandwidth during the points ({t} thr, median of the passes after "
                             f"each timed run): {min(meds):.1f} .. {max(meds):.1f} GB/s over "
                             f"{len(meds)} points")
        return "\n".join(lines)

    def finish(self) -> None:
        """The probes after the points, and the other processes' load; frees the probe buffers."""
        self._probe()
        self.others = self.load.cores_used()
        self.bandwidth.close()

    def rate(self, point, bytes_per_elem: int, fmas_per_elem: int, tiles: bool = False) -> None:
        """Sets point.pct_bw and the roofline (roof_gbs, pct_roof) from point.gbs
        and its own interleaved probe (point.probe_gbs; without one, the max of
        the before/after probes), and pct_bw_max_probe against that max; the
        compute roof is the tile rate where the point runs on tiles (and the
        tile probe ran), else the FMA rate."""
        best = self.bandwidth.best().get(point.threads)
        bw = point.probe_gbs if self.interleave else best
        point.pct_bw = 100.0 * point.gbs / bw if bw else None
        point.pct_bw_max_probe = 100.0 * point.gbs / best if best else None
        tile = self.tile.best().get(point.threads) if (tiles and self.tile is not None and self.tile.ok) else None
        compute = tile or self.fma.best().get(point.threads)
        point.roof_engine = "tiles" if tile else "fma"
        point.roof_gbs = roofline_gbs(bw, compute, bytes_per_elem, fmas_per_elem)
        point.pct_roof = 100.0 * point.gbs / point.roof_gbs if point.roof_gbs else None

    def warning(self) -> str | None:
        return OtherLoad.warning(self.others)

    def meta(self) -> dict:
        """The probes' entries of a results.json meta."""
        return dict(read_bandwidth_gbs={str(k): v for k, v in self.bandwidth.best().items()},
                    read_bandwidth_probes_gbs={str(k): v for k, v in self.bandwidth.runs.items()},
                    bandwidth_probe_bytes=self.bandwidth.nbytes,
                    fma_peak_per_s={str(k): v for k, v in self.fma.best().items()},
                    fma_vector_bits=self.fma.bits,
                    tile_peak_per_s=({str(k): v for k, v in self.tile.best().items()}
                                     if self.tile is not None else None),
                    other_processes_cores=self.others,
                    interleaved_probe=self.interleave,
                    pct_bw_basis=("pct_bw, roof_gbs: against the point's probe_gbs (median of one "
                                  "read-probe pass after each timed run)" if self.interleave else
                                  "pct_bw, roof_gbs: against read_bandwidth_gbs (--no-probe-between)")
                    + "; pct_bw_max_probe: against read_bandwidth_gbs (max of the probes before/after "
                      "all points)")
