"""``hina-bench decode`` client: an onnxruntime-genai model folder (the genai
model builder's output) through genai's own generate loop."""

from __future__ import annotations

import gc
import glob
import json
import time
from pathlib import Path

import numpy as np

NAME = "genai"
NEEDS = "onnxruntime-genai (pip install onnxruntime-genai)"


class Client:
    def __init__(self, path: str | Path):
        self.path = str(path)
        cfg = json.loads((Path(path) / "genai_config.json").read_text())["model"]
        self.vocab_size = int(cfg["vocab_size"])
        # genai sizes a sliding layer's window buffer from max_length, and ORT
        # refuses one below the window: max_length is kept at least this.
        self.window = int(cfg.get("decoder", {}).get("sliding_window", {}).get("window_size", 0))

    def load(self, ep: str, threads: int, isa: str, profile_prefix: str | None = None):
        import onnxruntime_genai as og

        import hinamoe.genai

        session = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
        if profile_prefix is not None:
            session["enable_profiling"] = profile_prefix
        if ep == "HinaMoE":
            cfg = hinamoe.genai.config(self.path, isa=isa)  # strict: no MoE / GQA node left to the CPU EP
        else:
            cfg = og.Config(self.path)
            cfg.clear_providers()  # no provider appended: the CPU EP
        cfg.overlay(json.dumps({"model": {"decoder": {"session_options": session}}}))
        return {"model": og.Model(cfg), "profile_prefix": profile_prefix}

    def generate(self, handle, prompt: np.ndarray, new_tokens: int):
        """Greedy; (seconds of the prompt call and first token, [seconds of
        each later token], new tokens)."""
        import onnxruntime_genai as og

        model = handle["model"]
        params = og.GeneratorParams(model)
        total = prompt.size + new_tokens
        params.set_search_options(max_length=max(total, self.window), min_length=total, do_sample=False)
        gen = og.Generator(model, params)
        t0 = time.perf_counter()
        gen.append_tokens(prompt[None, :].astype(np.int32))
        gen.generate_next_token()  # the first new token comes from the prompt's logits
        t_prompt = time.perf_counter() - t0
        steps = []
        while len(steps) < new_tokens - 1 and not gen.is_done():
            t = time.perf_counter()
            gen.generate_next_token()
            steps.append(time.perf_counter() - t)
        tokens = [int(x) for x in gen.get_sequence(0)[prompt.size:total]]
        del gen
        return t_prompt, steps, tokens

    def release(self, handle) -> str | None:
        """Frees the model; the profile's path when profiling (genai writes it
        when the model goes)."""
        prefix = handle.pop("profile_prefix")
        handle.clear()
        gc.collect()
        if prefix is None:
            return None
        found = sorted(glob.glob(glob.escape(prefix) + "*.json"))
        return found[-1] if found else None
