"""Next-token choice from a row of logits: greedy at temperature 0,
otherwise temperature, top-k and top-p (nucleus) sampling, each request with
its own random generator (seeded when the request names a seed)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                 # 0: all tokens
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        # The API layer names the field; these guard direct library use.
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens {self.max_tokens} must be >= 1")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature {self.temperature} must be in [0, 2]")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p {self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k {self.top_k} must be >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """The next token of one sequence from its ``logits [V]``."""
    if params.greedy:
        return int(np.argmax(logits))
    x = logits.astype(np.float64) / params.temperature
    if 0 < params.top_k < x.size:
        kth = np.partition(x, -params.top_k)[-params.top_k]
        x = np.where(x >= kth, x, -np.inf)
    p = np.exp(x - x.max())
    p /= p.sum()
    if params.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        keep = order[: int(np.searchsorted(cum, params.top_p)) + 1]  # the fewest tokens reaching top_p
        q = np.zeros_like(p)
        q[keep] = p[keep]
        p = q / q.sum()
    return int(rng.choice(p.size, p=p))
