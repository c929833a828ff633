"""hina-bench: the CLI parses, and a tiny ffn run writes results and a plot."""

from __future__ import annotations

import json

import pytest

from hinamoe.bench.cli import build_parser, main

from support.bench_checks import check_probe_arithmetic


def test_help_texts(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["--help"])
    assert ei.value.code == 0
    assert "ffn" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["ffn", "--help"])
    out = capsys.readouterr().out
    for opt in ("--models", "--tokens", "--dtypes", "--threads", "--isa", "--repeats",
                "--out", "--no-cpu-ep", "--quick"):
        assert opt in out


def test_parser_lists():
    args = build_parser().parse_args(["ffn", "--tokens", "1,2,4", "--dtypes", "bf16,f32",
                                      "--threads", "1", "--models", "mixtral-8x7b:2"])
    assert args.tokens == [1, 2, 4] and args.dtypes == ["bf16", "f32"] and args.threads == [1]


def test_list_models(capsys):
    assert main(["ffn", "--list-models"]) == 0
    out = capsys.readouterr().out
    for name in ("qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3", "gpt-oss-20b"):
        assert name in out


@pytest.mark.parametrize("sub", ["ffn", "gqa"])
def test_isa_this_cpu_cannot_run(sub, tmp_path, capsys):
    """An --isa the CPU lacks (or an unknown one) stops before any model is
    built, with the reason, not with an ORT traceback per session."""
    import hinamoe

    bad = ["nope"] + [isa for isa in ("amx", "avx512", "avx2") if hinamoe.tier_unavailable_reason(isa)]
    for isa in bad:
        assert main([sub, "--isa", isa, "--no-progress", "--out", str(tmp_path)]) != 0
        err = capsys.readouterr().err
        assert f"--isa {isa}: " in err and hinamoe.tier_unavailable_reason(isa) in err
        assert "Traceback" not in err
    assert not (tmp_path / "results.json").exists()


def test_tiny_ffn_run(tmp_path, capsys):
    """qwen3-30b-a3b shape with 8 experts, 1 token per expert, one repeat."""
    argv = ["ffn", "--models", "qwen3-30b-a3b:8", "--tokens", "1,2", "--dtypes", "bf16,f32",
            "--threads", "1", "--repeats", "2", "--warmup", "1",
            "--bw-bytes", "0.03", "--no-ggml", "--no-progress", "--out", str(tmp_path)]
    assert main(argv) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    pts = res["points"]
    assert {p["ep"] for p in pts} == {"HinaMoE", "CPU"}  # ggml: test_bench_ggml.py
    for p in pts:
        assert p["median_ms"] > 0 and p["gbs"] > 0
        assert p["tokens"] == p["tokens_per_expert"]  # active = k = 8
        assert p["bytes_touched"] == 8 * 3 * 2048 * 768 * (2 if p["dtype"] == "bf16" else 4)
    hina = [p for p in pts if p["ep"] == "HinaMoE"]
    assert all(p["speedup_vs_cpu_f32"] for p in hina)
    check_probe_arithmetic(res, point_repeats=2)
    # %roof against the point's own probe, recomputed here from the JSON
    fma = res["meta"]["fma_peak_per_s"]["1"]
    for p in pts:
        size = 2 if p["dtype"] == "bf16" else 4
        roof = min(p["probe_gbs"], fma * size / p["tokens_per_expert"] / 1e9)
        assert p["roof_gbs"] == pytest.approx(roof, rel=1e-9)
        assert p["pct_roof"] == pytest.approx(100 * p["gbs"] / roof, rel=1e-9)
    f32 = [p for p in hina if p["dtype"] == "f32"]
    assert all(p["max_rel_diff_vs_cpu"] is not None and p["max_rel_diff_vs_cpu"] < 1e-3
                   for p in f32)
    assert (tmp_path / "latency.png").stat().st_size > 1000
    assert "qwen3-30b-a3b" in capsys.readouterr().out


def test_unknown_dtype_is_a_clear_error(tmp_path, capsys):
    assert main(["ffn", "--dtypes", "int4-al4", "--no-progress", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--dtypes" in err and "int4-al4" in err and "int8" in err


def test_roofline_bound():
    from hinamoe.bench.roofline import roofline_gbs

    # 2 cores x 50 G lane-FMA/s, 33 GB/s: bf16 is bandwidth-bound at 1 token
    # per expert, FMA-bound from 4 on (100e9 * 2 / 8 = 25 GB/s at 8).
    assert roofline_gbs(33.0, 100e9, 2, 1) == 33.0
    assert roofline_gbs(33.0, 100e9, 2, 8) == pytest.approx(25.0)
    assert roofline_gbs(33.0, 100e9, 4, 16) == pytest.approx(25.0)
    assert roofline_gbs(33.0, None, 2, 16) == 33.0
    assert roofline_gbs(None, 100e9, 2, 1) is None


def test_fma_probe_is_physical():
    import hinamoe

    if hinamoe.tier_unavailable_reason("avx2"):
        pytest.skip("needs AVX2/FMA")
    r1 = hinamoe.measure_fma_peak(threads=1)
    # >= 1 lane-FMA per ns; <= 32 lanes per cycle at 6 GHz
    assert 1e9 < r1 < 32 * 6e9
    if not hinamoe.tier_unavailable_reason("avx512"):
        # 512-bit vectors: at least the 256-bit rate (down-clocked cores), at most twice it
        r512 = hinamoe.measure_fma_peak(threads=1, bits=512)
        assert 0.8 * r1 < r512 < 2.6 * r1
    with pytest.raises(ValueError):
        hinamoe.measure_fma_peak(threads=1, bits=128)


def test_tile_peak_probe():
    """TDPBF16PS / TDPBUSD multiply-adds per second where AMX runs (a
    TDPBF16PS is 8192 of them: between one per 64 and one per 4 cycles at
    1-6 GHz), a clear error elsewhere."""
    import hinamoe

    if hinamoe.tier_unavailable_reason("amx"):
        with pytest.raises(RuntimeError, match="needs AMX"):
            hinamoe.measure_tile_peak(threads=1)
        return
    bf16 = hinamoe.measure_tile_peak(threads=1)
    assert 8192 / 64 * 1e9 < bf16 < 8192 / 4 * 6e9
    assert 0.8 * bf16 < hinamoe.measure_tile_peak(threads=1, kind="int8") < 2.6 * bf16  # 16x16x64 per TDPBUSD
    with pytest.raises(ValueError):
        hinamoe.measure_tile_peak(kind="fp8")


def test_points_on_tiles():
    from hinamoe.bench.roofline import on_tiles

    assert on_tiles("amx", "bf16", 1) and on_tiles("amx", "int4", 16) and not on_tiles("amx", "int4", 15)
    assert on_tiles("amx", "int4-al4", 64) and not on_tiles("amx", "int4-al4", 63)
    assert on_tiles("amx", "int8", 32) and not on_tiles("amx", "int8", 16) and not on_tiles("amx", "int8-al4", 64)
    assert not on_tiles("amx", "f32", 64) and not on_tiles("avx512", "bf16", 64) and not on_tiles(None, "int4", 64)


def test_roofline_width_follows_the_tier():
    from hinamoe.bench.roofline import fma_bits_for_tier

    assert [fma_bits_for_tier(t) for t in ("avx512", "amx", "avx2", "ref", "amx-emu", None)] == \
        [512, 512, 256, 256, 256, 256]


def test_quick_ffn_run_records_interleaved_probes(tmp_path, capsys):
    """--quick (narrowed to one small point so it stays fast): the JSON's
    points carry their interleaved probe and %BW is gbs / probe_gbs."""
    argv = ["ffn", "--quick", "--models", "qwen3-30b-a3b:8", "--tokens", "1", "--threads", "1",
            "--repeats", "3", "--warmup", "1", "--bw-bytes", "0.03", "--no-progress", "--no-plot",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert {p["dtype"] for p in res["points"]} == {"f32", "bf16"}  # --quick's dtypes
    check_probe_arithmetic(res, point_repeats=3)
    assert res["meta"]["bandwidth_probe_bytes"] == int(0.03 * 2 ** 30)
    out = capsys.readouterr().out
    assert "%BWmax" in out and "read bandwidth during the points (1 thr" in out


def test_no_probe_between_times_back_to_back(tmp_path, capsys):
    """--no-probe-between: no probe passes per point; %BW is then against the
    max of the before/after probes (= %BWmax), and the roofline too."""
    argv = ["ffn", "--models", "qwen3-30b-a3b:8", "--tokens", "1", "--dtypes", "f32", "--threads", "1",
            "--repeats", "2", "--warmup", "1", "--no-probe-between", "--no-cpu-ep",
            "--bw-bytes", "0.03", "--no-progress", "--no-plot", "--out", str(tmp_path)]
    assert main(argv) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["meta"]["interleaved_probe"] is False
    best = res["meta"]["read_bandwidth_gbs"]["1"]
    for p in res["points"]:
        assert p["probe_gbs"] is None and p["probe_passes_gbs"] == []
        assert p["pct_bw"] == pytest.approx(100 * p["gbs"] / best, rel=1e-9)
        assert p["pct_bw"] == p["pct_bw_max_probe"]
        assert p["roof_gbs"] == pytest.approx(min(best, res["meta"]["fma_peak_per_s"]["1"] * 4 / 1e9))
    out = capsys.readouterr().out
    assert "--no-probe-between" in out and "during the points" not in out


def test_read_probe_passes():
    """hinamoe.ReadProbe: plausible GB/s pass after pass, one and two threads."""
    import hinamoe

    for threads in (1, 2):
        with hinamoe.ReadProbe(16 << 20, threads) as probe:
            assert probe.threads == threads
            assert probe.nbytes == (16 << 20) // threads // 256 * 256 * threads
            passes = [probe.pass_gbs() for _ in range(4)]
        # > 0.1 GB/s (any machine streams faster); < 10 TB/s (no machine does)
        assert all(0.1 < g < 1e4 for g in passes), passes
        with pytest.raises(ValueError, match="closed"):
            probe.pass_gbs()
        probe.close()  # closing twice is fine


@pytest.mark.parametrize("nbytes, threads, what", [
    (0, 1, "nbytes"), (-4096, 1, "nbytes"), (4096.0, 1, "nbytes"),
    (4096, 0, "threads"), (4096, -1, "threads"), (4096, 100000, "threads"),
])
def test_read_probe_bad_arguments(nbytes, threads, what):
    import hinamoe

    with pytest.raises(ValueError, match=f"ReadProbe: {what}"):
        hinamoe.ReadProbe(nbytes, threads)


def test_wait_until_quiet(monkeypatch):
    """Returns after the first quiet window when nothing runs; waits up to
    max_s while the process keeps a core busy (CPU clock faked: 1 s per read)."""
    import time

    from hinamoe.bench.quiet import wait_until_quiet

    assert wait_until_quiet(window_s=0.002, max_s=5.0) < 2.5
    ticks = iter(range(10 ** 6))
    monkeypatch.setattr(time, "process_time", lambda: float(next(ticks)))
    assert wait_until_quiet(window_s=0.002, max_s=0.05) >= 0.05


def test_rewarm_replays_the_rotation_until_min_s():
    """One pass over the steps in order (ending with the step just timed),
    repeated until min_s passed."""
    import time

    from hinamoe.bench.quiet import rewarm

    calls = []
    steps = [lambda k=k: calls.append(k) for k in (2, 0, 1)]
    rewarm(steps, min_s=0.0)
    assert calls == [2, 0, 1]
    calls.clear()
    t0 = time.perf_counter()
    rewarm(steps, min_s=0.02)
    assert time.perf_counter() - t0 >= 0.02
    assert len(calls) % 3 == 0 and len(calls) > 3 and calls[:3] == [2, 0, 1] and calls[-1] == 1


def test_measure_read_bandwidth_on_the_probe():
    """The one-shot probe is the median of ReadProbe passes: plausible GB/s."""
    import hinamoe

    assert 0.1 < hinamoe.measure_read_bandwidth(threads=2, nbytes=16 << 20, repeats=3) < 1e4


def test_other_load_sees_a_busy_neighbour():
    """A child process spinning for ~0.6 s shows up as ~1 core of others'
    load (this process's own CPU time is not counted)."""
    import subprocess
    import sys
    import time

    from hinamoe.bench.quiet import OtherLoad

    load = OtherLoad()
    if load.t0 is None:
        pytest.skip("no /proc/stat")
    spin = "import time\nt=time.time()\nwhile time.time()-t<0.6: pass"
    subprocess.run([sys.executable, "-c", spin], check=True)
    time.sleep(0.1)
    used = load.cores_used()
    assert used is not None and used > 0.5
    assert "other processes" in OtherLoad.warning(used)
    assert OtherLoad.warning(0.01) is None


def test_ffn_numa_sim_runs_partitioned(tmp_path, capsys):
    """--numa-sim 4: HinaMoE runs under a simulated 4-node topology and still
    agrees with the CPU EP."""
    argv = ["ffn", "--models", "qwen3-30b-a3b:8", "--tokens", "2", "--dtypes", "f32",
            "--threads", "2", "--repeats", "2", "--warmup", "1", "--numa-sim", "4",
            "--bw-bytes", "0.03", "--no-progress", "--no-plot", "--out", str(tmp_path)]
    assert main(argv) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["meta"]["numa_sim"] == 4
    hina = [p for p in res["points"] if p["ep"] == "HinaMoE"]
    assert hina and all(p["max_rel_diff_vs_cpu"] < 1e-3 for p in hina)
    assert "numa=fake:4" in capsys.readouterr().out


def test_tiny_qmoe_ffn_run(tmp_path, capsys):
    """--dtypes int4,int8: QMoE rows at accuracy_level absent and 4, HinaMoE and
    the CPU EP side by side, bytes = codes + scales, results agree."""
    argv = ["ffn", "--models", "qwen3-30b-a3b:8", "--tokens", "1", "--dtypes", "int4,int8",
            "--threads", "1", "--repeats", "2", "--warmup", "1",
            "--bw-bytes", "0.03", "--no-progress", "--no-plot", "--out", str(tmp_path)]
    assert main(argv) == 0
    pts = json.loads((tmp_path / "results.json").read_text())["points"]
    got = {(p["dtype"], p["ep"]) for p in pts}
    want = {(d, ep) for d in ("int4", "int4-al4", "int8", "int8-al4") for ep in ("HinaMoE", "CPU")}
    assert got == want | {("f32", "CPU")}  # the f32 CPU EP baseline always runs
    pts = [p for p in pts if p["dtype"] != "f32"]
    for p in pts:
        bits = 4 if p["dtype"].startswith("int4") else 8
        codes = 3 * 2048 * 768 * bits // 8
        scales = (2 * 768 * 2048 // 32 + 2048 * 768 // 32) * 4
        assert p["bytes_touched"] == 8 * (codes + scales)
        assert p["gbs"] > 0
        if p["ep"] == "HinaMoE":
            assert p["speedup_vs_cpu_same"] is not None
            # float path vs CPU EP (int8 tokens on either side allow ~2%)
            assert p["max_rel_diff_vs_cpu"] is not None and p["max_rel_diff_vs_cpu"] < 5e-2
    assert "int4-al4" in capsys.readouterr().out
