"""``hina-bench numa-plan``: print the NUMA segment table of a weight."""

from __future__ import annotations

import argparse

NAME = "numa-plan"
HELP = "show how a weight's elements fall on NUMA nodes under page interleaving"
DESCRIPTION = """\
Print HinaMoE's segment table for a weight [ROWS, COLS] under
`numactl --interleave=all`: pages go round-robin over the nodes, so element
(x, y) sits on node ((x*COLS + y) * bytes / PAGE) mod NODES. The pattern repeats
every Tx = PAGE*NODES / gcd(COLS*bytes, PAGE*NODES) rows; each node computes only
on its own segments (row, k_start, k_end) and the partial sums are reduced.

Examples:
  hina-bench numa-plan --rows 2048 --cols 6144 --dtype bf16 --nodes 2   # the paper's example
  hina-bench numa-plan --rows 768 --cols 2048 --dtype int4 --nodes 4 --offset 512
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rows", type=int, required=True, help="weight rows (output features)")
    p.add_argument("--cols", type=int, required=True, help="weight columns (input features, K)")
    p.add_argument("--dtype", default="bf16", help="f32, f16, bf16, int8 or int4 (default: bf16)")
    p.add_argument("--nodes", type=int, default=2, help="NUMA nodes (default: 2)")
    p.add_argument("--page-size", type=int, default=4096, help="page size in bytes (default: 4096)")
    p.add_argument("--offset", type=int, default=0,
                   help="bytes from the start of the first page to the weight (default: 0)")
    p.add_argument("--max-rows", type=int, default=16, help="rows of the period to print (default: 16)")


def run(args: argparse.Namespace) -> int:
    import hinamoe

    plan = hinamoe.numa_plan(args.rows, args.cols, args.dtype, args.nodes, args.page_size, args.offset)
    print(f"weight [{plan.rows}, {plan.cols}] {plan.dtype}, {plan.nodes} nodes, "
          f"{plan.page_size}-byte pages, offset {plan.offset}")
    print(f"period Tx = {plan.period_rows} row(s); segments per node: "
          + ", ".join(f"node {n}: {len(s)}" for n, s in enumerate(plan.segments)))
    for row in range(min(plan.period_rows, args.max_rows)):
        parts = []
        for n, segs in enumerate(plan.segments):
            ranges = " ".join(f"[{a},{b})" for r, a, b in segs if r == row)
            if ranges:
                parts.append(f"node {n}: {ranges}")
        print(f"  row {row:>4}: " + "; ".join(parts))
    if plan.period_rows > args.max_rows:
        print(f"  ... {plan.period_rows - args.max_rows} more rows (--max-rows)")
    return 0
