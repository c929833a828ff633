"""``hina-bench decode`` client: a hina-export output folder (model.onnx +
config.json) through ``hinamoe.export.load_causal_lm`` and optimum's
``model.generate()``."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

NAME = "optimum"
NEEDS = "the export extra: torch, transformers, optimum-onnx (pip install \"hinamoe[export]\")"


class _Stamps:
    """A generate() streamer that only notes when each put() came: first the
    prompt (just before its forward), then every generated token."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


class Client:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.vocab_size = int(json.loads((self.path / "config.json").read_text())["vocab_size"])

    def load(self, ep: str, threads: int, isa: str, profile_prefix: str | None = None):
        import torch

        from hinamoe.export import load_causal_lm

        from .sessions import session_options

        torch.set_num_threads(threads)  # generate's own tensor work, beside the session's threads
        so = session_options(threads, profile_prefix)
        # strict: a MoE / GQA node HinaMoE would leave to the CPU EP fails the load.
        providers = [("HinaMoE", {"isa": isa, "strict": "1"})] if ep == "HinaMoE" else ["CPUExecutionProvider"]
        return {"model": load_causal_lm(self.path, providers=providers, session_options=so),
                "profiling": profile_prefix is not None}

    def generate(self, handle, prompt: np.ndarray, new_tokens: int):
        """Greedy, min_new_tokens = max_new_tokens (EOS never ends it early);
        (seconds of the prompt's forward and first token, [seconds of each
        later token], new tokens)."""
        import torch

        model = handle["model"]
        ids = torch.from_numpy(prompt[None, :].astype(np.int64))
        stamps = _Stamps()
        pad = model.generation_config.pad_token_id
        if pad is None:
            pad = model.config.eos_token_id
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, streamer=stamps,
                             pad_token_id=pad)
        t = stamps.times
        if len(t) != new_tokens + 1:
            raise RuntimeError(f"generate() streamed {len(t) - 1} tokens, expected {new_tokens}")
        return t[1] - t[0], [float(d) for d in np.diff(t[1:])], [int(x) for x in out[0, prompt.size:]]

    def release(self, handle) -> str | None:
        """Frees the model; the profile's path when profiling."""
        model = handle.pop("model")
        path = model.session.end_profiling() if handle.pop("profiling") else None
        del model
        return path or None
