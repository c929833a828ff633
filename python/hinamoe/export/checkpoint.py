"""What hina-export accepts: a local HF checkpoint of a supported MoE
architecture. Anything else is a clear error naming what is supported."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# model_type -> (display name, where its OnnxConfig comes from, MoE layout)
SUPPORTED = {
    "mixtral": ("Mixtral", "hinamoe", "routed experts, top-k renormalised"),
    "qwen2_moe": ("Qwen2-MoE", "hinamoe",
                  "routed experts (not renormalised) + sigmoid-gated shared expert"),
    "qwen3_moe": ("Qwen3-MoE", "hinamoe (overrides optimum-onnx)", "routed experts, renormalised"),
    "gpt_oss": ("gpt-oss", "hinamoe (optimum-onnx patcher + position_ids)", "dense over all experts, clamped SwiGLU, biases"),
}


# model_type -> config keys of the routed experts' (hidden, intermediate) sizes:
# the K of QMoE's fc1 and fc2, which --dtype int4/int8 blocks must divide.
EXPERT_SIZE_KEYS = {
    "mixtral": ("hidden_size", "intermediate_size"),
    "qwen2_moe": ("hidden_size", "moe_intermediate_size"),
    "qwen3_moe": ("hidden_size", "moe_intermediate_size"),
    "gpt_oss": ("hidden_size", "intermediate_size"),
}

# What transformers' from_pretrained loads weights from.
WEIGHT_FILES = ("*.safetensors", "pytorch_model*.bin")


class ExportError(ValueError):
    """A checkpoint or option hina-export cannot handle; the message says why."""


def supported_list() -> str:
    return ", ".join(f"{name} ({mt})" for mt, (name, _, _) in SUPPORTED.items())


@dataclass
class Checkpoint:
    path: Path
    model_type: str
    config: dict

    @property
    def display_name(self) -> str:
        return SUPPORTED[self.model_type][0]

    @property
    def expert_sizes(self) -> tuple[int, int] | None:
        """(hidden, intermediate) of the routed experts, from config.json."""
        keys = EXPERT_SIZE_KEYS.get(self.model_type, ())
        sizes = [self.config.get(key) for key in keys]
        return tuple(sizes) if sizes and all(isinstance(v, int) for v in sizes) else None


def check_checkpoint(model_dir: str | Path) -> Checkpoint:
    """Reads `model_dir/config.json` and checks the architecture is one we export."""
    path = Path(model_dir)
    if not path.exists():
        raise ExportError(f"model directory {str(path)!r} does not exist")
    if not path.is_dir():
        raise ExportError(f"{str(path)!r} is not a directory (expected a HF checkpoint folder)")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ExportError(f"{str(path)!r} has no config.json: not a HuggingFace checkpoint folder")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise ExportError(f"{config_file} is not valid JSON: {e}") from None
    model_type = config.get("model_type")
    if model_type not in SUPPORTED:
        raise ExportError(
            f"unsupported architecture {model_type!r} in {config_file}"
            f" (architectures: {config.get('architectures')}); hina-export supports the MoE"
            f" architectures {supported_list()}")
    if not any(any(path.glob(pattern)) for pattern in WEIGHT_FILES):
        raise ExportError(f"{str(path)!r} has a config.json but no weights"
                          f" ({', '.join(WEIGHT_FILES)}): not a checkpoint folder")
    return Checkpoint(path, model_type, config)
