"""Unfused exports (optimum + our configs/patchers) against PyTorch: logits and
present KV on a left-padded batch (prefill + 3 decode steps) on the CPU EP,
greedy generation through hinamoe.export.load_causal_lm on HinaMoE."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
import torch

from support.export_fixtures import ARCHS, PATCHED_ARCHS
from support.export_reference import compare_steps, decode_tokens, left_padded_batch, ort_steps, torch_steps
from support.sessions import cpu_session

# fp32 end to end; differences come from summation order only (~1e-6 seen).
RTOL = ATOL = 1e-4


@pytest.mark.parametrize("arch", ARCHS)
def test_unfused_export_matches_pytorch(arch, tiny_export, rng):
    exp = tiny_export(arch)
    pt = exp.torch_model()
    ids, mask = left_padded_batch(rng, pt.config.vocab_size, lengths=(7, 4),
                                  pad_id=pt.config.pad_token_id)
    got = ort_steps(cpu_session(str(exp.model)), ids, mask, decode_steps=3)
    # PyTorch decodes the tokens ORT chose, so both see the same inputs.
    want = torch_steps(pt, ids, mask, decode_steps=3, tokens=decode_tokens(got))
    compare_steps(got, want, mask, RTOL, ATOL)


@pytest.mark.parametrize("arch", PATCHED_ARCHS)
def test_every_expert_is_in_the_graph(arch, tiny_export):
    """The patcher unrolls the expert loop over all E experts: one NonZero
    (token selection) per expert per layer, one router TopK/OneHot per layer.
    A loop frozen by tracing would have only the experts the dummy input hit."""
    exp = tiny_export(arch)
    cfg = exp.torch_model().config
    experts = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    ops = collections.Counter(n.op_type for n in onnx.load(str(exp.model)).graph.node)
    layers = cfg.num_hidden_layers
    assert ops["NonZero"] == experts * layers, ops
    assert ops["TopK"] == layers and ops["OneHot"] == layers, ops


def test_routing_follows_the_input_not_the_trace(tiny_export, rng):
    """Tokens that route to different experts than any dummy export input did
    still match PyTorch: make one expert's router column dominate, so every
    token picks it (an expert the dummy input may never have hit)."""
    exp = tiny_export("qwen3_moe")
    pt = exp.torch_model()
    ids, mask = left_padded_batch(rng, pt.config.vocab_size, lengths=(5, 5),
                                  pad_id=pt.config.pad_token_id)
    got = ort_steps(cpu_session(str(exp.model)), ids, mask, decode_steps=0)
    want = torch_steps(pt, ids, mask, decode_steps=0)
    compare_steps(got, want, mask, RTOL, ATOL)
    # Now steer routing and check ORT follows (same ONNX file, router weight edited).
    model = onnx.load(str(exp.model))
    gate_names = {n.input[1] for n in model.graph.node if n.op_type == "MatMul"
                  and any("mlp/gate/" in o for o in n.output)}
    assert gate_names, "router MatMuls not found by name"
    favourite = int(rng.integers(pt.config.num_experts))
    for init in model.graph.initializer:
        if init.name in gate_names:
            w = onnx.numpy_helper.to_array(init).copy()  # [H, E] (transposed Linear)
            w[:, favourite] += 5.0 * np.sign(w[:, favourite] + 1e-3)
            init.CopyFrom(onnx.numpy_helper.from_array(w, init.name))
    with torch.no_grad():
        for layer in pt.model.layers:
            w = layer.mlp.gate.weight  # [E, H]
            w[favourite] += 5.0 * torch.sign(w[favourite] + 1e-3)
    got = ort_steps(cpu_session(model.SerializeToString()), ids, mask, decode_steps=0)
    want = torch_steps(pt, ids, mask, decode_steps=0)
    compare_steps(got, want, mask, RTOL, ATOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_on_hinamoe_matches_pytorch(arch, tiny_export, rng):
    from hinamoe.export import load_causal_lm

    exp = tiny_export(arch)
    pt = exp.torch_model()
    om = load_causal_lm(exp.model.parent, providers=["HinaMoE"])
    assert om.providers[0] == "HinaMoE"
    ids, mask = left_padded_batch(rng, pt.config.vocab_size, lengths=(6, 3),
                                  pad_id=pt.config.pad_token_id)
    kw = dict(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
              max_new_tokens=8, min_new_tokens=8, do_sample=False)
    want = pt.generate(**kw)
    got = om.generate(**kw)
    assert got.shape == want.shape == (2, ids.shape[1] + 8)
    assert torch.equal(got, want), f"ORT {got[:, -8:].tolist()} vs PyTorch {want[:, -8:].tolist()}"


def test_load_causal_lm_missing_folder(tmp_path):
    from hinamoe.export import load_causal_lm

    with pytest.raises(FileNotFoundError, match="model.onnx"):
        load_causal_lm(tmp_path / "nothing")


def test_load_causal_lm_refuses_silent_fallback(tiny_export):
    """A provider that does not take the session is an error, not the CPU EP."""
    from hinamoe.export import load_causal_lm

    with pytest.raises(RuntimeError, match="instead of 'NoSuchEP'"):
        load_causal_lm(tiny_export("mixtral").model.parent, providers=["NoSuchEP"])
