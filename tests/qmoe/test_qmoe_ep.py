"""com.microsoft::QMoE on HinaMoE: against a float64 reference written from
the op's definition (tests/qmoe_reference.py) and against ORT's CPU EP on
the same model, in every mode the CPU EP runs; beyond it (fc3,
swiglu_fusion 0/2, bf16, other activations) against the reference only.
Placement, fallbacks, bad input and concurrent runs."""

from __future__ import annotations

import glob
import os
import threading

import numpy as np
import pytest

from conftest import cpu_session, error_text, hina_session, profile_node_providers, require_isa
from hinamoe.models import QMoEConfig, build_qmoe_model, run_moe
from hinamoe.models.moe_layer import np_dtype
from moe_reference import check_close
from qmoe_reference import qmoe_reference


def _inputs(cfg: QMoEConfig, tokens: int, rng, batch: int = 1):
    dt = np_dtype(cfg.dtype)
    x = rng.standard_normal((tokens, cfg.hidden)).astype(dt)
    lg = (rng.standard_normal((tokens, cfg.experts)) * 2).astype(dt)
    rw = rng.uniform(0.01, 1.0, size=(tokens, cfg.experts)).astype(dt) if cfg.router_weights else None
    if cfg.input_rank == 3:
        x = x.reshape(batch, tokens // batch, cfg.hidden)
    return x, lg, rw


def _run(sess, cfg, x, lg, rw=None):
    out = run_moe(sess, x, lg, {"router_weights": rw} if cfg.router_weights else None)
    assert out.shape == x.shape
    return out


def _cpu_uses_int8(cfg: QMoEConfig) -> bool:
    """The CPU EP runs block-wise 8-bit experts, and block-wise 4-bit ones at
    accuracy_level 4, with int8 activations (MLAS QNBit)."""
    return cfg.block_size > 0 and (cfg.bits == 8 or cfg.accuracy_level == 4)


def _int8_factor(cfg: QMoEConfig, hina: bool) -> float:
    """int8 tokens: ~2% of the output scale, more with larger blocks (one
    scale per block's max |x|) and with zero points."""
    uses = (cfg.block_size > 0 and cfg.accuracy_level == 4) if hina else _cpu_uses_int8(cfg)
    if not uses:
        return 1.0
    return 1000.0 * max(1.0, cfg.block_size / 32) * (2.0 if cfg.zero_points else 1.0)


# ---------------------------------------------------------------- CPU EP parity


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [0, 16, 32, 64, 128])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("accuracy_level", [None, 4])
def test_parity_with_cpu_ep(bits, block, dtype, accuracy_level, rng):
    cfg = QMoEConfig(hidden=128, inter=128, experts=6, k=2, bits=bits, block_size=block, dtype=dtype,
                     fc1_bias=True, fc2_bias=True, accuracy_level=accuracy_level,
                     activation_alpha=1.702, activation_beta=1.0, swiglu_limit=7.0)
    model, w = build_qmoe_model(cfg, rng)
    x, lg, _ = _inputs(cfg, int(rng.integers(1, 12)), rng)
    hina = hina_session(model)
    assert hina.get_providers()[0] == "HinaMoE"
    out = _run(hina, cfg, x, lg)
    ref = qmoe_reference(cfg, x, lg, w)
    check_close(out, ref, dtype, "HinaMoE vs float64", factor=_int8_factor(cfg, True))
    cpu = _run(cpu_session(model), cfg, x, lg)
    check_close(cpu, ref, dtype, "CPU EP vs float64", factor=_int8_factor(cfg, False))
    check_close(out, cpu.astype(np.float64), dtype, "HinaMoE vs CPU EP",
                factor=max(_int8_factor(cfg, True), _int8_factor(cfg, False)) * 2)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [0, 32])
@pytest.mark.parametrize("normalize", [0, 1])
def test_router_weights_parity(bits, block, normalize, rng):
    cfg = QMoEConfig(hidden=64, inter=32, experts=5, k=3, bits=bits, block_size=block, router_weights=True,
                     normalize_routing_weights=normalize, fc2_bias=True)
    model, w = build_qmoe_model(cfg, rng)
    x, lg, rw = _inputs(cfg, 9, rng)
    out = _run(hina_session(model), cfg, x, lg, rw)
    check_close(out, qmoe_reference(cfg, x, lg, w, rw), "float32", "router_weights", factor=_int8_factor(cfg, True))
    cpu = _run(cpu_session(model), cfg, x, lg, rw)
    check_close(out, cpu.astype(np.float64), "float32", "vs CPU EP", factor=_int8_factor(cfg, False) * 2)


def test_routing_ties_and_tiny_weights_match_cpu_ep(rng):
    """Logits on a coarse grid (many ties, toward the higher index) and far
    apart (softmax weights below 1e-8 are dropped)."""
    cfg = QMoEConfig(hidden=64, inter=32, experts=8, k=4, bits=4, block_size=32)
    model, w = build_qmoe_model(cfg, rng)
    lg = rng.integers(-2, 3, size=(40, 8)).astype(np.float32)
    lg[::3, 0] = 40.0  # the other experts get weights < 1e-8
    x = rng.standard_normal((40, 64)).astype(np.float32)
    out = _run(hina_session(model), cfg, x, lg)
    check_close(out, qmoe_reference(cfg, x, lg, w), "float32", "ties")
    check_close(out, _run(cpu_session(model), cfg, x, lg).astype(np.float64), "float32", "ties vs CPU EP")


# ORT's test_qmoe_cpu.py: Phi3-style (silu) and SwiGLU blocks, H=128, I=256,
# E=4, k=2, [B, S] in {[1, 32], [2, 16]}, 2/4/8 bits, row-wise and block-wise
# (4-bit: 32, 8-bit: 64, 2-bit: 32), symmetric and asymmetric, 3-D input.
@pytest.mark.parametrize("activation", ["silu", "swiglu"])
@pytest.mark.parametrize("batch,seq", [(1, 32), (2, 16)])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("blockwise", [False, True])
@pytest.mark.parametrize("asymmetric", [False, True])
def test_ort_qmoe_cpu_cases(activation, batch, seq, bits, blockwise, asymmetric, rng):
    block = (64 if bits == 8 else 32) if blockwise else 0
    if bits == 2:
        _check_two_bit_left_to_cpu(activation, block, asymmetric, rng)
        return
    cfg = QMoEConfig(hidden=128, inter=256, experts=4, k=2, bits=bits, block_size=block, activation=activation,
                     fc1_bias=True, fc2_bias=True, zero_points=asymmetric, input_rank=3)
    model, w = build_qmoe_model(cfg, rng)
    x, lg, _ = _inputs(cfg, batch * seq, rng, batch)
    out = _run(hina_session(model), cfg, x, lg)
    check_close(out, qmoe_reference(cfg, x, lg, w), "float32", "float64 reference")
    cpu = _run(cpu_session(model), cfg, x, lg)
    check_close(out, cpu.astype(np.float64), "float32", "CPU EP", factor=_int8_factor(cfg, False) * 2)


def _check_two_bit_left_to_cpu(activation, block, asymmetric, rng):
    """2-bit QMoE (built by hand: our builder packs 4/8) stays on the CPU EP."""
    from onnx import TensorProto, helper

    cfg = QMoEConfig(hidden=64, inter=32, experts=4, k=2, bits=4, block_size=block, activation=activation)
    model, _ = build_qmoe_model(cfg, rng)
    node = model.graph.node[0]
    for a in node.attribute:
        if a.name == "expert_weight_bits":
            a.i = 2
    n1 = 2 * cfg.inter if activation == "swiglu" else cfg.inter
    for init in model.graph.initializer:
        if init.name in ("fc1_experts_weights", "fc2_experts_weights"):
            rows, cols = (n1, 64) if init.name.startswith("fc1") else (64, cfg.inter)
            codes = rng.integers(0, 256, size=(4, rows, cols // 4), dtype=np.uint8)
            init.CopyFrom(helper.make_tensor(init.name, TensorProto.UINT8, list(codes.shape), codes.tobytes(), raw=True))
    with pytest.raises(Exception) as info:
        hina_session(model, no_fallback=True)
    assert "QMoE" in error_text(info.value) or "node" in error_text(info.value)
    sess = hina_session(model, no_fallback=False, cpu_fallback_provider=True)
    x, lg, _ = _inputs(cfg, 3, rng)
    assert np.isfinite(_run(sess, cfg, x, lg)).all()


# ---------------------------------------------------------------- beyond the CPU EP


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [0, 32])
@pytest.mark.parametrize("layout", ["fc3", "stacked", "interleaved"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gate_layouts_and_dtypes(bits, block, layout, dtype, rng):
    fusion = {"fc3": 0, "stacked": 2, "interleaved": 1}[layout]
    cfg = QMoEConfig(hidden=64, inter=64, experts=4, k=2, bits=bits, block_size=block, dtype=dtype,
                     swiglu_fusion=fusion, fc1_bias=True, fc2_bias=True, fc3_bias=fusion == 0,
                     activation_alpha=1.702, activation_beta=1.0, swiglu_limit=7.0)
    model, w = build_qmoe_model(cfg, rng)
    x, lg, _ = _inputs(cfg, int(rng.integers(1, 10)), rng)
    out = _run(hina_session(model), cfg, x, lg)
    check_close(out, qmoe_reference(cfg, x, lg, w), dtype, f"{layout} {dtype}")


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu", "identity", "relu2", "geglu"])
@pytest.mark.parametrize("zero_points", [False, True])
def test_activations_and_zero_points(activation, zero_points, rng):
    for bits, block in ((4, 0), (4, 16), (8, 0), (8, 128)):
        cfg = QMoEConfig(hidden=128, inter=128, experts=3, k=2, bits=bits, block_size=block, activation=activation,
                         zero_points=zero_points, fc1_bias=True)
        model, w = build_qmoe_model(cfg, rng)
        x, lg, _ = _inputs(cfg, 7, rng)
        out = _run(hina_session(model), cfg, x, lg)
        check_close(out, qmoe_reference(cfg, x, lg, w), "float32", f"{activation} bits={bits} block={block}")


@pytest.mark.parametrize("isa", ["ref", "avx2", "avx512", "amx-emu"])
@pytest.mark.parametrize("with_zp", [("fc1",), ("fc3",)])
@pytest.mark.parametrize("accuracy_level", [None, 4])
def test_zero_points_on_one_of_fc1_fc3(isa, with_zp, accuracy_level, rng):
    """fc1 and fc3 share their gathered tokens, whose order is chosen for
    weights with zero points when either has them: the one without must
    still read that order (int8 tokens on the zmm kernels did not)."""
    require_isa(isa)
    for bits in (4, 8):
        cfg = QMoEConfig(hidden=256, inter=128, experts=4, k=2, bits=bits, block_size=32, swiglu_fusion=0,
                         zero_points=with_zp, accuracy_level=accuracy_level)
        model, w = build_qmoe_model(cfg, rng)
        x, lg, _ = _inputs(cfg, 5, rng)
        out = _run(hina_session(model, isa=isa), cfg, x, lg)
        check_close(out, qmoe_reference(cfg, x, lg, w), "float32", f"{isa} bits={bits} zp on {with_zp}",
                    factor=_int8_factor(cfg, hina=True))


@pytest.mark.parametrize("isa", ["ref", "avx2", "avx512"])
@pytest.mark.parametrize("accuracy_level", [None, 4])
def test_many_tokens_per_expert(isa, accuracy_level, rng):
    """12-40 tokens per expert: the avx512 kernels' transposed-token paths
    (float and int8 tokens), prefill-sized batches."""
    require_isa(isa)
    for bits in (4, 8):
        cfg = QMoEConfig(hidden=256, inter=192, experts=4, k=2, bits=bits, block_size=32, fc1_bias=True,
                         fc2_bias=True, accuracy_level=accuracy_level)
        model, w = build_qmoe_model(cfg, rng)
        x, lg, _ = _inputs(cfg, int(rng.integers(24, 80)), rng)
        out = _run(hina_session(model, isa=isa), cfg, x, lg)
        check_close(out, qmoe_reference(cfg, x, lg, w), "float32", f"{isa} bits={bits} many tokens",
                    factor=_int8_factor(cfg, hina=True))


@pytest.mark.parametrize("isa", ["ref", "avx2", "avx512", "amx-emu"])
@pytest.mark.parametrize("scale_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("accuracy_level", [None, 4])
def test_scales_narrower_than_tokens(isa, scale_dtype, accuracy_level, rng):
    """float32 tokens with float16/bfloat16 scales (T2 is free of T): what
    hina-export writes, every tier, 1 and many tokens per expert, against the
    float64 reference on the rounded scales; float16 also against the CPU EP."""
    require_isa(isa)
    for bits, block in ((4, 32), (8, 0)):
        cfg = QMoEConfig(hidden=128, inter=96, experts=4, k=2, bits=bits, block_size=block, scale_dtype=scale_dtype,
                         fc1_bias=True, fc2_bias=True, accuracy_level=accuracy_level)
        model, w = build_qmoe_model(cfg, rng)
        assert w["fc1_scales"].dtype.itemsize == 2
        x, lg, _ = _inputs(cfg, int(rng.choice([1, 3, 40])), rng)
        out = _run(hina_session(model, isa=isa), cfg, x, lg)
        ref = qmoe_reference(cfg, x, lg, w)
        check_close(out, ref, "float32", f"{isa} bits={bits} {scale_dtype} scales", factor=_int8_factor(cfg, True))
        if scale_dtype == "float16":
            cpu = _run(cpu_session(model), cfg, x, lg)
            check_close(out, cpu.astype(np.float64), "float32", "HinaMoE vs CPU EP",
                        factor=max(_int8_factor(cfg, True), _int8_factor(cfg, False)) * 2)


def test_rowwise_scales_rank3(rng):
    """Row-wise scales as [E, N, 1] count as row-wise (ORT does the same)."""
    cfg = QMoEConfig(hidden=64, inter=32, experts=3, k=1, bits=4, block_size=0, scale_rank3_rowwise=True,
                     zero_points=True)
    model, w = build_qmoe_model(cfg, rng)
    x, lg, _ = _inputs(cfg, 5, rng)
    check_close(_run(hina_session(model), cfg, x, lg), qmoe_reference(cfg, x, lg, w), "float32", "[E,N,1]")


@pytest.mark.parametrize("isa", ["ref", "avx2", "avx512", "amx-emu"])
def test_every_isa_runs_qmoe(isa, rng):
    require_isa(isa)
    cfg = QMoEConfig(hidden=64, inter=32, experts=4, k=2, bits=4, block_size=32, dtype="bfloat16", fc2_bias=True)
    model, w = build_qmoe_model(cfg, rng)
    x, lg, _ = _inputs(cfg, 6, rng)
    check_close(_run(hina_session(model, isa=isa), cfg, x, lg), qmoe_reference(cfg, x, lg, w), "bfloat16", isa)


def test_int8_activations_option(rng):
    """qmoe_int8_activations=1 quantises the tokens of nodes without
    accuracy_level (results change, stay within int8 accuracy); 0 keeps
    float on accuracy_level=4 nodes; a bad value fails session creation."""
    cfg = QMoEConfig(hidden=128, inter=64, experts=4, k=2, bits=4, block_size=32)
    model, w = build_qmoe_model(cfg, rng)
    x, lg, _ = _inputs(cfg, 8, rng)
    ref = qmoe_reference(cfg, x, lg, w)
    plain = _run(hina_session(model), cfg, x, lg)
    i8 = _run(hina_session(model, extra_options={"qmoe_int8_activations": "1"}), cfg, x, lg)
    check_close(plain, ref, "float32", "float path")
    check_close(i8, ref, "float32", "int8 path", factor=1000)
    assert np.abs(i8 - plain).max() > 1e-6, "the option changed nothing"
    cfg4 = QMoEConfig(hidden=128, inter=64, experts=4, k=2, bits=4, block_size=32, accuracy_level=4)
    model4, w4 = build_qmoe_model(cfg4, rng)
    f = _run(hina_session(model4, extra_options={"qmoe_int8_activations": "0"}), cfg4, x, lg)
    check_close(f, qmoe_reference(cfg4, x, lg, w4), "float32", "forced float")
    with pytest.raises(Exception) as info:
        hina_session(model, extra_options={"qmoe_int8_activations": "maybe"})
    assert "qmoe_int8_activations" in error_text(info.value)


# ---------------------------------------------------------------- placement


def test_profile_shows_hinamoe(tmp_path, rng):
    cfg = QMoEConfig(hidden=64, inter=32, experts=4, k=2, bits=8, block_size=32)
    model, _ = build_qmoe_model(cfg, rng)
    sess = hina_session(model, profile_prefix=str(tmp_path / "q"))
    x, lg, _ = _inputs(cfg, 4, rng)
    _run(sess, cfg, x, lg)
    path = sess.end_profiling()
    try:
        assert profile_node_providers(path).get("QMoE") == "HinaMoE"
    finally:
        for p in glob.glob(path):
            os.remove(p)


def test_fp4_quant_type_left_to_cpu_ep(rng):
    cfg = QMoEConfig(hidden=64, inter=32, experts=4, k=2, bits=4, block_size=32, extra_attrs={"quant_type": "fp4"})
    model, _ = build_qmoe_model(cfg, rng)
    with pytest.raises(Exception):
        sess = hina_session(model, no_fallback=True)
        _run(sess, cfg, *_inputs(cfg, 2, rng)[:2])


# ---------------------------------------------------------------- bad input


def _expect_error(model, feeds_fn, *needles):
    with pytest.raises(Exception) as info:
        sess = hina_session(model)
        sess.run(None, feeds_fn())
    text = error_text(info.value)
    for n in needles:
        assert n in text, text


def _replace_init(model, name, arr, elem=None):
    from onnx import TensorProto, helper

    for init in model.graph.initializer:
        if init.name == name:
            et = elem if elem is not None else (TensorProto.UINT8 if arr.dtype == np.uint8 else TensorProto.FLOAT)
            init.CopyFrom(helper.make_tensor(name, et, list(arr.shape), arr.tobytes(), raw=True))
            return
    raise KeyError(name)


def test_bad_scales_and_zero_points_shapes(rng):
    cfg = QMoEConfig(hidden=64, inter=32, experts=4, k=2, bits=4, block_size=32, zero_points=True)
    x, lg, _ = _inputs(cfg, 3, rng)
    model, w = build_qmoe_model(cfg, rng)
    _replace_init(model, "fc1_scales", w["fc1_scales"][:, :, :1].copy())
    _expect_error(model, lambda: {"input": x, "router_probs": lg}, "fc1_scales", "expected")
    model, w = build_qmoe_model(cfg, rng)
    _replace_init(model, "fc2_zero_points", w["fc2_zp"][:, :-1].copy())
    _expect_error(model, lambda: {"input": x, "router_probs": lg}, "fc2_zero_points", "expected")


def test_bad_block_size_and_k(rng):
    cfg = QMoEConfig(hidden=64, inter=32, experts=4, k=2, bits=4, block_size=32)
    x, lg, _ = _inputs(cfg, 3, rng)
    for attr, value, needle in (("block_size", 24, "power of two"), ("block_size", 8, "power of two"),
                                ("expert_weight_bits", 3, "QMoE"), ("k", 5, "exceeds")):
        model, _ = build_qmoe_model(cfg, rng)
        for a in model.graph.node[0].attribute:
            if a.name == attr:
                a.i = value
        _expect_error(model, lambda: {"input": x, "router_probs": lg}, needle)
    # K not a multiple of block_size is valid: tests/test_qmoe_partial_block.py


def test_nan_logits_and_empty_tokens(rng):
    cfg = QMoEConfig(hidden=64, inter=32, experts=4, k=2, bits=8, block_size=0)
    model, _ = build_qmoe_model(cfg, rng)
    x, lg, _ = _inputs(cfg, 5, rng)
    lg[3, 1] = np.nan
    _expect_error(model, lambda: {"input": x, "router_probs": lg}, "NaN", "token 3")
    sess = hina_session(model)
    out = sess.run(None, {"input": np.zeros((0, 64), np.float32), "router_probs": np.zeros((0, 4), np.float32)})[0]
    assert out.shape == (0, 64)


def test_scales_of_two_types(rng):
    """float16 fc1 scales beside float32 fc2 scales (T2 is one type): ORT's
    type check or our error naming the input, never a crash."""
    from onnx import TensorProto

    cfg = QMoEConfig(hidden=64, inter=32, experts=4, k=2, bits=4, block_size=32)
    model, w = build_qmoe_model(cfg, rng)
    _replace_init(model, "fc1_scales", w["fc1_scales"].astype(np.float16), TensorProto.FLOAT16)
    x, lg, _ = _inputs(cfg, 2, rng)
    with pytest.raises(Exception) as info:
        hina_session(model).run(None, {"input": x, "router_probs": lg})
    assert "scales" in error_text(info.value) or "T2" in error_text(info.value)


# ---------------------------------------------------------------- threads


def test_concurrent_runs(rng):
    cfg = QMoEConfig(hidden=128, inter=64, experts=8, k=2, bits=4, block_size=32, fc2_bias=True)
    model, w = build_qmoe_model(cfg, rng)
    sess = hina_session(model, threads=2)
    cases = [_inputs(cfg, int(rng.integers(1, 20)), rng)[:2] for _ in range(8)]
    refs = [qmoe_reference(cfg, x, lg, w) for x, lg in cases]
    errors = []

    def worker(i):
        try:
            for _ in range(3):
                x, lg = cases[i]
                check_close(_run(sess, cfg, x, lg), refs[i], "float32", f"thread {i}")
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


@pytest.mark.parametrize("nodes", [2, 4, 8])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("isa", ["ref", "avx2", "avx512", "amx-emu"])
def test_simulated_numa_nodes_partition_qmoe(nodes, bits, isa, rng, seed):
    """Under simulated 2/4/8-node topologies every QMoE weight GEMM is split
    by node along the page interleaving (rows of 768 4-bit or 8-bit codes
    straddle 4 KiB pages, so segments end mid-row, at whole scale blocks);
    the partial sums give the float64 reference. Scales, zero points, gate
    layout, T and accuracy_level are drawn per run."""
    require_isa(isa)
    block = int(rng.choice([0, 32, 64, 128]))
    al = 4 if block and rng.integers(2) else None
    dtype = str(rng.choice(["float32", "float16", "bfloat16"]))
    fusion = int(rng.integers(3))
    cfg = QMoEConfig(hidden=768, inter=384, experts=4, k=2, bits=bits, block_size=block, dtype=dtype,
                     zero_points=bool(rng.integers(2)), swiglu_fusion=fusion, fc1_bias=True, fc2_bias=True,
                     fc3_bias=fusion == 0, accuracy_level=al)
    model, w = build_qmoe_model(cfg, rng)
    sess = hina_session(model, isa=isa, threads=2, extra_options={"numa": f"fake:{nodes}"})
    for tokens in (1, int(rng.integers(2, 24))):
        x, lg, _ = _inputs(cfg, tokens, rng)
        check_close(_run(sess, cfg, x, lg), qmoe_reference(cfg, x, lg, w), dtype,
                    f"seed {seed} fake:{nodes} {isa} bits={bits} block={block} al={al} fusion={fusion} T={tokens}",
                    factor=2 * _int8_factor(cfg, hina=True) if al else 1.0)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [16, 32, 128])
def test_int8_tokens_on_amx_int8_tiles(bits, block, rng):
    """accuracy_level=4 on amx-emu runs the AMX-INT8 block kernel on the tile
    emulator (TDPBUSD on the codes as they lie): the same int8 tokens as the
    ref tier's integer dot products, so the two agree to float32 rounding of
    the per-block scale sums; both stay within int8 accuracy of float64."""
    require_isa("amx-emu")
    cfg = QMoEConfig(hidden=256, inter=128, experts=4, k=2, bits=bits, block_size=block, accuracy_level=4,
                     fc1_bias=True, zero_points=bool(rng.integers(2)))
    model, w = build_qmoe_model(cfg, rng)
    x, lg, _ = _inputs(cfg, int(rng.integers(1, 40)), rng)
    emu = _run(hina_session(model, isa="amx-emu"), cfg, x, lg)
    ref = _run(hina_session(model, isa="ref"), cfg, x, lg)
    np.testing.assert_allclose(emu, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))
    # int8 tokens: per-block rounding of up to half a code step (1/254 of the
    # block's max |x|), not float32 rounding; seen at 1.03x of factor 1000 once.
    check_close(emu, qmoe_reference(cfg, x, lg, w), "float32", "amx-emu int8", factor=2000)
