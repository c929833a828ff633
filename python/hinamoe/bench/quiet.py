"""Keeping timings the machine's own: the CPU other processes used meanwhile,
waiting until ORT's pool threads stop spinning, and re-warming the caches
before a timed run."""

from __future__ import annotations

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
