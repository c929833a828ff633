"""quantize pass (--dtype int4|int8): MoE -> QMoE, other MatMuls ->
MatMulNBits. Each quantised node runs on the CPU EP against a float64
reference on its dequantised weights; the dequantised weights lie within
half a quantisation step of the originals (one step for ORT's MatMulNBits
quantizer); routing (renormalised or not) stays the MoE's; the report names
every node; bad options are clear errors."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper

from hinamoe.graph_passes import moe_fusion, qmoe_quant, quantize, run_passes
from hinamoe.graph_passes.moe_block import interleave

from support.dense_moe_graph import build_dense_block, random_dense_weights
from support.fusion_checks import as_bytes, run_pass
from support.moe_reference import check_close
from support.quant_reference import matmul_nbits_weight, qmoe_reference, qmoe_reference_int8_activations, qmoe_weights
from support.sessions import cpu_session, hina_session
from support.unfused_moe_graph import build_unfused_block, random_block_weights

# Where the quantised nodes run (on HinaMoE under strict=1: see _session).
PROVIDERS = ["CPUExecutionProvider", "HinaMoE"]
# ORT's CPU QMoE runs block-wise 8-bit experts on MLAS' int8 kernels, which
# also round the activations to int8 per block; this switch (read when the
# session is made) keeps them float, so the float32 tolerance applies.
CPU_FLOAT_ACTIVATIONS = ("ORT_QMOE_CPU_QNBIT_GEMM", "fp32")


def _session(model, provider: str):
    if provider == "HinaMoE":
        # strict=1: a QMoE node HinaMoE would leave to the CPU EP fails here.
        return hina_session(as_bytes(model), no_fallback=False, cpu_fallback_provider=True,
                            extra_options={"strict": "1"})
    return cpu_session(as_bytes(model))


def moe_layout(weights):
    """The block's experts as MoE/QMoE hold them: fc1 [E, 2I, H] (gate and up
    rows interleaved), fc2 [E, H, I]."""
    t = (0, 2, 1)
    return interleave(weights.gate.transpose(t), weights.up.transpose(t)), weights.down.transpose(t)


def _nodes(model: ir.Model, op: str) -> list[ir.Node]:
    return [n for n in model.graph if n.op_type == op]


def _quantised_block(rng, dtype: str, normalize: bool, block_size: int, shared: int = 0):
    hidden = int(rng.choice([64, 96]))
    weights = random_block_weights(rng, hidden, int(rng.choice([32, 64])), int(rng.integers(4, 9)),
                                   shared_inter=shared)
    k = int(rng.integers(2, 4))
    model, report = run_passes(build_unfused_block(weights, k, normalize=normalize),
                               dtype=dtype, block_size=block_size)
    return weights, k, model, report


def _within_steps(dequantised, original, scales, block_size, what, steps=0.5):
    """|dequantised - original| <= steps * |scale| element-wise. Ours (QMoE)
    maps max|w| to 2**(bits-1) - 1 and rounds to nearest: half a step. ORT's
    MatMulNBits quantizer maps the largest-magnitude value to -2**(bits-1),
    so a value of the other sign and about the same size is clipped at
    2**(bits-1) - 1: up to one step. Both divide in float32, so a value
    within 2**-24 * 127 steps of a half step may round either way."""
    step = np.abs(np.repeat(np.asarray(scales, np.float64), block_size, axis=-1))
    err = np.abs(dequantised - np.asarray(original, np.float64))
    worst = float((err / (step * (steps + 127 * 2.0 ** -23) + 1e-30)).max())
    assert worst <= 1.0, f"{what}: an element is {worst * steps:.3f} steps off the original"


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("normalize", [True, False], ids=["renormalised", "not-renormalised"])
@pytest.mark.parametrize("dtype", ["int4", "int8"])
def test_qmoe_matches_float64_reference(dtype, normalize, provider, rng, monkeypatch):
    monkeypatch.setenv(*CPU_FLOAT_ACTIVATIONS)
    block_size = int(rng.choice([16, 32]))
    weights, k, model, report = _quantised_block(rng, dtype, normalize, block_size)
    bits = quantize.BITS[dtype]
    [node] = _nodes(model, "QMoE")
    assert not _nodes(model, "MoE")
    attrs = {a: node.attributes[a].value for a in node.attributes}
    assert attrs["expert_weight_bits"] == bits and attrs["block_size"] == block_size
    assert attrs["k"] == k and attrs["swiglu_fusion"] == 1 and attrs["activation_type"] == "swiglu"
    fc1, fc2 = moe_layout(weights)
    e, n1, h = fc1.shape
    assert node.inputs[2].const_value.shape == (e, n1, h * bits // 8)
    assert node.inputs[3].const_value.shape == (e, n1, h // block_size)
    # Scales are T2: float16 beside float32 tokens (they fit here).
    assert node.inputs[3].const_value.dtype == node.inputs[6].const_value.dtype == ir.DataType.FLOAT16
    assert [r["scales"] for p in report.passes if p.name == "quantize" for r in p.fused if r["op"] == "QMoE"] == ["float16"]
    assert node.inputs[5].const_value.shape == (e, h, fc2.shape[2] * bits // 8)
    # Renormalised: QMoE's own routing. Not renormalised: router_weights = Softmax(logits).
    if normalize:
        assert len(node.inputs) <= 14 or node.inputs[14] is None
    else:
        assert node.inputs[14].producer().op_type == "Softmax"
        assert node.inputs[14].producer().inputs[0] is node.inputs[1]
    # The router stays a float MatMul.
    assert [n.inputs[1].name for n in _nodes(model, "MatMul")] == ["router_weight"]
    deq = qmoe_weights(node)
    _within_steps(deq["fc1"], fc1, node.inputs[3].const_value.numpy(), block_size, "fc1")
    _within_steps(deq["fc2"], fc2, node.inputs[6].const_value.numpy(), block_size, "fc2")

    x = rng.standard_normal((2, int(rng.integers(1, 7)), h)).astype(np.float32)
    x2 = x.reshape(-1, h)
    logits = x2.astype(np.float64) @ weights.router.astype(np.float64)
    want = qmoe_reference(x2, logits, node).reshape(x.shape)
    got = _session(model, provider).run(None, {"hidden": x})[0]
    check_close(got, want, "float32", f"{dtype} QMoE, {'' if normalize else 'not '}renormalised")


def test_scales_stay_float32_where_float16_would_round_them_away(rng):
    """A block of tiny weights (scale below float16's normal range) or huge
    ones (overflow) keeps every scale of the node in the tokens' type."""
    for bad, ok in ((None, True), (3e-3, False), (1e7, False)):
        w = rng.uniform(-0.1, 0.1, size=(3, 8, 64)).astype(np.float32)
        if bad is not None:
            w[int(rng.integers(3)), int(rng.integers(8)), 32:] *= bad  # one block
        got = quantize._quantise_weight(w, 4, 32, np.float16)
        assert (got is not None) == ok
        if ok:
            packed, scales = got
            assert scales.dtype == np.float16
            _within_steps(qmoe_quant.dequantize(packed, scales, 4, 32), w, scales, 32, "float16 scales")


def test_qmoe_int8_cpu_default_int8_activations(rng):
    """The CPU EP's default for block-wise int8 experts rounds the activations
    to int8 per block as well (MLAS' int8 kernels): it matches a float64
    reference that rounds fc1's and fc2's inputs the same way, to float32
    tolerance (against the float-activation reference it is off by ~5% of
    the output's RMS)."""
    block_size = int(rng.choice([16, 32]))
    weights, k, model, _ = _quantised_block(rng, "int8", True, block_size)
    [node] = _nodes(model, "QMoE")
    h = weights.router.shape[0]
    for _ in range(100):  # tokens whose int8 codes float32 and float64 round alike
        x = rng.standard_normal((1, 9, h)).astype(np.float32)
        logits = x.reshape(-1, h).astype(np.float64) @ weights.router.astype(np.float64)
        margins = []
        want = qmoe_reference_int8_activations(x.reshape(-1, h), logits, node, margins).reshape(x.shape)
        if min(margins) > 2e-4:
            break
    else:
        pytest.fail("no draw kept every int8 code 2e-4 from a rounding boundary")
    got = cpu_session(as_bytes(model)).run(None, {"hidden": x})[0]
    check_close(got, want, "float32", "int8 QMoE, int8 activations")


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("dtype", ["int4", "int8"])
def test_dense_block_biases_and_clamp(dtype, provider, rng, monkeypatch):
    """gpt-oss's pattern: biases, alpha, beta and swiglu_limit carry over."""
    monkeypatch.setenv(*CPU_FLOAT_ACTIVATIONS)
    weights = random_dense_weights(rng, 64, 32, 4)
    model, report = run_passes(build_dense_block(weights, 2), dtype=dtype)
    [node] = _nodes(model, "QMoE")
    attrs = {a: node.attributes[a].value for a in node.attributes}
    assert attrs["swiglu_limit"] == pytest.approx(7.0) and attrs["activation_beta"] == 1.0
    assert attrs["activation_alpha"] == pytest.approx(1.702)
    assert node.inputs[4] is not None and node.inputs[7] is not None  # fc1 / fc2 biases
    x = rng.standard_normal((2, 4, 64)).astype(np.float32)
    x2 = x.reshape(-1, 64).astype(np.float64)
    logits = x2 @ weights.router.T.astype(np.float64) + weights.router_bias
    want = qmoe_reference(x2, logits, node).reshape(x.shape)
    got = _session(model, provider).run(None, {"hidden": x})[0]
    check_close(got, want, "float32", f"{dtype} dense block")


def _matmul_model(rng, k: int, n: int):
    """Two MatMuls sharing one weight [K, N], and one MatMul of two activations."""
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    f32 = TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["a", "w"], ["y1"], name="proj_a"),
             helper.make_node("MatMul", ["b", "w"], ["y2"], name="proj_b"),
             helper.make_node("MatMul", ["y1", "c"], ["y3"], name="activations")]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("a", f32, ["B", "S", k]),
         helper.make_tensor_value_info("b", f32, ["T", k]),
         helper.make_tensor_value_info("c", f32, [n, 3])],
        [helper.make_tensor_value_info(y, f32, None) for y in ("y1", "y2", "y3")],
        initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return w, model


@pytest.mark.parametrize("dtype", ["int4", "int8"])
def test_matmul_nbits_matches_float64_reference(dtype, rng):
    """K not a multiple of the block (ORT's quantizer pads it); a weight read
    by two MatMuls is quantised once; a MatMul of activations stays."""
    block_size = int(rng.choice([16, 32, 64]))
    k, n = block_size * 2 + 8, int(rng.integers(5, 40))
    w, model = _matmul_model(rng, k, n)
    quantised, report = run_pass(quantize.apply, model, dtype=dtype, block_size=block_size)
    nbits = _nodes(quantised, "MatMulNBits")
    assert [m.name for m in nbits] == ["proj_a_Q" + dtype[3:], "proj_b_Q" + dtype[3:]]
    assert nbits[0].inputs[1] is nbits[1].inputs[1]  # one copy of the packed weight
    assert [m.name for m in _nodes(quantised, "MatMul")] == ["activations"]
    assert "w" not in quantised.graph.initializers
    b = matmul_nbits_weight(nbits[0])
    assert b.shape == (k, n)
    blocks = -(-k // block_size)
    scales = nbits[0].inputs[2].const_value.numpy().reshape(n, blocks)
    padded = np.zeros((blocks * block_size, n))
    padded[:k] = w
    _within_steps(np.pad(b, ((0, blocks * block_size - k), (0, 0))).T, padded.T, scales,
                  block_size, "MatMulNBits weight", steps=1.0)
    entries = {e["layer"]: e for e in report.fused}
    assert entries["proj_a"]["weight_bytes_before"] == w.nbytes
    assert entries["proj_a"]["bits"] == quantize.BITS[dtype] and entries["proj_a"]["K"] == k
    assert entries["proj_b"]["shares_weight_of"] == "w"
    feeds = {"a": rng.standard_normal((2, 3, k)).astype(np.float32),
             "b": rng.standard_normal((4, k)).astype(np.float32),
             "c": rng.standard_normal((n, 3)).astype(np.float32)}
    y1, y2, y3 = cpu_session(as_bytes(quantised)).run(None, feeds)
    check_close(y1, feeds["a"].astype(np.float64) @ b, "float32", "y1")
    check_close(y2, feeds["b"].astype(np.float64) @ b, "float32", "y2")
    check_close(y3, (feeds["a"].astype(np.float64) @ b) @ feeds["c"], "float32", "y3")


def test_report_names_what_was_quantised(rng):
    weights, k, model, report = _quantised_block(rng, "int4", False, 32, shared=24)
    [entry] = [p for p in report.passes if p.name == "quantize"]
    by_op = {}
    for site in entry.fused:
        by_op.setdefault(site["op"], []).append(site)
    [q] = by_op["QMoE"]
    fc1, fc2 = moe_layout(weights)
    assert q["layer"] == "/model/layers.0/mlp" and q["bits"] == 4 and q["block_size"] == 32
    assert q["weight_bytes_before"] == fc1.nbytes + fc2.nbytes
    packed = (fc1.size + fc2.size) // 2
    scales = (fc1.size + fc2.size) // 32 * 2  # float16 (QMoE's T2)
    assert q["weight_bytes_after"] == packed + scales
    assert "not renormalised" in q["routing"]
    # the shared expert's gate, up, down and sigmoid gate (the first, second
    # and fourth read the same tokens: one MatMulNBits, matmul_packing.py)
    def columns_by_k(pairs):
        out = {}
        for kk, nn in pairs:
            out[kk] = out.get(kk, 0) + nn
        return out

    assert columns_by_k((s["K"], s["N"]) for s in by_op["MatMulNBits"]) == columns_by_k(
        (w.shape[0], w.shape[1]) for w in weights.shared)
    assert len(by_op["MatMulNBits"]) == 2
    assert all(s["weight_bytes_after"] < s["weight_bytes_before"] for s in by_op["MatMulNBits"])
    assert [s["reason"] for s in entry.skipped] == [
        "router stays float: a few KB, and rounding it would move tokens to other experts"]
    table = report.format_table()
    assert "op=QMoE, bits=4, block_size=32" in table and "op=MatMulNBits" in table


def _moe_node_model(rng, mutate: str):
    """A single MoE node the CPU QMoE could not run, next to a MatMul."""
    e, h, i = 4, 32, 32
    f32 = TensorProto.FLOAT
    attrs = dict(k=2, activation_type="swiglu", swiglu_fusion=1)
    inputs = ["x", "logits", "fc1", "", "fc2"]
    fc1 = rng.standard_normal((e, 2 * i, h)).astype(np.float32)
    inits = [numpy_helper.from_array(rng.standard_normal((e, h, i)).astype(np.float32), "fc2"),
             numpy_helper.from_array(rng.standard_normal((h, h)).astype(np.float32), "proj")]
    if mutate == "fc3":
        attrs["swiglu_fusion"] = 0
        fc1 = fc1[:, :i]
        inputs += ["", "fc3"]
        inits.append(numpy_helper.from_array(rng.standard_normal((e, i, h)).astype(np.float32),
                                             "fc3"))
    elif mutate == "stacked":
        attrs["swiglu_fusion"] = 2
    elif mutate == "sparse_mixer":
        attrs["use_sparse_mixer"] = 1
    elif mutate == "limit_after":
        attrs.update(swiglu_limit=7.0, swiglu_limit_after_activation=1)
    inits.append(numpy_helper.from_array(fc1, "fc1"))
    nodes = [helper.make_node("MatMul", ["x", "proj"], ["xp"], name="proj"),
             helper.make_node("MoE", ["xp", *inputs[1:]], ["y"], name="layer/MoE",
                              domain="com.microsoft", **attrs)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", f32, ["T", h]),
                     helper.make_tensor_value_info("logits", f32, ["T", e])],
        [helper.make_tensor_value_info("y", f32, ["T", h])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("mutate, reason", [
    ("fc3", "fc3"), ("stacked", "swiglu_fusion=2"), ("sparse_mixer", "use_sparse_mixer=1"),
    ("limit_after", "swiglu_limit_after_activation=1")])
def test_moe_the_cpu_qmoe_cannot_run_stays_moe(mutate, reason, rng):
    model, report = run_pass(quantize.apply, _moe_node_model(rng, mutate), dtype="int4")
    [moe] = _nodes(model, "MoE")
    assert moe.inputs[2].const_value.dtype == ir.DataType.FLOAT
    assert not _nodes(model, "QMoE")
    [skip] = [s for s in report.skipped if s["where"] == "layer"]
    assert skip["reason"].startswith("stays MoE: ") and reason in skip["reason"], skip
    assert [s["layer"] for s in report.fused] == ["proj"]  # the rest is still quantised


@pytest.mark.parametrize("block_size", [8, 24, 48, 0, -32])
def test_bad_block_size(block_size, rng):
    _, model = _matmul_model(rng, 64, 8)
    with pytest.raises(quantize.QuantizeError, match="power of two >= 16"):
        run_pass(quantize.apply, model, dtype="int4", block_size=block_size)


def test_expert_k_not_a_multiple_of_the_block(rng):
    """hidden 48 with block 32: an error naming the layer, the size and a block
    that fits, raised before the graph changes."""
    weights = random_block_weights(rng, 48, 32, 4)
    fused, _ = run_pass(moe_fusion.apply, build_unfused_block(weights, 2, normalize=True))
    before = as_bytes(fused)
    with pytest.raises(quantize.QuantizeError) as e:
        quantize.apply(fused, dtype="int4", block_size=32)
    assert "/model/layers.0/mlp" in str(e.value) and "hidden size 48" in str(e.value)
    assert "--block-size 16" in str(e.value)
    assert as_bytes(fused) == before


@pytest.mark.parametrize("dtype", [None, "fp32", "fp16", "bf16"])
def test_other_dtypes_leave_it_alone(dtype, rng):
    weights = random_block_weights(rng, 64, 32, 4)
    fused, _ = run_pass(moe_fusion.apply, build_unfused_block(weights, 2, normalize=True))
    before = as_bytes(fused)
    report = quantize.apply(fused, dtype=dtype)
    assert report.fused == [] and report.skipped == []
    assert as_bytes(fused) == before


def test_pipeline_int8_dtype_pass_steps_aside(rng):
    weights = random_block_weights(rng, 64, 32, 6)
    model, report = run_passes(build_unfused_block(weights, 2, normalize=True), dtype="int8")
    by_name = {p.name: p for p in report.passes}
    assert by_name["dtype"].fused == [] and by_name["quantize"].matched == 1
    assert report.ops_after.get("com.microsoft::QMoE") == 1
    assert "com.microsoft::MoE" not in report.ops_after
    assert not _nodes(model, "Cast") or all(
        n.attributes["to"].value == ir.DataType.FLOAT for n in _nodes(model, "Cast"))


def test_quantise_in_chunks_same_as_at_once(rng, monkeypatch):
    """Large expert weights are quantised a few experts at a time: same bytes."""
    w = rng.standard_normal((5, 48, 64)).astype(np.float32)
    whole = qmoe_quant.quantize(w, 4, 32, np.float16)
    monkeypatch.setattr(quantize, "CHUNK_ELEMENTS", 2 * 48 * 64)
    chunked = quantize._quantise_weight(w, 4, 32, np.float16)
    np.testing.assert_array_equal(chunked[0], whole[0])
    np.testing.assert_array_equal(chunked[1], whole[1])


@pytest.mark.parametrize("level", [None, 0, 4])
def test_accuracy_level_on_every_quantised_node(level, rng):
    """hina-export --accuracy-level: the attribute on every QMoE and
    MatMulNBits node (absent without it), and HinaMoE then runs the block
    with int8 tokens (accuracy_level 4) within int8 accuracy of float64."""
    hidden = 64
    weights = random_block_weights(rng, hidden, 32, 4, shared_inter=24)
    model, _ = run_passes(build_unfused_block(weights, 2, normalize=True), dtype="int4", block_size=32,
                          accuracy_level=level)
    nodes = _nodes(model, "QMoE") + _nodes(model, "MatMulNBits")
    assert {n.op_type for n in nodes} == {"QMoE", "MatMulNBits"}
    for n in nodes:
        attr = n.attributes.get("accuracy_level")
        assert (attr is None) if level is None else (attr.value == level), (n.name, attr)
    x = rng.standard_normal((1, 5, hidden)).astype(np.float32)
    data = as_bytes(model)
    want = cpu_session(data).run(None, {"hidden": x})[0]
    got = hina_session(data, no_fallback=False, cpu_fallback_provider=True).run(None, {"hidden": x})[0]
    check_close(got, want.astype(np.float64), "float32", "HinaMoE vs CPU EP", factor=2000.0 if level == 4 else 2.0)


def test_accuracy_level_out_of_range(rng):
    weights = random_block_weights(rng, 64, 32, 4)
    with pytest.raises(quantize.QuantizeError, match="accuracy_level"):
        run_passes(build_unfused_block(weights, 2, normalize=True), dtype="int4", block_size=32, accuracy_level=7)
