"""GQA fusion pass (graph_passes/gqa_fusion.py) on real optimum exports of
tiny random MoE checkpoints: one GroupQueryAttention per layer, the fused
graph equal to the unfused one on ONNX Runtime's CPU EP for a left-padded
batch (prefill + decode steps, logits and every present KV position), the
same on a HinaMoE session, and patterns that only partly match left unfused
with a reason."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from hinamoe.graph_passes import gqa_fusion, run_passes

from support.sessions import cpu_session, hina_session

ARCHS = ["qwen3_moe", "mixtral", "qwen2_moe", "gpt_oss"]
DECODE_STEPS = 3
# fp32: the fused attention sums in another order than MatMul/Softmax/MatMul.
RTOL, ATOL = 2e-5, 2e-5


# ------------------------------------------------------------------ exports


@pytest.fixture
def unfused_path(tiny_export):
    """arch -> optimum's unfused export of the tiny checkpoint (conftest's
    session-wide tiny_export: each model is exported once per run)."""
    return lambda arch: tiny_export(arch).model


# Positions the RotaryEmbedding caches cover in these tests (prompts of up
# to 8 tokens and 3 decode steps; the exports' own max is far larger).
ROTARY_POSITIONS = 64
ROTARY = ["elementwise", "RotaryEmbedding"]


def _fused(path, rotary: str = "elementwise"):
    model = ir.load(str(path))
    model, report = run_passes(model, only=[gqa_fusion.NAME],
                               rotary_positions=ROTARY_POSITIONS if rotary == "RotaryEmbedding" else None)
    (gqa_report,) = report.passes
    return model, gqa_report


def _proto(model: ir.Model) -> onnx.ModelProto:
    return ir.serde.serialize_model(model)


def _num_layers(model: ir.Model) -> int:
    return sum(1 for v in model.graph.inputs if v.name.startswith("past_key_values.") and v.name.endswith(".key"))


# ------------------------------------------------------------------ running


def _left_padded(rng, vocab: int, lengths):
    S = max(lengths)
    ids = rng.integers(0, vocab, size=(len(lengths), S)).astype(np.int64)
    mask = np.zeros((len(lengths), S), np.int64)
    for b, n in enumerate(lengths):
        mask[b, S - n:] = 1
        ids[b, : S - n] = 0  # pad id
    return ids, mask


def _positions(mask: np.ndarray, new: int) -> np.ndarray:
    """transformers' generate: cumsum - 1, pad columns set to 1."""
    pos = np.cumsum(mask, 1) - 1
    return np.where(mask == 0, 1, pos)[:, -new:].astype(np.int64)


def _steps(sess, ids, mask, tokens):
    """Prefill, then one decode step per entry of `tokens` ([B, 1] each, the
    same for both graphs so their inputs never diverge). Returns a list of
    {output name: array} per step."""
    past = [i for i in sess.get_inputs() if i.name.startswith("past_key_values.")]
    B = ids.shape[0]
    feeds_past = {i.name: np.zeros((B, i.shape[1], 0, i.shape[3]), np.float32) for i in past}
    names = [o.name for o in sess.get_outputs()]
    results = []
    for tok in [None, *tokens]:
        if tok is not None:
            ids = tok
            mask = np.concatenate([mask, np.ones((B, 1), np.int64)], 1)
        feeds = {"input_ids": ids, "attention_mask": mask,
                 "position_ids": _positions(mask, ids.shape[1]), **feeds_past}
        outs = dict(zip(names, sess.run(None, feeds)))
        results.append(outs)
        feeds_past = {k.replace("present.", "past_key_values."): v for k, v in outs.items()
                      if k.startswith("present.")}
    return results


def _run_both(unfused_sess, fused_sess, rng, vocab: int):
    ids, mask = _left_padded(rng, vocab, lengths=(int(rng.integers(6, 9)), int(rng.integers(2, 5))))
    tokens = [rng.integers(1, vocab, size=(ids.shape[0], 1)).astype(np.int64) for _ in range(DECODE_STEPS)]
    return _steps(unfused_sess, ids, mask, tokens), _steps(fused_sess, ids, mask, tokens), mask


def _assert_steps_equal(got, want, mask, pad_positions_too: bool):
    """Every output of every step at the real (non-pad) positions, and with
    `pad_positions_too` at the padded ones as well: where the export masks
    with a boolean mask, the fused graph reproduces its zero rows for pad
    queries. (With an additive float mask the export lets pad queries attend
    to every key, later ones included, which a causal GQA does not; no real
    token reads those positions.)"""
    assert len(got) == len(want) == DECODE_STEPS + 1
    B = mask.shape[0]
    for step, (g, w) in enumerate(zip(got, want)):
        assert set(g) == set(w) and any(k.startswith("present.") for k in g)
        real_kv = np.concatenate([mask, np.ones((B, step), mask.dtype)], 1).astype(bool)
        for name in w:
            assert g[name].shape == w[name].shape, (step, name, g[name].shape, w[name].shape)
            assert np.isfinite(g[name]).all(), (step, name)
            if pad_positions_too:
                gs, ws = g[name], w[name]
            elif name == "logits":
                real = mask.astype(bool) if step == 0 else np.ones((B, 1), bool)
                gs, ws = g[name][real], w[name][real]
            else:  # [B, kv_heads, T, d] -> the real columns
                gs = np.transpose(g[name], (0, 2, 1, 3))[real_kv]
                ws = np.transpose(w[name], (0, 2, 1, 3))[real_kv]
            np.testing.assert_allclose(gs, ws, rtol=RTOL, atol=ATOL, err_msg=f"step {step} {name}")


def _pad_positions_too(report) -> bool:
    """Pad queries are zero rows in both graphs with a boolean mask, and with
    attention sinks (the sink takes all the weight when no key is visible)."""
    return all(site["mask"] == "bool" or site["sinks"] for site in report.fused)


def _vocab(model: ir.Model) -> int:
    return model.graph.outputs[0].shape[-1]


# ------------------------------------------------------------------ structure


@pytest.mark.parametrize("rotary", ROTARY)
@pytest.mark.parametrize("arch", ARCHS)
def test_one_gqa_node_per_layer(arch, rotary, unfused_path):
    unfused = ir.load(str(unfused_path(arch)))
    layers = _num_layers(unfused)
    model, report = _fused(unfused_path(arch), rotary)
    ops = [n.op_type for n in model.graph]
    assert layers >= 2
    assert ops.count("GroupQueryAttention") == layers
    assert report.matched == layers and report.skipped == [], report
    # None of the unfused attention remains: no NaN guard, no K^T, no repeat_kv.
    assert "IsNaN" not in ops
    assert not [n for n in model.graph if n.op_type == "Transpose"
                and list(n.attributes.get_ints("perm") or []) == [0, 1, 3, 2]]
    for site in report.fused:
        assert site["nodes_removed"] > site["nodes_added"] > 0
        assert site["rotary_op"] == rotary
    if rotary == "RotaryEmbedding":
        # One node per q and k per layer, read by the GQA node as they are.
        assert ops.count("RotaryEmbedding") == 2 * layers
        for node in model.graph:
            if node.op_type == "GroupQueryAttention":
                assert [node.inputs[i].producer().op_type for i in (0, 1)] == ["RotaryEmbedding"] * 2
    # Lengths and bias are built once per mask (gpt-oss: sliding and full),
    # not per layer.
    gqa_nodes = [n for n in model.graph if n.op_type == "GroupQueryAttention"]
    masks = {n.inputs[10] for n in gqa_nodes}
    if rotary == "RotaryEmbedding":
        # With the context length known, the exported masks are checked to
        # be attention_mask's padding & causal (& gpt-oss's window of 4 on
        # every other layer): one bias from attention_mask serves all layers,
        # the window goes to local_window_size, and no node reads the
        # past's length, so the caches may be shared buffers.
        assert len(masks) == 1
        assert all(site["lengths"] == "attention_mask" for site in report.fused)
        windows = [n.attributes.get_int("local_window_size", -1) for n in gqa_nodes]
        assert windows == ([4, -1] * layers)[:layers] if arch == "gpt_oss" else windows == [-1] * layers
        assert model.metadata_props.get(gqa_fusion.SHARE_BUFFER_KEY) == "1"
        for past in model.graph.inputs:
            if past.name.startswith("past_key_values."):
                assert {u.node.op_type for u in past.uses()} == {"GroupQueryAttention"}
    else:
        assert len(masks) == (2 if arch == "gpt_oss" else 1)
    assert len({n.inputs[5] for n in gqa_nodes}) == 1  # seqlens_k, shared by both masks
    gqa = [n for n in model.graph if n.op_type == "GroupQueryAttention"]
    for node in gqa:
        assert node.domain == "com.microsoft"
        assert node.attributes.get_int("num_heads") > node.attributes.get_int("kv_num_heads")
        assert node.attributes.get_int("do_rotary", 0) == 0  # see the module docstring
    # The cache keeps its names and BNSH layout: the GQA nodes produce the
    # present.* outputs that optimum's generate loop feeds back.
    outputs = {v.name: v for v in model.graph.outputs}
    for i in range(layers):
        for kind in ("key", "value"):
            v = outputs[f"present.{i}.{kind}"]
            assert v.producer() is not None and v.producer().op_type == "GroupQueryAttention"
    onnx.checker.check_model(_proto(model))


def test_rotary_caches_from_external_data(unfused_path, tmp_path):
    """Large exports keep their tensors (inv_freq included) in an external
    data file: the caches are still computed from them."""
    model = ir.load(str(unfused_path("qwen3_moe")))
    external = tmp_path / "model.onnx"
    ir.save(model, str(external), external_data="model.onnx_data", size_threshold_bytes=0)
    _, report = _fused(external, "RotaryEmbedding")
    assert report.matched >= 2
    assert all(site["rotary_op"] == "RotaryEmbedding" for site in report.fused)


# ------------------------------------------------------------------ numerics


@pytest.mark.parametrize("rotary", ROTARY)
@pytest.mark.parametrize("arch", ARCHS)
def test_fused_equals_unfused_left_padded(arch, rotary, unfused_path, rng):
    """Left-padded batch of 2 (different lengths): prefill + 3 decode steps,
    logits and present KV of the fused graph equal the unfused export's on
    the CPU EP."""
    path = unfused_path(arch)
    model, report = _fused(path, rotary)
    assert report.matched == _num_layers(model)
    want, got, mask = _run_both(cpu_session(str(path)), cpu_session(_proto(model)), rng, _vocab(model))
    assert (mask == 0).any(axis=1).tolist() == [False, True]  # row 1 really is left-padded
    _assert_steps_equal(got, want, mask, _pad_positions_too(report))


def _hinamoe_claims_gqa() -> bool:
    """Whether the HinaMoE EP claims a GroupQueryAttention node of the form
    the pass emits (attention_bias, no rotary): a one-node model must load
    with the CPU fallback disabled."""
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("q", f, [1, 1, 64]),
              helper.make_tensor_value_info("k", f, [1, 1, 32]),
              helper.make_tensor_value_info("v", f, [1, 1, 32]),
              helper.make_tensor_value_info("pk", f, [1, 2, 2, 16]),
              helper.make_tensor_value_info("pv", f, [1, 2, 2, 16]),
              helper.make_tensor_value_info("seqlens", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total", TensorProto.INT32, []),
              helper.make_tensor_value_info("bias", f, [1, 1, 1, 3])]
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens", "total",
                                                    "", "", "", "bias"],
                            ["out", "prk", "prv"], domain="com.microsoft", num_heads=4, kv_num_heads=2)
    outputs = [helper.make_tensor_value_info(n, f, None) for n in ("out", "prk", "prv")]
    model = helper.make_model(helper.make_graph([node], "probe", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    try:
        hina_session(model, no_fallback=True)
        return True
    except Exception:
        return False


@pytest.mark.parametrize("rotary", ROTARY)
@pytest.mark.parametrize("arch", ARCHS)
def test_fused_on_hinamoe_session(arch, rotary, unfused_path, rng, tmp_path):
    """The fused model on a HinaMoE session (CPU EP behind it for what the EP
    does not claim) equals the unfused export on the CPU EP. Where the EP
    claims GroupQueryAttention, the profile must show it ran there."""
    path = unfused_path(arch)
    model, report = _fused(path, rotary)
    sess = hina_session(_proto(model), no_fallback=False, cpu_fallback_provider=True,
                        profile_prefix=str(tmp_path / "hina"))
    want, got, mask = _run_both(cpu_session(str(path)), sess, rng, _vocab(model))
    _assert_steps_equal(got, want, mask, _pad_positions_too(report))
    profile = sess.end_profiling()
    try:
        with open(profile) as f:
            events = json.load(f)
    finally:
        for p in glob.glob(profile):
            os.remove(p)
    # Every GroupQueryAttention kernel run, not just the last one per op type.
    gqa_providers = {ev["args"]["provider"] for ev in events
                     if ev.get("cat") == "Node" and ev.get("args", {}).get("op_name") == "GroupQueryAttention"
                     and "provider" in ev["args"]}
    expected = "HinaMoE" if _hinamoe_claims_gqa() else "CPUExecutionProvider"
    assert gqa_providers == {expected}, gqa_providers


# ------------------------------------------------------------------ partial matches


def _layer0_attention(model: ir.Model) -> dict:
    """Handles on layer 0's exported attention, for the mutations below."""
    past_k = next(v for v in model.graph.inputs if v.name == "past_key_values.0.key")
    k_cat = next(u.node for u in past_k.uses() if u.node.op_type == "Concat")
    present_k = k_cat.outputs[0]
    unsq = next(u.node for u in present_k.uses() if u.node.op_type == "Unsqueeze")
    expand = next(iter(u.node for u in unsq.outputs[0].uses()))
    k_rep = next(iter(u.node for u in expand.outputs[0].uses())).outputs[0]
    kt = next(u.node for u in k_rep.uses() if u.node.op_type == "Transpose")
    qk = next(iter(u.node for u in kt.outputs[0].uses()))
    while qk.op_type != "MatMul":
        qk = next(iter(u.node for u in qk.outputs[0].uses()))
    add = next(iter(u.node for u in qk.outputs[0].uses()))
    fill = next(i for i in add.inputs if i is not qk.outputs[0]).producer()
    return {"k_cat": k_cat, "expand": expand, "mask_fill": fill}


def _mutate_drop_key_rotary(model: ir.Model) -> str:
    """The new keys enter the cache without rotary (a different model)."""
    k_cat = _layer0_attention(model)["k_cat"]
    add = k_cat.inputs[1].producer()
    x = next(i for i in add.inputs[0].producer().inputs if i.producer() and i.producer().op_type == "Transpose")
    k_cat.replace_input_with(1, x)
    return "rotary"


def _mutate_repeat_kv(model: ir.Model) -> str:
    """An Identity between repeat_kv's Expand and Reshape: same values, but
    not the chain the pass knows."""
    expand = _layer0_attention(model)["expand"]
    out = expand.outputs[0]
    ident = ir.node("Identity", [out])
    for use in list(out.uses()):
        if use.node is not ident:
            use.node.replace_input_with(use.idx, ident.outputs[0])
    model.graph.insert_after(expand, ident)
    return "repeat_kv"


def _mutate_mask_fill(model: ir.Model) -> str:
    """Masked scores filled with -1e4 instead of -inf: fully masked rows then
    average all keys, which the fused construction would not reproduce."""
    fill = _layer0_attention(model)["mask_fill"]
    value = ir.Value(name="mutated_fill", const_value=ir.tensor(np.array([-1e4], np.float32)))
    model.graph.register_initializer(value)
    fill.replace_input_with(2, value)
    return "mask"


def _mutate_chunk_rotary(model: ir.Model) -> str:
    """gpt-oss's chunked rotary with x2*cos where x2*sin belongs."""
    k_cat = _layer0_attention(model)["k_cat"]
    sub = k_cat.inputs[1].producer().inputs[0].producer()  # x1*cos - x2*sin
    x1_cos, x2_sin = (v.producer() for v in sub.inputs)
    cos_u = next(v for v in x1_cos.inputs if v.producer().op_type == "Unsqueeze")
    idx = next(i for i, v in enumerate(x2_sin.inputs) if v.producer().op_type == "Unsqueeze")
    x2_sin.replace_input_with(idx, cos_u)
    return "rotary"


@pytest.mark.parametrize("arch,mutate", [("qwen3_moe", _mutate_drop_key_rotary), ("qwen3_moe", _mutate_repeat_kv),
                                         ("qwen3_moe", _mutate_mask_fill), ("gpt_oss", _mutate_chunk_rotary)],
                         ids=["no_key_rotary", "repeat_kv", "mask_fill", "chunk_rotary"])
def test_partial_match_left_unfused(arch, mutate, unfused_path, rng, tmp_path):
    """Layer 0's attention mutated: the pass leaves it unfused and says why,
    fuses the other layers, and the result still equals the mutated unfused
    graph on the CPU EP (no half-rewritten layer)."""
    model = ir.load(str(unfused_path(arch)))
    keyword = mutate(model)
    mutated = tmp_path / "mutated.onnx"
    ir.save(model, str(mutated))
    layers = _num_layers(model)

    fused, report = _fused(mutated)
    assert report.matched == layers - 1
    assert len(report.skipped) == 1, report.skipped
    (skip,) = report.skipped
    assert skip["where"] == "model.layers.0.self_attn"
    assert keyword in skip["reason"], skip["reason"]
    assert [n.op_type for n in fused.graph].count("GroupQueryAttention") == layers - 1
    want, got, mask = _run_both(cpu_session(str(mutated)), cpu_session(_proto(fused)), rng, _vocab(fused))
    _assert_steps_equal(got, want, mask, _pad_positions_too(report))


def test_second_run_changes_nothing(unfused_path):
    """Running the pass on its own output finds nothing left to do."""
    model, _ = _fused(unfused_path("qwen3_moe"))
    before = [(n.op_type, n.name) for n in model.graph]
    report = gqa_fusion.apply(model)
    assert report.fused == [] and report.skipped == []
    assert [(n.op_type, n.name) for n in model.graph] == before


def test_graph_without_kv_cache_is_untouched(rng):
    """A model with no past_key_values inputs has nothing to fuse."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    proto = helper.make_model(helper.make_graph([helper.make_node("Softmax", ["x"], ["y"])], "g", [x], [y]))
    model, report = run_passes(proto, only=[gqa_fusion.NAME])
    assert report.passes[0].fused == [] and report.passes[0].skipped == []
    assert [n.op_type for n in model.graph] == ["Softmax"]


# ------------------------------------------------------------------ why rotary stays outside


def test_cpu_gqa_first_prompt_ignores_position_ids(rng):
    """Documents the ONNX Runtime behaviour the pass works around: with
    do_rotary=1 the CPU EP rotates a first prompt at positions 0..S-1 and
    ignores position_ids, so a left-padded row's cached keys would be rotated
    at the wrong positions. If this test starts failing, ORT honours
    position_ids there and rotary could move into the op."""
    B, S, N, NKV, D = 2, 5, 4, 2, 16
    inv = 1.0 / 10000 ** (np.arange(0, D, 2) / D)
    angles = np.arange(32)[:, None] * inv[None]
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info(n, f, None) for n in ("q", "k", "v", "pk", "pv")]
    inputs += [helper.make_tensor_value_info("seqlens", TensorProto.INT32, [B]),
               helper.make_tensor_value_info("total", TensorProto.INT32, []),
               helper.make_tensor_value_info("pos", TensorProto.INT64, [B, S])]
    node = helper.make_node("GroupQueryAttention",
                            ["q", "k", "v", "pk", "pv", "seqlens", "total", "cos", "sin", "pos"],
                            ["out", "prk", "prv"], domain="com.microsoft", num_heads=N, kv_num_heads=NKV,
                            do_rotary=1)
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info(n, f, None) for n in ("out", "prk", "prv")],
                              [onnx.numpy_helper.from_array(cos, "cos"), onnx.numpy_helper.from_array(sin, "sin")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("com.microsoft", 1)])
    mask = np.array([[1] * S, [0, 0] + [1] * (S - 2)])
    pos = _positions(mask, S)
    k = rng.standard_normal((B, S, NKV * D)).astype(np.float32)
    feeds = {"q": rng.standard_normal((B, S, N * D)).astype(np.float32), "k": k, "v": k,
             "pk": np.zeros((B, NKV, 0, D), np.float32), "pv": np.zeros((B, NKV, 0, D), np.float32),
             "seqlens": np.full(B, S - 1, np.int32), "total": np.array(S, np.int32), "pos": pos}
    present_k = cpu_session(model).run(["prk"], feeds)[0]

    def rotate(positions):
        x = k.reshape(B, S, NKV, D).transpose(0, 2, 1, 3).astype(np.float64)
        c = np.concatenate([cos[positions]] * 2, -1)[:, None]
        s = np.concatenate([sin[positions]] * 2, -1)[:, None]
        return x * c + np.concatenate([-x[..., D // 2:], x[..., : D // 2]], -1) * s

    np.testing.assert_allclose(present_k, rotate(np.tile(np.arange(S), (B, 1))), atol=1e-5)
    assert np.abs(present_k - rotate(pos)).max() > 0.1


# ------------------------------------------------------------------ the generate loop


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS)
def test_generate_with_fused_attention_matches_pytorch(arch, tiny_export, rng):
    """The full hina-export (GQA pass included), loaded as optimum's
    ORTModelForCausalLM: greedy generation of 8 tokens for a left-padded
    batch of 2 is the PyTorch checkpoint's, token for token."""
    import torch

    from hinamoe.export import load_causal_lm
    from hinamoe.models import hf_tiny

    fused = tiny_export.fused(arch)
    report = json.loads((fused.model.parent / "fusion_report.json").read_text())
    gqa = next(p for p in report["passes"] if p["name"] == gqa_fusion.NAME)
    assert gqa["matched"] == 2 and not gqa["skipped"], gqa
    ids, mask = _left_padded(rng, hf_tiny.BOS, lengths=(7, 3))
    ids[mask == 0] = hf_tiny.PAD
    ids, mask = torch.from_numpy(ids), torch.from_numpy(mask)
    want = fused.torch_model().generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    got = load_causal_lm(fused.model.parent, providers=["CPUExecutionProvider"]).generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=8, do_sample=False)
    assert torch.equal(got, want), (got, want)
