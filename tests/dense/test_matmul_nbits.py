"""com.microsoft::MatMulNBits on HinaMoE: against a float64 reference written
from the op's definition (codes, scales and zero points as the builder drew
them, before packing) and against ORT's CPU EP on the same model where it
runs the node (float32, float16); bfloat16 against the reference only.
Every tier, partial last blocks, zero points, bias, accuracy_level 4 (int8
tokens per block), placement, what is left to the CPU EP, bad input and
concurrent runs."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hinamoe.models import MatMulNBitsConfig, build_matmul_nbits_model
from hinamoe.models.moe_layer import _ortvalue, np_dtype

from support.moe_reference import check_close
from support.quant_reference import matmul_nbits_reference as reference
from support.runtime import TILES_ON, require_isa, tiles_in_effect
from support.sessions import cpu_session, error_text
from support.sessions import hina_session as _hina_session
from support.sessions import profile_node_providers


def hina_session(model, **kw):
    """A HinaMoE session with the bf16 tile kernel on (the EP's default)."""
    return _hina_session(model, extra_options={**TILES_ON, **kw.pop("extra_options", {})}, **kw)


def run(sess, a: np.ndarray, n: int) -> np.ndarray:
    """Y for A through IOBinding, Y preallocated and poisoned with NaN (and
    bfloat16 fed and fetched, which plain sess.run cannot)."""
    binding = sess.io_binding()
    ov_a = _ortvalue(a)
    binding.bind_ortvalue_input("A", ov_a)
    y = np.full(a.shape[:-1] + (n,), np.nan, dtype=a.dtype)
    ov_y = _ortvalue(y)
    binding.bind_ortvalue_output("Y", ov_y)
    sess.run_with_iobinding(binding)
    return y


def _inputs(cfg: MatMulNBitsConfig, m: int, rng, batch: int = 1) -> np.ndarray:
    a = rng.standard_normal((batch, m, cfg.K)) if cfg.input_rank == 3 else rng.standard_normal((m, cfg.K))
    return a.astype(np_dtype(cfg.dtype))


def _off_int8_boundaries(a: np.ndarray, block: int) -> np.ndarray:
    """A moved so that every value sits at least 0.1 of a code from an int8
    rounding boundary of its block (scale = max|x| / 127, which stays): the
    float32 kernel and the float64 reference then round alike."""
    K = a.shape[-1]
    x = np.pad(np.asarray(a, np.float64), [(0, 0)] * (a.ndim - 1) + [(0, (-K) % block)])
    blocks = x.reshape(*x.shape[:-1], -1, block)
    scale = np.abs(blocks).max(axis=-1, keepdims=True) / 127
    v = blocks / np.where(scale > 0, scale, 1.0)
    r = np.rint(v)
    moved = np.where(np.abs(np.abs(v) - 127) < 1e-9, v, r + np.clip(v - r, -0.4, 0.4))
    moved = np.where(np.abs(moved - r) > 0.4, r + 0.4 * np.sign(moved - r), moved)
    out = (moved * scale).reshape(x.shape)[..., :K]
    return out.astype(a.dtype)


def _factor(cfg: MatMulNBitsConfig, int8_side: bool) -> float:
    """int8 tokens on one side and not the other: about 1% of the output scale."""
    return 200.0 * max(1.0, cfg.block_size / 32) if int8_side else 1.0


ISAS = ["ref", "avx2", "avx512", "amx", "amx-emu"]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("K,block", [(256, 32), (200, 32), (160, 16), (384, 128), (96, 128)])
@pytest.mark.parametrize("zero_points", [False, True])
def test_float_path_vs_reference(isa, bits, K, block, zero_points, rng):
    require_isa(isa)
    cfg = MatMulNBitsConfig(K=K, N=int(rng.integers(40, 100)), bits=bits, block_size=block,
                            zero_points=zero_points, bias=bool(rng.integers(0, 2)))
    model, parts = build_matmul_nbits_model(cfg, rng)
    sess = hina_session(model, isa=isa, threads=2)
    assert sess.get_providers()[0] == "HinaMoE"
    for m in (1, int(rng.integers(2, 9)), int(rng.integers(16, 40))):
        a = _inputs(cfg, m, rng)
        check_close(run(sess, a, cfg.N), reference(a, parts, bf16=tiles_in_effect(isa, m, bits=bits)), "float32",
                    f"{isa} M={m}")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("zero_points", [False, True])
def test_int8_tokens_vs_reference(isa, bits, zero_points, rng):
    """accuracy_level 4: A rounded to int8 per weight block, as in the reference."""
    require_isa(isa)
    cfg = MatMulNBitsConfig(K=256, N=72, bits=bits, block_size=32, zero_points=zero_points, bias=True,
                            accuracy_level=4)
    model, parts = build_matmul_nbits_model(cfg, rng)
    sess = hina_session(model, isa=isa, threads=2)
    for m in (1, 5, 33, 70):
        a = _off_int8_boundaries(_inputs(cfg, m, rng), cfg.block_size)
        # int8 codes of the kernel (float32) and the reference (float64) may
        # round a value next to a boundary differently: a code step's allowance.
        check_close(run(sess, a, cfg.N), reference(a, parts, int8_tokens=True, bf16=tiles_in_effect(isa, m, 4, bits)),
                    "float32", f"{isa} M={m}", factor=20.0)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("accuracy_level", [None, 4])
@pytest.mark.parametrize("zero_points", [False, True])
def test_parity_with_cpu_ep(bits, dtype, accuracy_level, zero_points, rng):
    cfg = MatMulNBitsConfig(K=512, N=96, bits=bits, block_size=32, dtype=dtype, zero_points=zero_points,
                            bias=True, accuracy_level=accuracy_level)
    model, parts = build_matmul_nbits_model(cfg, rng)
    hina, cpu = hina_session(model, threads=2), cpu_session(model, threads=2)
    for m in (1, int(rng.integers(2, 20))):
        a = _off_int8_boundaries(_inputs(cfg, m, rng), cfg.block_size)
        out, ref_cpu = run(hina, a, cfg.N), run(cpu, a, cfg.N)
        assert out.dtype == np_dtype(dtype) and out.shape == (1, m, cfg.N)
        tiles = tiles_in_effect("auto", m, accuracy_level, bits)
        ours_i8 = accuracy_level == 4 and not tiles
        check_close(out, reference(a, parts, int8_tokens=ours_i8, bf16=tiles), dtype, "HinaMoE vs float64",
                    factor=20.0 if ours_i8 else 1.0)
        # MLAS uses int8 tokens at accuracy_level 4 (and for 8-bit weights on
        # some releases): a different rounding than the float64 reference;
        # the tile kernel rounds to bf16.
        check_close(out, ref_cpu.astype(np.float64), "bfloat16" if tiles else dtype, "HinaMoE vs CPU EP",
                    factor=_factor(cfg, True) if (accuracy_level == 4 or bits == 8) else 2.0)


@pytest.mark.parametrize("isa", ["auto", "ref"])
def test_bfloat16(isa, rng):
    """bf16 A, scales, bias and Y (the CPU EP has no bf16 MatMulNBits)."""
    cfg = MatMulNBitsConfig(K=320, N=64, bits=4, block_size=64, dtype="bfloat16", bias=True)
    model, parts = build_matmul_nbits_model(cfg, rng)
    sess = hina_session(model, isa=isa)
    a = _inputs(cfg, 7, rng)
    check_close(run(sess, a, cfg.N), reference(a, parts), "bfloat16", "bf16")


def test_rank2_and_many_tokens(rng):
    """A [M, K] and a prefill-sized M (chunking and the many-token kernels)."""
    cfg = MatMulNBitsConfig(K=512, N=48, bits=4, block_size=32, input_rank=2)
    model, parts = build_matmul_nbits_model(cfg, rng)
    a = _inputs(cfg, 300, rng)
    check_close(run(hina_session(model, threads=2), a, cfg.N), reference(a, parts, bf16=tiles_in_effect("auto", 300)),
                "float32", "M=300")
    empty = np.zeros((0, cfg.K), np.float32)
    assert hina_session(model).run(None, {"A": empty})[0].shape == (0, cfg.N)


def test_placement_profiled(tmp_path, rng):
    cfg = MatMulNBitsConfig(K=128, N=32)
    model, _ = build_matmul_nbits_model(cfg, rng)
    sess = hina_session(model, profile_prefix=str(tmp_path / "prof"))
    sess.run(None, {"A": _inputs(cfg, 3, rng)})
    assert profile_node_providers(sess.end_profiling()).get("MatMulNBits") == "HinaMoE"


def test_two_bit_left_to_cpu_ep(rng):
    """2-bit weights stay on the CPU EP, which runs them; without the fallback
    the session cannot be made."""
    cfg = MatMulNBitsConfig(K=64, N=16, bits=2)
    model, parts = build_matmul_nbits_model(cfg, rng)
    sess = hina_session(model, no_fallback=False, cpu_fallback_provider=True)
    assert sess.get_providers()[0] == "HinaMoE"
    a = _inputs(cfg, 2, rng)
    check_close(run(sess, a, cfg.N), reference(a, parts), "float32", "2-bit on the CPU EP", factor=_factor(cfg, True))
    with pytest.raises(Exception):
        hina_session(model, no_fallback=True)


def test_bad_input_is_a_clear_error(rng):
    """A of the wrong width (declared with a free last dimension, so ORT
    lets it through) and scales of the wrong size: errors that name the op,
    the input and the reason, and the session keeps working."""
    from onnx import numpy_helper

    cfg = MatMulNBitsConfig(K=128, N=32)
    model, parts = build_matmul_nbits_model(cfg, rng)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "k"
    sess = hina_session(model)
    with pytest.raises(Exception) as exc:
        run(sess, rng.standard_normal((1, 2, 100)).astype(np.float32), cfg.N)
    msg = error_text(exc.value)
    assert "MatMulNBits" in msg and "'A'" in msg and "last dimension must be K" in msg, msg
    a = _inputs(cfg, 2, rng)
    check_close(run(sess, a, cfg.N), reference(a, parts), "float32", "after the error")

    scales = model.graph.initializer[1]
    scales.CopyFrom(numpy_helper.from_array(np.ones(cfg.N * cfg.blocks - 1, np.float32), scales.name))
    with pytest.raises(Exception) as exc:
        run(hina_session(model), a, cfg.N)
    msg = error_text(exc.value)
    assert "MatMulNBits" in msg and "'scales'" in msg, msg


def test_concurrent_runs(rng):
    cfg = MatMulNBitsConfig(K=256, N=128, bits=4, block_size=32, accuracy_level=4, bias=True)
    model, parts = build_matmul_nbits_model(cfg, rng)
    sess = hina_session(model, threads=2)
    inputs = [_inputs(cfg, int(rng.integers(1, 24)), rng) for _ in range(8)]
    want = [run(sess, a, cfg.N) for a in inputs]
    errors = []

    def worker(i):
        for _ in range(5):
            got = run(sess, inputs[i], cfg.N)
            if not np.array_equal(got, want[i]):
                errors.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
