"""onnxruntime-genai helpers shared by test_genai.py and test_export_genai.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def cpu_model(path: Path):
    """The folder's og.Model on the CPU EP (no provider appended)."""
    import onnxruntime_genai as og

    cfg = og.Config(str(path))
    cfg.clear_providers()
    return og.Model(cfg)


def greedy(model, prompt: np.ndarray, new_tokens: int):
    """Greedy tokens and the logits of every step (prompt step's last row first)."""
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    total = prompt.size + new_tokens
    params.set_search_options(max_length=total, min_length=total, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt[None, :].astype(np.int32))
    tokens, logits = [], []
    while not gen.is_done():
        gen.generate_next_token()
        logits.append(np.array(gen.get_output("logits"), dtype=np.float32)[0, -1].copy())
        tokens.append(int(gen.get_next_tokens()[0]))
    del gen
    return tokens, logits
