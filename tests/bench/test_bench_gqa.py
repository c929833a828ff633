"""hina-bench gqa: the CLI parses, and a tiny run writes results and a plot."""

from __future__ import annotations

import json

import pytest

from hinamoe.bench.cli import build_parser, main

from support.bench_checks import check_probe_arithmetic


def test_help_lists_options(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["gqa", "--help"])
    assert ei.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--shapes", "--contexts", "--batches", "--threads", "--isa", "--repeats",
                "--out", "--no-cpu-ep", "--quick", "--list-shapes", "--dtypes"):
        assert opt in out


def test_parser_lists():
    args = build_parser().parse_args(["gqa", "--contexts", "512,2048", "--batches", "1,4",
                                      "--threads", "2", "--shapes", "mixtral-8x7b"])
    assert args.contexts == [512, 2048] and args.batches == [1, 4] and args.threads == [2]
    assert args.shapes == ["mixtral-8x7b"]


def test_list_shapes(capsys):
    assert main(["gqa", "--list-shapes"]) == 0
    out = capsys.readouterr().out
    for name in ("qwen3-30b-a3b", "mixtral-8x7b", "gpt-oss-20b"):
        assert name in out


def test_bad_choices(capsys):
    assert main(["gqa", "--shapes", "nope", "--no-progress"]) == 2
    assert main(["gqa", "--dtypes", "f64", "--no-progress"]) == 2


def test_tiny_gqa_run(tmp_path, capsys):
    argv = ["gqa", "--shapes", "gpt-oss-20b", "--contexts", "33,257", "--batches", "1,2",
            "--threads", "1", "--dtypes", "f32,f16", "--repeats", "2", "--warmup", "1",
            "--max-layers", "2",
            "--bw-bytes", "0.03", "--no-progress", "--out", str(tmp_path)]
    assert main(argv) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    pts = res["points"]
    assert {p["ep"] for p in pts} == {"HinaMoE", "CPU"}
    assert len(pts) == 2 * 2 * 2 * 2 and {p["dtype"] for p in pts} == {"f32", "f16"}
    check_probe_arithmetic(res, point_repeats=2)
    for p in pts:
        assert p["median_ms"] > 0 and p["gbs"] > 0 and p["pct_bw"]
        itemsize = 2 if p["dtype"] == "f16" else 4
        assert p["kv_bytes"] == 2 * p["batch"] * 8 * p["context"] * 64 * itemsize
        # gpt-oss: 64 query heads over 8 KV heads, G = 8; the point's own probe
        fma = res["meta"]["fma_peak_per_s"]["1"]
        roof = min(p["probe_gbs"], fma * itemsize / 8 / 1e9)
        assert p["roof_gbs"] == pytest.approx(roof, rel=1e-9)
        assert p["pct_roof"] == pytest.approx(100 * p["gbs"] / roof, rel=1e-9)
    for p in (p for p in pts if p["ep"] == "HinaMoE"):
        assert p["speedup_vs_cpu"] > 0
        limit = 1e-2 if p["dtype"] == "f16" else 1e-4
        assert p["max_rel_diff_vs_cpu"] is not None and p["max_rel_diff_vs_cpu"] < limit
    assert (tmp_path / "gqa-latency.png").stat().st_size > 1000
    assert "gpt-oss-20b" in capsys.readouterr().out


def test_bf16_runs_on_hinamoe_alone(tmp_path):
    """bf16: ORT's CPU EP has no bf16 GroupQueryAttention, so the points are
    HinaMoE's only, with K/V bytes at 2 per element and a 2-byte roofline."""
    argv = ["gqa", "--shapes", "qwen3-30b-a3b", "--contexts", "65", "--batches", "1",
            "--threads", "1", "--dtypes", "bf16", "--repeats", "2", "--warmup", "1",
            "--max-layers", "1", "--bw-bytes", "0.03", "--no-progress", "--no-plot",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    pts = res["points"]
    assert [p["ep"] for p in pts] == ["HinaMoE"] and pts[0]["dtype"] == "bf16"
    p = pts[0]
    assert p["kv_bytes"] == 2 * 1 * 4 * 65 * 128 * 2  # K+V, 4 KV heads, d 128, bf16
    assert p["gbs"] > 0 and p["speedup_vs_cpu"] is None
    fma = res["meta"]["fma_peak_per_s"]["1"]
    assert p["roof_gbs"] == pytest.approx(min(p["probe_gbs"], fma * 2 / 8 / 1e9))


def test_quick_gqa_run_records_interleaved_probes(tmp_path, capsys):
    """--quick (narrowed to one small context so it stays fast): both EPs'
    points carry their own interleaved probe and %BW is gbs / probe_gbs."""
    argv = ["gqa", "--quick", "--contexts", "65", "--threads", "1", "--repeats", "3", "--warmup", "1",
            "--max-layers", "1", "--bw-bytes", "0.03", "--no-progress", "--no-plot", "--out", str(tmp_path)]
    assert main(argv) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert {p["ep"] for p in res["points"]} == {"HinaMoE", "CPU"}
    check_probe_arithmetic(res, point_repeats=3)
    out = capsys.readouterr().out
    assert "%BWmax" in out and "read bandwidth during the points (1 thr" in out
