"""ONNX MatMul at float16 / bfloat16 on HinaMoE (a dense linear whose weight
is stored at that width): against a float64 reference on every tier, over
token counts that take both of the op's splits (along K for a few tokens,
along N for more), A of any rank, B a graph input, opset 11; against the
CPU EP where it runs the node; placement, what HinaMoE leaves alone
(float32 and batched MatMuls, even with strict=1), bad input and
concurrent runs."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hinamoe.models import build_matmul_model
from hinamoe.models.moe_layer import _ortvalue, np_dtype

from support.runtime import require_isa
from support.sessions import cpu_session, error_text, hina_session, profile_node_providers

ISAS = ["ref", "avx2", "avx512", "amx", "amx-emu"]
DTYPES = ["float16", "bfloat16"]
# Half an ulp of T, the one rounding of the float32 sum, and half the
# spacing of T's subnormals (where Y rounds to one).
HALF_ULP = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
TINY = {"float16": 2.0 ** -25, "bfloat16": 2.0 ** -134}


def run(sess, a: np.ndarray, n: int, w: np.ndarray | None = None) -> np.ndarray:
    """Y through IOBinding (bfloat16 in and out), preallocated and poisoned."""
    binding = sess.io_binding()
    keep = [_ortvalue(a)]
    binding.bind_ortvalue_input("A", keep[0])
    if w is not None:
        keep.append(_ortvalue(w))
        binding.bind_ortvalue_input("W", keep[1])
    y = np.full(a.shape[:-1] + (n,), np.nan, dtype=a.dtype)
    keep.append(_ortvalue(y))
    binding.bind_ortvalue_output("Y", keep[-1])
    sess.run_with_iobinding(binding)
    return y


def check(y: np.ndarray, a: np.ndarray, w: np.ndarray, dtype: str, what: str) -> None:
    """Y against the float64 product: one rounding to T plus float32
    summation error (K terms)."""
    a64, w64 = a.astype(np.float64), w.astype(np.float64)
    want = a64 @ w64
    mag = np.abs(a64) @ np.abs(w64)
    K = w.shape[0]
    allowed = HALF_ULP[dtype] * np.abs(want) + (K + 2) * 1.2e-7 * mag + TINY[dtype]
    got = y.astype(np.float64)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    assert np.isfinite(got).all(), f"{what}: non-finite output"
    err = np.abs(got - want)
    assert (err <= allowed).all(), f"{what}: max error {err.max():.3g}, worst ratio {(err / allowed).max():.2f}"


def inputs(shape, dtype, rng) -> np.ndarray:
    return rng.standard_normal(shape).astype(np_dtype(dtype))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_against_float64(isa, dtype, rng):
    require_isa(isa)
    for K, N in [(64, 96), (100, 200), (257, 33), (2048, 160)]:
        model, w = build_matmul_model(K, N, dtype, rng)
        sess = hina_session(model, isa=isa, threads=2)
        # 1-8 tokens split the rows of B over the threads; more split its columns.
        for tokens in (1, 3, 8, 9, 70):
            a = inputs((1, tokens, K), dtype, rng)
            check(run(sess, a, N), a, w, dtype, f"{isa} {dtype} K={K} N={N} tokens={tokens}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("a_rank", [1, 2, 4])
def test_any_rank_of_a(dtype, a_rank, rng):
    K, N = 48, 80
    model, w = build_matmul_model(K, N, dtype, rng, a_rank=a_rank)
    sess = hina_session(model, threads=2)
    shape = {1: (K,), 2: (5, K), 4: (2, 3, 2, K)}[a_rank]
    a = inputs(shape, dtype, rng)
    check(run(sess, a, N), a, w, dtype, f"A of rank {a_rank}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_weight_as_a_graph_input(dtype, rng):
    K, N = 40, 70
    model, _ = build_matmul_model(K, N, dtype, rng, weight_input=True)
    sess = hina_session(model, threads=2)
    for _ in range(2):
        a, w = inputs((2, 4, K), dtype, rng), inputs((K, N), dtype, rng)
        check(run(sess, a, N, w), a, w, dtype, "B fed at run time")


def test_float16_at_opset_11(rng):
    model, w = build_matmul_model(64, 32, "float16", rng, opset=11)
    sess = hina_session(model)
    a = inputs((1, 5, 64), "float16", rng)
    check(run(sess, a, 32), a, w, "float16", "opset 11")


def test_float16_matches_the_cpu_ep(rng):
    """Where ORT's CPU EP runs a float16 MatMul, both agree to T's rounding."""
    model, w = build_matmul_model(256, 96, "float16", rng)
    try:
        cpu = cpu_session(model)
    except Exception as e:  # noqa: BLE001 - a build of ORT without the kernel
        pytest.skip(f"the CPU EP does not run a float16 MatMul here: {e}")
    sess = hina_session(model, threads=2)
    a = inputs((1, 6, 256), "float16", rng)
    got, want = run(sess, a, 96).astype(np.float64), cpu.run(None, {"A": a})[0].astype(np.float64)
    assert np.allclose(got, want, rtol=2 * HALF_ULP["float16"], atol=1e-3), np.abs(got - want).max()


@pytest.mark.parametrize("dtype", DTYPES)
def test_placement_profiled(dtype, tmp_path, rng):
    model, _ = build_matmul_model(64, 32, dtype, rng)
    sess = hina_session(model, profile_prefix=str(tmp_path / "prof"))  # no CPU fallback allowed either
    run(sess, inputs((1, 3, 64), dtype, rng), 32)
    assert profile_node_providers(sess.end_profiling()).get("MatMul") == "HinaMoE"


def test_float32_matmul_is_left_to_the_cpu_ep(tmp_path, rng):
    """float32 MatMuls are not HinaMoE's op: the CPU EP runs them, also with
    strict=1 (which only concerns the ops HinaMoE runs)."""
    model, w = build_matmul_model(64, 32, "float32", rng)
    sess = hina_session(model, no_fallback=False, cpu_fallback_provider=True, profile_prefix=str(tmp_path / "p"),
                        extra_options={"strict": "1"})
    a = inputs((1, 3, 64), "float32", rng)
    np.testing.assert_allclose(sess.run(None, {"A": a})[0], a @ w, rtol=1e-5, atol=1e-5)
    assert profile_node_providers(sess.end_profiling()).get("MatMul") == "CPUExecutionProvider"


def test_batched_matmul_is_left_to_the_cpu_ep(tmp_path, rng):
    """B of rank 3 (a batched product, e.g. attention scores) is not a dense
    linear: HinaMoE leaves it to the CPU EP, also with strict=1."""
    from onnx import TensorProto, helper

    node = helper.make_node("MatMul", ["A", "B"], ["Y"], name="mm")
    f16 = TensorProto.FLOAT16
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", f16, [2, 3, 16]),
                                            helper.make_tensor_value_info("B", f16, [2, 16, 8])],
                              [helper.make_tensor_value_info("Y", f16, [2, 3, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    sess = hina_session(model, no_fallback=False, cpu_fallback_provider=True, profile_prefix=str(tmp_path / "p"),
                        extra_options={"strict": "1"})
    a, b = inputs((2, 3, 16), "float16", rng), inputs((2, 16, 8), "float16", rng)
    got = sess.run(None, {"A": a, "B": b})[0].astype(np.float64)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.astype(np.float64), rtol=4e-3, atol=4e-3)
    assert profile_node_providers(sess.end_profiling()).get("MatMul") == "CPUExecutionProvider"


def test_bad_input_is_a_clear_error(rng):
    """A whose last dimension is not B's first (declared free, so ORT lets it
    through): an error naming the op, node, input and reason; the session
    keeps working."""
    K, N = 64, 32
    model, w = build_matmul_model(K, N, "bfloat16", rng)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "k"
    sess = hina_session(model)
    with pytest.raises(Exception) as exc:
        run(sess, inputs((1, 2, 50), "bfloat16", rng), N)
    msg = error_text(exc.value)
    assert "MatMul" in msg and "'mm'" in msg and "'A'" in msg and "last dimension must be B's first" in msg, msg
    a = inputs((1, 2, K), "bfloat16", rng)
    check(run(sess, a, N), a, w, "bfloat16", "after the error")


def test_concurrent_runs(rng):
    model, _ = build_matmul_model(256, 192, "bfloat16", rng)
    sess = hina_session(model, threads=2)
    batch = [inputs((1, int(rng.integers(1, 24)), 256), "bfloat16", rng) for _ in range(8)]
    want = [run(sess, a, 192) for a in batch]
    errors = []

    def worker(i):
        for _ in range(5):
            if not np.array_equal(run(sess, batch[i], 192), want[i]):
                errors.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(batch))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
