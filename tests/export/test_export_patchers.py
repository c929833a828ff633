"""The tiny checkpoints' shapes, and the all-experts MoE forward: same
function as transformers' own forward, patched only while exporting."""

from __future__ import annotations

import pytest
import torch

from hinamoe.models import hf_tiny

from support.export_fixtures import ARCHS, PATCHED_ARCHS


def _moe_blocks(model):
    import importlib

    from hinamoe.export.patchers import SPARSE_MOE_BLOCKS

    classes = tuple(getattr(importlib.import_module(m), c) for m, c in SPARSE_MOE_BLOCKS.values())
    return [m for m in model.modules() if isinstance(m, classes)]


@pytest.mark.parametrize("arch", ARCHS)
def test_tiny_config_shapes(arch):
    cfg = hf_tiny.RECIPES[arch]()
    experts = getattr(cfg, "num_local_experts", None) or cfg.num_experts
    assert experts >= 4 and cfg.num_experts_per_tok >= 2
    assert cfg.num_attention_heads > cfg.num_key_value_heads > 0
    assert cfg.num_hidden_layers >= 2
    expert_inter = getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size
    assert expert_inter & (expert_inter - 1) != 0, "expert size should not be a power of two"
    if arch == "qwen2_moe":
        assert cfg.norm_topk_prob is False and cfg.shared_expert_intermediate_size > 0
    if arch == "qwen3_moe":
        assert cfg.norm_topk_prob is True


def test_tiny_checkpoint_is_deterministic(tmp_path, seed):
    from safetensors.torch import load_file

    a = load_file(hf_tiny.build("mixtral", tmp_path / "a", seed=seed) / "model.safetensors")
    b = load_file(hf_tiny.build("mixtral", tmp_path / "b", seed=seed) / "model.safetensors")
    c = load_file(hf_tiny.build("mixtral", tmp_path / "c", seed=seed + 1) / "model.safetensors")
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("arch", PATCHED_ARCHS)
def test_all_experts_forward_equals_transformers(arch, seed):
    from transformers import AutoModelForCausalLM

    from hinamoe.export.patchers import sparse_moe_forward_all_experts

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_tiny.RECIPES[arch]()).eval()
    blocks = _moe_blocks(model)
    assert len(blocks) == model.config.num_hidden_layers
    for block in blocks:
        x = torch.randn(2, 5, model.config.hidden_size)
        with torch.no_grad():
            want_h, want_logits = type(block).forward(block, x)
            got_h, got_logits = sparse_moe_forward_all_experts(block, x)
        torch.testing.assert_close(got_logits, want_logits, rtol=0, atol=0)
        torch.testing.assert_close(got_h, want_h, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("arch", PATCHED_ARCHS)
def test_patcher_swaps_forward_only_while_exporting(arch):
    from transformers import AutoModelForCausalLM

    from hinamoe.export.configs import OUR_CONFIGS
    from hinamoe.export.patchers import sparse_moe_forward_all_experts

    model = AutoModelForCausalLM.from_config(hf_tiny.RECIPES[arch]()).eval()
    cls = type(_moe_blocks(model)[0])
    original = cls.forward
    onnx_config = OUR_CONFIGS[arch](model.config, task="text-generation-with-past")
    with onnx_config.patch_model_for_export(model):
        assert cls.forward is sparse_moe_forward_all_experts
    assert cls.forward is original


def test_configs_registered_with_optimum():
    from optimum.exporters.tasks import TasksManager

    from hinamoe.export.configs import OUR_CONFIGS, register

    register()
    for model_type, config_cls in OUR_CONFIGS.items():
        ctor = TasksManager.get_exporter_config_constructor(
            "onnx", model_type=model_type, task="text-generation-with-past",
            library_name="transformers")
        assert ctor.func is config_cls, (model_type, ctor)
