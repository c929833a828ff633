"""The fuzzer (fuzz_cases.py: random MoE, QMoE, GroupQueryAttention, MatMulNBits
and 16-bit MatMul nodes and
extreme values, every tier, against the CPU EP / float64 reference / the
ref tier), run in worker subprocesses (fuzz_worker.py) so that a crash or a
hang is a reported failure with the case's replay command.

* ``test_fuzz_ci_slice``: a fixed set of cases (same every run), a few
  hundred, well under a minute.
* ``test_fuzz_long`` (``-m slow``): fresh cases from the run's seed for
  ``HINAMOE_FUZZ_SECONDS`` seconds (default 600)::

      HINAMOE_FUZZ_SECONDS=1800 python -m pytest tests/ep/test_fuzz.py -m slow -s
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from support import fuzz_cases
from support.fuzz_worker import format_failures, run_batch

CI_SEED = 20261201


def _check(failures, counts, what):
    print(f"{what}: {counts}")
    assert not failures, f"{what}: {len(failures)} failing cases\n\n" + format_failures(failures)


def test_fuzz_ci_slice(tmp_path):
    rng = np.random.default_rng(CI_SEED)
    cases = [fuzz_cases.generate("gqa", rng) for _ in range(500)] + \
            [fuzz_cases.generate("moe", rng) for _ in range(150)] + \
            [fuzz_cases.generate("qmoe", rng) for _ in range(200)] + \
            [fuzz_cases.generate("matmul", rng) for _ in range(100)]
    failures, counts = run_batch(cases, tmp_path)
    _check(failures, counts, "fuzz CI slice")
    assert counts.get("ok", 0) > 550, counts  # most cases ran and were compared


def test_harness_reports_crash_and_hang(tmp_path):
    """A case that aborts the worker and one that hangs are failures naming
    the case; the cases after them still run."""
    rng = np.random.default_rng(1)
    good = [fuzz_cases.generate("moe", rng) for _ in range(2)]
    cases = [good[0], {"op": "selftest-crash", "seed": 7}, {"op": "selftest-hang", "seed": 8}, good[1]]
    failures, counts = run_batch(cases, tmp_path, case_timeout=5)
    assert [f["case"]["op"] for f in failures] == ["selftest-crash", "selftest-hang"], failures
    assert failures[0]["what"].startswith("crash") and failures[1]["what"].startswith("timeout")
    assert "--replay" in failures[0]["replay"] and '"seed": 7' in failures[0]["replay"]
    assert counts.get("ok", 0) + counts.get("refused", 0) == 2, counts


@pytest.mark.slow
def test_fuzz_long(tmp_path, seed):
    seconds = float(os.environ.get("HINAMOE_FUZZ_SECONDS", "600"))
    rng = np.random.default_rng(seed)
    end = time.monotonic() + seconds
    failures, totals, batches = [], {}, 0
    while time.monotonic() < end:
        cases = fuzz_cases.generate_mix(rng, 200)
        f, counts = run_batch(cases, tmp_path)
        failures += f
        for k, v in counts.items():
            totals[k] = totals.get(k, 0) + v
        batches += 1
    _check(failures, totals, f"fuzz {seconds:.0f} s, {batches} batches, seed {seed}")
