"""hina-serve test support: a tiny random MoE language model folder with a
tokenizer, and servers started as a user starts them (a subprocess of the
CLI on a loopback port). Test modules import the fixtures they use."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from support.seeds import seed_for

MODEL_NAME = "tiny"


@dataclass
class TinyModel:
    folder: Path
    cfg: object
    model: object           # onnx ModelProto
    tokenizer: object

    def generator(self, ep: str = "HinaMoE", capacity: int = 512):
        """The library's greedy loop (tiny_lm.Generator) on a fresh session."""
        from hinamoe.models.tiny_lm import Generator, make_session

        return Generator(make_session(self.model, ep, threads=2), self.cfg, capacity=capacity)

    def greedy(self, prompt_ids, new_tokens: int, ep: str = "HinaMoE"):
        """``(tokens, margins)`` of the library's greedy generation."""
        res = self.generator(ep).generate(np.asarray(prompt_ids, np.int64), new_tokens)
        return [int(t) for t in res.tokens[0]], res.margins[0]


def printable_head(cfg, weights):
    """LM head columns of bytes outside printable ASCII set to 0 (end token
    kept): a greedy token is then almost surely printable, so decoded text
    compares exactly."""
    from hinamoe.models.hf_tiny import EOS

    keep = np.zeros(cfg.vocab, bool)
    keep[0x20:0x7F] = True
    keep[EOS] = True
    weights["lm_head"][:, ~keep] = 0.0
    return weights


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> TinyModel:
    from transformers import AutoTokenizer

    from hinamoe.models.tiny_lm import TinyLMConfig, build_tiny_lm, random_tiny_lm_weights, save_tiny_lm, save_tokenizer

    cfg = TinyLMConfig(layers=2, hidden=128, heads=4, kv_heads=2, experts=8, k=2, inter=128, vocab=320,
                       max_length=512)
    rng = np.random.default_rng(seed_for("serve/tiny_model"))
    weights = printable_head(cfg, random_tiny_lm_weights(cfg, rng))
    model, _ = build_tiny_lm(cfg, weights)
    folder = tmp_path_factory.mktemp("serve") / MODEL_NAME
    save_tiny_lm(folder, cfg, model)
    save_tokenizer(folder, cfg)
    return TinyModel(folder, cfg, model, AutoTokenizer.from_pretrained(str(folder)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, folder: Path, *args: str, log: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "hinamoe.serve.cli", str(folder), "--port", str(self.port),
               "--threads", "2", "--log-level", "warning", *args]
        self._out = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=os.environ.copy())
        self._wait_ready()

    def _wait_ready(self, timeout: float = 90.0) -> None:
        import httpx

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hina-serve exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"hina-serve did not come up in {timeout} s:\n{self.log.read_text()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def metric(self, name: str) -> float:
        import httpx

        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._out.close()


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    """hina-serve on the tiny model: 4 slots, strict HinaMoE placement."""
    s = Server(tiny_model.folder, "--parallel", "4", log=tmp_path_factory.mktemp("log") / "server.log")
    yield s
    s.stop()
