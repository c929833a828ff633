"""Load a hina-export output as optimum's ORTModelForCausalLM on a session we
build ourselves, so ``model.generate(...)`` runs on HinaMoE.

optimum would build the session itself, but it rejects provider names it does
not know (HinaMoE) and, for model types missing from its tables (Mixtral,
Qwen2-MoE), sizes the empty first-step KV cache with num_attention_heads
instead of num_key_value_heads (and hidden/heads instead of head_dim for
Qwen3-MoE). We pass our session in and take the cache shape from the graph.
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort

import hinamoe

MODEL_FILE = "model.onnx"


def make_session(model_path: str | Path, providers=("HinaMoE",),
                 session_options=None) -> ort.InferenceSession:
    """InferenceSession on `providers` (names or (name, options) pairs); fails,
    instead of silently running on the CPU EP alone, when the first provider
    did not take the session. Nodes HinaMoE does not claim run on the CPU EP."""
    hinamoe.register()
    so = session_options or ort.SessionOptions()
    providers = list(providers)
    sess = ort.InferenceSession(str(model_path), so, providers=providers)
    want = providers[0] if isinstance(providers[0], str) else providers[0][0]
    if sess.get_providers()[0] != want:
        raise RuntimeError(f"session runs on {sess.get_providers()} instead of {want!r}")
    return sess


def load_causal_lm(path: str | Path, providers=("HinaMoE",), session_options=None,
                   use_io_binding: bool = False):
    """`optimum.onnxruntime.ORTModelForCausalLM` for the exported folder `path`
    (model.onnx + config.json [+ generation_config.json]) on `providers`."""
    path = Path(path)
    model_file = path if path.suffix == ".onnx" else path / MODEL_FILE
    folder = model_file.parent
    if not model_file.is_file():
        raise FileNotFoundError(f"{model_file} not found (expected a hina-export output folder)")
    from optimum.onnxruntime import ORTModelForCausalLM
    from transformers import AutoConfig, GenerationConfig

    sess = make_session(model_file, providers, session_options)
    config = AutoConfig.from_pretrained(folder)
    try:
        generation_config = GenerationConfig.from_pretrained(folder)
    except OSError:
        generation_config = GenerationConfig.from_model_config(config)
    model = ORTModelForCausalLM(config=config, session=sess, use_io_binding=use_io_binding,
                                generation_config=generation_config)
    # The empty cache of the first step: [batch, kv_heads, 0, head_dim] as the graph declares.
    past = next((i for i in sess.get_inputs() if i.name.startswith("past_key_values.")), None)
    if past is not None and isinstance(past.shape[1], int) and isinstance(past.shape[3], int):
        model.num_key_value_heads = past.shape[1]
        model.embed_size_per_head = past.shape[3]
    return model
