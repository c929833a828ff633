"""``hina-bench decode`` client: any folder hina-serve reads (hina-export,
tiny_lm, genai folders with plain KV caches) through ``hinamoe.serve``'s
runner, the loop hina-serve decodes with: one ONNX Runtime call per token
and numpy argmax, no Python framework around it."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

NAME = "serve"
NEEDS = "nothing beyond hinamoe"


class Client:
    def __init__(self, path: str | Path):
        from hinamoe.serve import read_model_folder

        self.path = Path(path)
        self.folder = read_model_folder(self.path)
        self.vocab_size = self.folder.vocab

    def load(self, ep: str, threads: int, isa: str, profile_prefix: str | None = None):
        import onnxruntime as ort

        import hinamoe
        from hinamoe.serve import Runner

        from .sessions import session_options

        so = session_options(threads, profile_prefix)
        if ep == "HinaMoE":
            hinamoe.register()
            providers = [("HinaMoE", {"isa": isa, "strict": "1"}), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        sess = ort.InferenceSession(str(self.folder.model_file), so, providers=providers)
        runner = Runner(sess, self.folder.layout, self.folder.kv_shape, self.folder.rings,
                        share_buffer=self.folder.share_buffer)
        return {"runner": runner, "profiling": profile_prefix is not None}

    def generate(self, handle, prompt: np.ndarray, new_tokens: int):
        """Greedy (the end token does not stop it): (seconds of the prompt's
        forward and first token, [seconds of each later token], new tokens)."""
        runner = handle["runner"]
        t0 = time.perf_counter()
        logits, caches = runner.prefill(prompt.astype(np.int64), runner.empty_caches(), 0)
        tokens = [int(np.argmax(logits))]
        t1 = time.perf_counter()
        batch = runner.new_batch()
        batch.add(caches, prompt.size)
        steps = []
        for _ in range(new_tokens - 1):
            t = time.perf_counter()
            step = runner.decode(batch, np.array(tokens[-1:], np.int64))
            tokens.append(int(np.argmax(step[0])))
            steps.append(time.perf_counter() - t)
        return t1 - t0, steps, tokens

    def release(self, handle) -> str | None:
        runner = handle.pop("runner")
        path = runner.sess.end_profiling() if handle.pop("profiling") else None
        del runner
        return path or None
