"""Real-shape few-layer checkpoints: configs carry the real dimensions; one
exports and matches PyTorch (slow)."""

from __future__ import annotations

import pytest

from hinamoe.models import get_shape
from hinamoe.models.hf_real_shape import REAL_MODELS, real_shape_config


@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_real_shape_config_dims(name):
    shape = get_shape(name)
    cfg = real_shape_config(name, layers=2)
    experts = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    inter = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    assert (cfg.hidden_size, inter, cfg.num_experts_per_tok) == (shape.hidden, shape.inter, shape.k)
    assert experts == shape.default_bench_experts and cfg.num_hidden_layers == 2
    assert cfg.num_attention_heads > cfg.num_key_value_heads


def test_real_shape_rejects_too_few_experts():
    with pytest.raises(ValueError, match="top-k 8 needs at least 8 experts"):
        real_shape_config("qwen3-30b-a3b", experts=4)


@pytest.mark.slow
def test_real_shape_exports_and_matches_pytorch(tmp_path, rng):
    from transformers import AutoModelForCausalLM

    from hinamoe.export import export_unfused
    from hinamoe.models.hf_real_shape import build_real_shape

    from support.export_reference import compare_steps, decode_tokens, left_padded_batch, ort_steps, torch_steps
    from support.sessions import cpu_session

    ckpt = build_real_shape("qwen3-30b-a3b", tmp_path / "hf", layers=1, experts=8, vocab=512)
    model = export_unfused(ckpt, tmp_path / "onnx")
    pt = AutoModelForCausalLM.from_pretrained(ckpt).eval()
    ids, mask = left_padded_batch(rng, 512, lengths=(5, 3), pad_id=pt.config.pad_token_id)
    got = ort_steps(cpu_session(str(model)), ids, mask, decode_steps=1)
    want = torch_steps(pt, ids, mask, decode_steps=1, tokens=decode_tokens(got))
    compare_steps(got, want, mask, 1e-3, 1e-4)
