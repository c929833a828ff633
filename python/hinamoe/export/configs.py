"""OnnxConfigs for the MoE architectures hina-export supports, registered
with optimum's TasksManager.

optimum-onnx 0.1.0 has no config for Mixtral or Qwen2-MoE, and its
Qwen3-MoE patcher differs from ours; we register (overwriting) all three so
every MoE block goes through ``AllExpertsMoePatcher`` and exports to one
pattern. gpt-oss keeps optimum's own patcher (its experts already run densely
over all experts) but gets a position_ids input: optimum's config has none,
so a left-padded batch would get positions that ignore the padding.
``register()`` is idempotent.
"""

from __future__ import annotations

from optimum.exporters.onnx.model_configs import LlamaOnnxConfig
from optimum.exporters.tasks import TasksManager
from optimum.utils import NormalizedTextConfigWithGQA

from optimum.exporters.onnx.model_patcher import GptOssModelPatcher

from .patchers import AllExpertsMoePatcher

TASKS = ("feature-extraction", "feature-extraction-with-past", "text-generation",
         "text-generation-with-past")


class MoeDecoderOnnxConfig(LlamaOnnxConfig):
    """Decoder with position ids and a GQA KV cache ([B, kv_heads, S, head_dim],
    head_dim from the config when it has one), exported through our MoE patcher."""

    NORMALIZED_CONFIG_CLASS = NormalizedTextConfigWithGQA
    _MODEL_PATCHER = AllExpertsMoePatcher


class MixtralOnnxConfig(MoeDecoderOnnxConfig):
    pass


class Qwen2MoeOnnxConfig(MoeDecoderOnnxConfig):
    pass


class Qwen3MoeOnnxConfig(MoeDecoderOnnxConfig):
    pass


class GptOssOnnxConfig(LlamaOnnxConfig):
    """optimum-onnx's gpt-oss export plus position_ids (exact left padding)."""

    NORMALIZED_CONFIG_CLASS = NormalizedTextConfigWithGQA
    _MODEL_PATCHER = GptOssModelPatcher


# model_type -> the OnnxConfig we register for it.
OUR_CONFIGS = {
    "mixtral": MixtralOnnxConfig,
    "qwen2_moe": Qwen2MoeOnnxConfig,
    "qwen3_moe": Qwen3MoeOnnxConfig,
    "gpt_oss": GptOssOnnxConfig,
}

_registered = False


def register() -> None:
    """Registers our OnnxConfigs with optimum (once per process)."""
    global _registered
    if _registered:
        return
    register_onnx = TasksManager.create_register("onnx", overwrite_existing=True)
    for model_type, config_cls in OUR_CONFIGS.items():
        register_onnx(model_type, *TASKS)(config_cls)
    _registered = True
