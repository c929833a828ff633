"""The machine probes results are measured against: read bandwidth (before,
after and between a point's timed runs), FMA rate and AMX tile rate per
thread count."""

from __future__ import annotations

import statistics
import sys

from .quiet import OtherLoad, wait_until_quiet
from .roofline import roofline_gbs

PROBE_MIN_BYTES = 256 * 2 ** 20


def probe_bytes(bw_bytes_gib: float | None, l3: int) -> int:
    """Bytes of the read probe's buffer: --bw-bytes (GiB) when given, else
    max(4 x L3, 256 MiB), enough that a pass streams from DRAM."""
    if bw_bytes_gib:
        return int(bw_bytes_gib * 2 ** 30)
    return max(4 * l3, PROBE_MIN_BYTES)


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
