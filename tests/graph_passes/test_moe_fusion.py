"""MoE fusion pass on hand-built unfused blocks (fast, no torch): the
Mixtral/Qwen pattern (experts unrolled) and the gpt-oss one (batched experts,
biases, clamped SwiGLU). The fused graph against a float64 reference and the
unfused graph on the CPU EP, the MoE node on HinaMoE (proved by the
profile), and partial matches that must be left unfused with the reason.
The same checks on real optimum exports of tiny Mixtral, Qwen2-MoE,
Qwen3-MoE and gpt-oss checkpoints are in test_moe_fusion_export.py."""

from __future__ import annotations

import numpy as np
import pytest

from hinamoe.graph_passes import PASSES, moe_fusion, run_passes

from support.dense_moe_graph import build_dense_block, random_dense_weights, reference_dense_block
from support.fusion_checks import UNFUSED_MOE_OPS, as_bytes, moe_node_names, node_providers, op_counts, run_pass
from support.sessions import cpu_session, hina_session
from support.unfused_moe_graph import build_unfused_block, random_block_weights, reference_block


def _random_block(rng, normalize, shared, mutate=None):
    hidden, inter = int(rng.choice([40, 72])), int(rng.choice([24, 40]))
    experts, k = int(rng.integers(4, 9)), int(rng.integers(2, 4))
    weights = random_block_weights(rng, hidden, inter, experts,
                                   shared_inter=int(rng.choice([16, 48])) if shared else 0)
    return weights, k, build_unfused_block(weights, k, normalize, mutate=mutate)


def _hidden(rng, weights, batch, seq):
    return rng.standard_normal((batch, seq, weights.router.shape[0])).astype(np.float32)


def _close(got, want, rel=2e-5):
    scale = np.abs(want).max() + 1e-6
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert err <= rel * scale, f"max error {err:.3g} > {rel * scale:.3g}"


@pytest.mark.parametrize("shared", [False, True], ids=["routed", "shared_expert"])
@pytest.mark.parametrize("normalize", [True, False], ids=["renorm", "no_renorm"])
def test_fused_block_matches_reference_and_unfused(normalize, shared, rng):
    weights, k, model = _random_block(rng, normalize, shared)
    fused, report = run_pass(moe_fusion.apply, model)
    assert report.skipped == []
    [site] = report.fused
    assert (site["k"], site["normalize_routing_weights"]) == (k, int(normalize))
    assert site["experts"] == weights.router.shape[1] and site["verified"]
    ops = op_counts(fused)
    assert ops["MoE"] == 1 and not any(ops[o] for o in UNFUSED_MOE_OPS), ops
    # The shared expert stays as MatMuls beside the router's MatMul.
    assert ops["MatMul"] == (5 if shared else 1), ops
    unfused_sess, fused_sess = cpu_session(as_bytes(model)), cpu_session(as_bytes(fused))
    for batch, seq in ((1, 1), (2, int(rng.integers(3, 9)))):
        x = _hidden(rng, weights, batch, seq)
        want = reference_block(x, weights, k, normalize)
        got_fused = fused_sess.run(None, {"hidden": x})[0]
        got_unfused = unfused_sess.run(None, {"hidden": x})[0]
        assert got_fused.shape == x.shape
        _close(got_unfused, want)
        _close(got_fused, want)
        _close(got_fused, got_unfused.astype(np.float64))


def test_fused_block_runs_on_hinamoe(tmp_path, rng):
    weights, k, model = _random_block(rng, normalize=True, shared=True)
    fused, _ = run_pass(moe_fusion.apply, model)
    [moe_name] = moe_node_names(fused)
    sess = hina_session(as_bytes(fused), no_fallback=False, cpu_fallback_provider=True,
                        profile_prefix=str(tmp_path / "hina"))
    x = _hidden(rng, weights, 2, 5)
    out = {}
    providers = node_providers(sess, lambda: out.setdefault("y", sess.run(None, {"hidden": x})[0]))
    assert providers.get(moe_name) == "HinaMoE", providers
    _close(out["y"], reference_block(x, weights, k, True))


# mutation -> what the report must say
PARTIAL_MATCHES = {
    "drop_expert": "no branch for expert(s)",
    "relu": "activation is not silu",
    "weight_input": "not a constant",
    "wrong_weight": "differs from the exported block",  # only the numeric check sees it
    "leak": "TopK indices",
}


@pytest.mark.parametrize("mutate", sorted(PARTIAL_MATCHES))
def test_partial_match_left_unfused(mutate, rng):
    weights, k, model = _random_block(rng, normalize=True, shared=False, mutate=mutate)
    fused, report = run_pass(moe_fusion.apply, model)
    assert report.fused == []
    [skip] = report.skipped
    assert skip["where"] == "/model/layers.0/mlp"
    assert PARTIAL_MATCHES[mutate] in skip["reason"], skip
    assert op_counts(fused) == op_counts(model)
    # Still the graph it was: same outputs as the untouched model.
    x = _hidden(rng, weights, 2, 4)
    feeds = {"hidden": x}
    if mutate == "weight_input":
        feeds["experts.1.up"] = weights.up[1]
    before = cpu_session(as_bytes(model)).run(None, feeds)[0]
    after = cpu_session(as_bytes(fused)).run(None, feeds)[0]
    np.testing.assert_array_equal(after, before)


def test_two_blocks_and_unknown_options(rng):
    """Each TopK is its own block; options of other passes are ignored."""
    weights, k, model = _random_block(rng, normalize=False, shared=False)
    fused, report = run_pass(moe_fusion.apply, model, dtype="bf16", moe_verify=False,
                             not_an_option=1)
    assert report.matched == 1 and not report.fused[0]["verified"]
    x = _hidden(rng, weights, 1, 3)
    _close(cpu_session(as_bytes(fused)).run(None, {"hidden": x})[0],
           reference_block(x, weights, k, False))


def test_pipeline_order_and_report(rng):
    names = [name for name, _ in PASSES]
    # fusions first, then the weight-storage passes (dtype, quantize)
    assert names[0] == "moe-fusion" and names[-2:] == ["dtype", "quantize"]
    _, _, model = _random_block(rng, normalize=True, shared=False)
    fused, report = run_passes(model)
    assert [p.name for p in report.passes] == names
    assert report.ops_after.get("com.microsoft::MoE") == 1
    assert report.nodes_after < report.nodes_before
    assert "/model/layers.0/mlp" in report.format_table()


# ------------------------------------------------------------ gpt-oss style block

def _random_dense_block(rng, mutate=None):
    weights = random_dense_weights(rng, int(rng.choice([40, 64])), int(rng.choice([24, 48])),
                                   int(rng.integers(4, 9)))
    k = int(rng.integers(2, 4))
    return weights, k, build_dense_block(weights, k, mutate=mutate)


def test_dense_block_fused_with_biases_and_limit(tmp_path, rng):
    weights, k, model = _random_dense_block(rng)
    fused, report = run_pass(moe_fusion.apply, model)
    [site] = report.fused
    assert site["biases"] and site["swiglu_limit"] == 7.0 and site["normalize_routing_weights"] == 1
    ops = op_counts(fused)
    assert ops["MoE"] == 1 and not any(ops[o] for o in ("ScatterElements", "TopK", "MatMul")), ops
    [moe] = [n for n in fused.graph if n.op_type == "MoE"]
    assert moe.attributes["activation_alpha"].value == pytest.approx(1.702)
    assert moe.attributes["activation_beta"].value == 1.0
    hidden = weights.router.shape[1]
    x = rng.standard_normal((2, int(rng.integers(3, 9)), hidden)).astype(np.float32)
    want = reference_dense_block(x, weights, k)
    unfused = cpu_session(as_bytes(model)).run(None, {"hidden": x})[0]
    _close(unfused, want)
    _close(cpu_session(as_bytes(fused)).run(None, {"hidden": x})[0], want)
    sess = hina_session(as_bytes(fused), no_fallback=False, cpu_fallback_provider=True,
                        profile_prefix=str(tmp_path / "dense"))
    out = {}
    providers = node_providers(sess, lambda: out.setdefault("y", sess.run(None, {"hidden": x})[0]))
    assert providers.get(moe.name) == "HinaMoE", providers
    _close(out["y"], want)


DENSE_PARTIAL_MATCHES = {
    "limit_mismatch": "not one swiglu_limit",
    "bias_input": "not a constant",
}


@pytest.mark.parametrize("mutate", sorted(DENSE_PARTIAL_MATCHES))
def test_dense_partial_match_left_unfused(mutate, rng):
    weights, k, model = _random_dense_block(rng, mutate=mutate)
    fused, report = run_pass(moe_fusion.apply, model)
    assert report.fused == []
    [skip] = report.skipped
    assert DENSE_PARTIAL_MATCHES[mutate] in skip["reason"], skip
    assert op_counts(fused) == op_counts(model)


def test_check_reads_weights_from_external_data(tmp_path, rng, monkeypatch):
    """A model saved with its weights in an external data file (every export
    above 2 GB): the fusion check cuts the block out with the weights read
    in, so ORT runs it from bytes wherever the process runs (it once looked
    for model.onnx_data in the working directory, failed, and left every
    layer unfused)."""
    import onnx
    import onnx_ir as ir
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from hinamoe.graph_passes import moe_verify

    w = rng.standard_normal((8, 5)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
                              initializer=[numpy_helper.from_array(w, "w")])
    path = tmp_path / "m" / "model.onnx"
    path.parent.mkdir()
    onnx.save(helper.make_model(graph), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx_data", size_threshold=0)
    model = ir.load(str(path))
    assert isinstance(model.graph.initializers["w"].const_value, ir.ExternalTensor)
    monkeypatch.chdir(tmp_path)  # not the model's folder
    data = moe_verify._block_model(model.graph, [model.graph.inputs[0]], model.graph.outputs[0], 18, 10)
    assert not any(t.data_location == TensorProto.EXTERNAL for t in onnx.load_from_string(data).graph.initializer)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    got = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x @ w, rtol=1e-5, atol=1e-5)
