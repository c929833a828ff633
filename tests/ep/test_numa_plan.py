"""hinamoe.numa_plan (the C ABI segment planner) against a brute-force page
map written here from the definition of page interleaving."""

from __future__ import annotations

import numpy as np
import pytest

import hinamoe
from hinamoe.bench.cli import main as bench_main

BITS = {"f32": 32, "f16": 16, "bf16": 16, "int8": 8, "int4": 4}


def brute_force_nodes(rows: int, cols: int, bits: int, nodes: int, page: int, offset: int) -> np.ndarray:
    """Node of every element: its first byte's page, pages round-robin from node 0."""
    x, y = np.meshgrid(np.arange(rows, dtype=np.int64), np.arange(cols, dtype=np.int64), indexing="ij")
    byte = offset + (x * cols + y) * bits // 8
    return (byte // page) % nodes


def test_paper_example():
    plan = hinamoe.numa_plan(64, 6144, "bf16", 2)
    assert plan.period_rows == 2
    assert plan.segments[0] == [(0, 0, 2048), (0, 4096, 6144), (1, 2048, 4096)]
    assert plan.segments[1] == [(0, 2048, 4096), (1, 0, 2048), (1, 4096, 6144)]


@pytest.mark.parametrize("dtype", list(BITS))
@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_against_brute_force(dtype, nodes, rng):
    bits = BITS[dtype]
    for _ in range(6):
        cols = int(rng.choice([int(rng.integers(1, 5000)), 2048, 6144, 2880, 7168]))
        if bits == 4 and cols % 2:
            cols += 1  # int4 rows pack two per byte; an odd row would split a byte
        rows = int(rng.integers(1, 40))
        page = int(rng.choice([4096, 8192]))
        offset = int(rng.integers(0, page // max(bits // 8, 1))) * max(bits // 8, 1)
        plan = hinamoe.numa_plan(rows, cols, dtype, nodes, page, offset)
        truth = brute_force_nodes(rows, cols, bits, nodes, page, offset)
        assert 1 <= plan.period_rows <= rows
        cover = np.full((plan.period_rows, cols), -1)
        for node, segs in enumerate(plan.segments):
            for r, a, b in segs:
                assert 0 <= a < b <= cols and 0 <= r < plan.period_rows
                assert (cover[r, a:b] == -1).all(), "element covered twice"
                cover[r, a:b] = node
                assert (truth[r, a:b] == node).all(), f"segment {(r, a, b)} not local to node {node}"
        assert (cover >= 0).all(), "element not covered"
        # The pattern repeats every period_rows rows (shifted by whole page cycles).
        for r in range(plan.period_rows, rows):
            assert (truth[r] == truth[r % plan.period_rows]).all()


@pytest.mark.parametrize("args", [
    dict(rows=0, cols=8, dtype="bf16", nodes=2),
    dict(rows=8, cols=8, dtype="fp8", nodes=2),
    dict(rows=8, cols=8, dtype="bf16", nodes=0),
    dict(rows=8, cols=8, dtype="bf16", nodes=2, page_size=4095),
    dict(rows=8, cols=8, dtype="bf16", nodes=2, offset=4096),
])
def test_bad_arguments(args):
    with pytest.raises(ValueError):
        hinamoe.numa_plan(**args)


def test_bench_numa_plan_prints_table(capsys):
    assert bench_main(["numa-plan", "--rows", "64", "--cols", "6144", "--dtype", "bf16", "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "period Tx = 2" in out and "node 0: [0,2048) [4096,6144)" in out
