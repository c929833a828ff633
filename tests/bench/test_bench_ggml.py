"""hina-bench ffn's ggml column: the ctypes binding of llama.cpp's ggml runs
llama.cpp's MoE FFN graph correctly (against the float64 reference and
against HinaMoE on the same point), and without ggml the benchmark says how
to get it. The tests that need ggml skip when it is absent (it comes from
llama-cpp-python built from source, which CI does not do)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hinamoe.bench import ggml_ffn, ggml_lib
from hinamoe.bench.cli import main
from hinamoe.models import MoEConfig, build_moe_model, model_path, np_dtype

from support.moe_reference import check_close, reference_for


def _ggml_or_skip():
    try:
        return ggml_lib.load()
    except ggml_lib.GgmlUnavailable as exc:
        pytest.skip(f"ggml not available: {exc}")


def _tie_free_logits(rng, tokens: int, experts: int, dtype: str) -> np.ndarray:
    """Random router logits with no two equal in a row after rounding to
    `dtype`: ggml's top-k orders ties as it likes, the op gives them to the
    higher expert, so a tie across the k-th place (1 row in ~10 with
    bfloat16 normals) would pick another expert on each side. A random
    permutation of levels 0.75 apart plus noise within +-0.25 stays
    distinct after bf16 rounding (spacing <= 2^-5 below |x| = 8)."""
    levels = np.argsort(rng.random((tokens, experts)), axis=1) - experts / 2
    noise = rng.uniform(-0.25, 0.25, (tokens, experts))
    logits = (levels * 0.75 + noise).astype(np_dtype(dtype))
    assert all(len(set(row.tolist())) == experts for row in logits.astype(np.float32))
    return logits


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("fusion", [0, 1, 2])
def test_ggml_moe_matches_reference(dtype, fusion, rng, tmp_path):
    """The ggml graph (weights rewritten from the ONNX model's file, routing
    inside the graph) against the float64 reference of the MoE op; output
    poisoned before each run, the second run must repeat the first."""
    g = _ggml_or_skip()
    e = int(rng.integers(3, 9))
    cfg = MoEConfig(hidden=int(rng.integers(2, 9)) * 16, inter=int(rng.integers(1, 6)) * 8 + 8,
                    experts=e, k=int(rng.integers(1, e + 1)), activation="swiglu",
                    swiglu_fusion=fusion, dtype=dtype,
                    normalize_routing_weights=int(rng.integers(0, 2)))
    model, w = build_moe_model(cfg, rng=rng, external_dir=tmp_path, keep_weights=True)
    offsets = ggml_ffn.write_ggml_weights(model_path(model), cfg, tmp_path / "ggml.weights")
    layer = ggml_ffn.GgmlMoE(g, cfg, tmp_path / "ggml.weights", offsets, threads=2)
    try:
        tokens = int(rng.integers(1, 12))
        x = rng.standard_normal((tokens, cfg.hidden)).astype(np_dtype(dtype))
        logits = _tie_free_logits(rng, tokens, e, dtype)
        step = layer.step(x, logits)
        outs = []
        for _ in range(2):
            step.fill_output(np.nan)
            step.run()
            outs.append(step.output())
        ref = reference_for(cfg, x, logits, w)
        # ggml rounds the activations to the weight type before each dot
        # product (HinaMoE's AMX design does so too; the tolerances allow it)
        check_close(outs[0], ref, dtype, f"ggml {cfg.describe()}")
        np.testing.assert_array_equal(outs[0], outs[1])
    finally:
        layer.close()


def test_ggml_column_in_ffn_run(tmp_path, capsys):
    """A tiny hina-bench ffn run with ggml: a ggml point beside every HinaMoE
    point, the ratio is ggml time / HinaMoE time, both computed the same."""
    g = _ggml_or_skip()
    argv = ["ffn", "--models", "qwen3-30b-a3b:8", "--tokens", "1,2", "--dtypes", "bf16,f32,f16",
            "--threads", "1,2", "--repeats", "2", "--warmup", "1", "--no-cpu-ep",
            "--bw-bytes", "0.03", "--no-progress", "--out", str(tmp_path)]
    assert main(argv) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["meta"]["ggml"]["available"] and res["meta"]["ggml"]["version"] == g.version
    assert res["meta"]["ggml"]["cpu_features"] == g.cpu_features  # what its kernels use here
    pts = res["points"]
    hina = [p for p in pts if p["ep"] == "HinaMoE"]
    ggml = {(p["dtype"], p["threads"], p["tokens_per_expert"]): p for p in pts if p["ep"] == "ggml"}
    assert len(hina) == len(ggml) == 12
    for p in hina:
        q = ggml[(p["dtype"], p["threads"], p["tokens_per_expert"])]
        assert len(q["times_ms"]) == 2 and q["median_ms"] > 0 and q["bytes_touched"] == p["bytes_touched"]
        assert len(q["probe_passes_gbs"]) == 2  # its own probe passes
        assert p["speedup_vs_ggml"] == pytest.approx(q["median_ms"] / p["median_ms"], rel=1e-9)
        assert 0 <= p["max_rel_diff_vs_ggml"] < ggml_ffn.DIFF_LIMIT[p["dtype"]], p
    out = capsys.readouterr()
    assert "x ggml" in out.out and f"ggml {g.version}" in out.out
    assert "not the same computation" not in out.err


def test_ffn_run_without_ggml_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    """Always runs: a --ggml-lib without the libraries (and no environment
    variable) gives a run without ggml points whose output says why and how
    to get ggml; the JSON records it."""
    monkeypatch.delenv(ggml_lib.ENV_VAR, raising=False)
    empty = tmp_path / "no-ggml"
    empty.mkdir()
    argv = ["ffn", "--models", "qwen3-30b-a3b:8", "--tokens", "1", "--dtypes", "f32",
            "--threads", "1", "--repeats", "2", "--warmup", "1", "--no-cpu-ep", "--ggml-lib", str(empty),
            "--bw-bytes", "0.03", "--no-progress", "--no-plot", "--out", str(tmp_path)]
    assert main(argv) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert {p["ep"] for p in res["points"]} == {"HinaMoE"}
    assert all(p["speedup_vs_ggml"] is None for p in res["points"])
    meta = res["meta"]["ggml"]
    assert meta["available"] is False and "libggml.so" in meta["note"]
    out = capsys.readouterr().out
    assert "ggml column: not run" in out and str(empty) in out
    assert "pip install --no-binary llama-cpp-python llama-cpp-python" in out
    assert "DGGML_NATIVE=ON" in out


def test_find_lib_dir(tmp_path, monkeypatch):
    """--ggml-lib beats the environment variable, which beats llama-cpp-python;
    a directory lacking a library is refused with the missing names."""
    monkeypatch.setattr(ggml_lib, "_llama_cpp_lib_dir", lambda: None)
    monkeypatch.delenv(ggml_lib.ENV_VAR, raising=False)
    d, why = ggml_lib.find_lib_dir()
    assert d is None and ggml_lib.ENV_VAR in why and "llama-cpp-python" in why
    full, part = tmp_path / "full", tmp_path / "part"
    for folder, names in ((full, ggml_lib.LIBS), (part, ggml_lib.LIBS[:1])):
        folder.mkdir()
        for name in names:
            (folder / name).write_bytes(b"")
    monkeypatch.setenv(ggml_lib.ENV_VAR, str(full))
    assert ggml_lib.find_lib_dir()[0] == full
    assert ggml_lib.find_lib_dir(full / "libggml.so")[0] == full  # a file names its directory
    d, why = ggml_lib.find_lib_dir(part)
    assert d is None and "libggml-cpu.so" in why and "libggml.so" in why and "--ggml-lib" in why
    with pytest.raises(ggml_lib.GgmlUnavailable, match="cannot load ggml"):
        ggml_lib.load(full)  # empty files are not libraries


def test_no_ggml_option(tmp_path, capsys):
    argv = ["ffn", "--models", "qwen3-30b-a3b:8", "--tokens", "1", "--dtypes", "f32", "--threads", "1",
            "--repeats", "2", "--warmup", "1", "--no-cpu-ep", "--no-ggml", "--bw-bytes", "0.03",
            "--no-progress", "--no-plot", "--out", str(tmp_path)]
    assert main(argv) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert {p["ep"] for p in res["points"]} == {"HinaMoE"}
    assert res["meta"]["ggml"] == {"available": False, "note": "--no-ggml"}
    assert "ggml" not in capsys.readouterr().out.split("model ")[0]


def test_help_explains_the_ratio(capsys):
    with pytest.raises(SystemExit):
        main(["ffn", "--help"])
    out = capsys.readouterr().out
    assert "--ggml-lib" in out and "--no-ggml" in out
    assert "ggml time / HinaMoE time" in out and ggml_lib.ENV_VAR in out


def test_time_alternating_order():
    """Each timed run follows its own side's rotation ending with the step
    before it; sides take turns, the first side flips every repetition;
    between_* follows each timed run of its side."""
    log = []
    hina = [lambda s=s: log.append(("h", s)) for s in range(3)]
    gg = [lambda s=s: log.append(("g", s)) for s in range(3)]
    th, tg = ggml_ffn.time_alternating(hina, gg, repeats=4, warmup=0,
                                       between_hina=lambda: log.append(("h", "probe")),
                                       between_ggml=lambda: log.append(("g", "probe")))
    assert len(th) == len(tg) == 4 and all(t >= 0 for t in th + tg)
    probes = [i for i, ev in enumerate(log) if ev[1] == "probe"]
    assert [log[i][0] for i in probes] == ["h", "g", "g", "h", "h", "g", "g", "h"]
    for n, i in enumerate(probes):
        side, r = log[i][0], n // 2
        assert log[i - 1] == (side, r % 3)  # the timed run, just before its probe
        assert log[i - 2] == (side, (r - 1) % 3)  # the rotation ends with the step before it
        start = probes[n - 1] + 1 if n else 0
        assert all(ev[0] == side for ev in log[start:i])  # nothing of the other side in between
    with pytest.raises(ValueError, match="same"):
        ggml_ffn.time_alternating(hina, gg[:2], 1, 0)
