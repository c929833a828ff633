"""genai_config.json for a hina-export folder, so onnxruntime-genai's C++
generate loop runs it (``hinamoe.genai.model(folder)``).

The folder's graph already has genai's inputs and outputs (``input_ids``,
``attention_mask``, ``position_ids``, ``past_key_values.N.key`` ->
``present.N.key``); what genai needs besides is the model's shape and token
ids from the checkpoint's config.json / generation_config.json, and whether
past and present may share one buffer (the graph's
``hinamoe.past_present_share_buffer`` metadata, set when every layer's
attention is a GroupQueryAttention node).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from .checkpoint import ExportError

FILE = "genai_config.json"
# genai picks its model class by type; these MoE architectures are plain
# decoders to it, named by the dense family genai knows.
GENAI_TYPES = {"qwen3_moe": "qwen3", "qwen2_moe": "qwen2", "mixtral": "mistral"}
DEFAULT_TYPE = "llama"
_PAST_KEY = re.compile(r"past_key_values\.(\d+)\.key$")


def _graph_facts(model_path: Path) -> tuple[int, bool, bool]:
    """(layers with a KV cache, position_ids is an input, share-buffer metadata)."""
    import onnx

    from hinamoe.graph_passes.gqa_fusion import SHARE_BUFFER_KEY

    model = onnx.load(str(model_path), load_external_data=False)
    names = [i.name for i in model.graph.input]
    layers = sum(1 for n in names if _PAST_KEY.match(n))
    share = any(p.key == SHARE_BUFFER_KEY and p.value == "1" for p in model.metadata_props)
    return layers, "position_ids" in names, share


def _first(*values):
    return next((v for v in values if v is not None), None)


def genai_config(config: dict, generation: dict, *, layers: int, position_ids: bool, share: bool,
                 model_file: str = "model.onnx") -> dict:
    """The genai_config.json contents for a model of HF ``config`` (its
    generation_config as ``generation``) whose graph has ``layers`` KV caches."""
    heads = config.get("num_attention_heads")
    hidden = config.get("hidden_size")
    if not heads or not hidden:
        raise ExportError("config.json names no num_attention_heads / hidden_size")
    head_size = config.get("head_dim") or hidden // heads
    context = config.get("max_position_embeddings")
    if not isinstance(context, int) or context <= 0:
        raise ExportError("config.json names no max_position_embeddings (genai's context_length)")
    eos = _first(generation.get("eos_token_id"), config.get("eos_token_id"))
    if eos is None:
        raise ExportError("neither config.json nor generation_config.json names an eos_token_id")
    first_eos = eos[0] if isinstance(eos, list) else eos
    inputs = {"input_ids": "input_ids", "attention_mask": "attention_mask",
              "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"}
    if position_ids:
        inputs["position_ids"] = "position_ids"
    model = {
        "type": GENAI_TYPES.get(config.get("model_type", ""), DEFAULT_TYPE),
        "bos_token_id": _first(generation.get("bos_token_id"), config.get("bos_token_id"), first_eos),
        "eos_token_id": eos,
        "pad_token_id": _first(generation.get("pad_token_id"), config.get("pad_token_id"), first_eos),
        "vocab_size": config["vocab_size"],
        "context_length": context,
        "decoder": {
            "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
            "filename": model_file,
            "head_size": head_size,
            "hidden_size": hidden,
            "num_attention_heads": heads,
            "num_key_value_heads": config.get("num_key_value_heads", heads),
            "num_hidden_layers": layers,
            "inputs": inputs,
            "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                        "present_value_names": "present.%d.value"},
        },
    }
    search = {
        "do_sample": bool(generation.get("do_sample", False)),
        "max_length": context,
        "min_length": 0,
        "num_beams": 1,
        "num_return_sequences": 1,
        "past_present_share_buffer": share,
        "repetition_penalty": float(generation.get("repetition_penalty", 1.0)),
        "temperature": float(generation.get("temperature", 1.0)),
        "top_k": int(generation.get("top_k", 50)),
        "top_p": float(generation.get("top_p", 1.0)),
    }
    return {"model": model, "search": search}


def write_genai_config(out_dir: str | Path, model_file: str = "model.onnx") -> Path:
    """Writes out_dir/genai_config.json from the folder's config.json,
    generation_config.json (if any) and graph; returns its path."""
    out = Path(out_dir)
    config = json.loads((out / "config.json").read_text())
    gen_path = out / "generation_config.json"
    generation = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
    layers, position_ids, share = _graph_facts(out / model_file)
    if layers == 0:
        raise ExportError(f"{out / model_file} has no past_key_values.N.key inputs")
    body = genai_config(config, generation, layers=layers, position_ids=position_ids, share=share,
                        model_file=model_file)
    path = out / FILE
    path.write_text(json.dumps(body, indent=4) + "\n")
    return path
