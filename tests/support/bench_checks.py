"""Checks shared by the hina-bench tests (ffn and gqa results.json)."""
from __future__ import annotations

import statistics

import pytest


def check_probe_arithmetic(res, point_repeats: int) -> None:
    """Every point carries its own interleaved read probe (one pass per timed
    run), and %BW / %BWmax / the roofline are the stated ratios of it."""
    for p in res["points"]:
        assert len(p["probe_passes_gbs"]) == point_repeats
        assert all(g > 0 for g in p["probe_passes_gbs"])
        assert p["probe_gbs"] > 0
        # the passes are stored rounded to 0.01 GB/s
        assert p["probe_gbs"] == pytest.approx(statistics.median(p["probe_passes_gbs"]), abs=0.011)
        assert p["pct_bw"] == pytest.approx(100 * p["gbs"] / p["probe_gbs"], rel=1e-9)
        best = res["meta"]["read_bandwidth_gbs"][str(p["threads"])]
        assert best == max(res["meta"]["read_bandwidth_probes_gbs"][str(p["threads"])])
        assert p["pct_bw_max_probe"] == pytest.approx(100 * p["gbs"] / best, rel=1e-9)
