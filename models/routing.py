"""Router logits crafted for benchmarks and tests.

``com.microsoft::MoE`` takes raw router logits ``[T, E]``; the op applies a
softmax over all ``E`` and keeps the top ``k``. To measure a kernel at an exact
number of tokens per expert ``n`` we write logits whose ``k`` largest entries
per token fall on distinct *active* experts so that every active expert gets
exactly ``n`` tokens and every other expert gets none:

    T = n * E_active / k        (E_active * n must be a multiple of k)

Token ``t``'s ``j``-th choice is ``active[(t * k + j) % E_active]``; since
``k <= E_active`` the ``k`` choices of a token are distinct, and walking the
``n * E_active`` slots visits every active expert exactly ``n`` times.

The chosen experts get the logits ``4 + j/4`` (``j = 0..k-1``), the others
``0``: all exactly representable in float16 and bfloat16, and no ties among
the chosen ones. ``rotating_active_sets`` yields disjoint groups of active
experts so consecutive timed repetitions touch different weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CHOSEN_BASE = 4.0
CHOSEN_STEP = 0.25


def tokens_for(tokens_per_expert: int, active_experts: int, k: int) -> int:
    """Number of tokens T so that each of ``active_experts`` gets exactly
    ``tokens_per_expert`` tokens with ``k`` experts per token."""
    if k < 1 or active_experts < k:
        raise ValueError(f"need 1 <= k <= active experts (k={k}, active={active_experts})")
    slots = tokens_per_expert * active_experts
    if slots % k:
        raise ValueError(
            f"tokens_per_expert*active_experts = {slots} is not a multiple of k={k}")
    return slots // k


def assignment(tokens_per_expert: int, active: list[int] | np.ndarray, k: int) -> np.ndarray:
    """``[T, k]`` expert ids, row t = the k experts of token t (in rank order)."""
    active = np.asarray(active, dtype=np.int64)
    ea = len(active)
    if len(set(active.tolist())) != ea:
        raise ValueError("active experts must be distinct")
    t = tokens_for(tokens_per_expert, ea, k)
    slots = np.arange(t * k).reshape(t, k)
    return active[slots % ea]


def crafted_logits(
    num_experts: int,
    k: int,
    tokens_per_expert: int,
    active: list[int] | np.ndarray,
    dtype=np.float32,
) -> np.ndarray:
    """Router logits ``[T, E]`` giving each expert in ``active`` exactly
    ``tokens_per_expert`` tokens (and the other experts none)."""
    active = np.asarray(active, dtype=np.int64)
    if active.size and (active.min() < 0 or active.max() >= num_experts):
        raise ValueError(f"active expert ids must be in [0, {num_experts})")
    choice = assignment(tokens_per_expert, active, k)
    t = choice.shape[0]
    logits = np.zeros((t, num_experts), dtype=np.float32)
    rank_vals = CHOSEN_BASE + CHOSEN_STEP * np.arange(k, dtype=np.float32)
    rows = np.repeat(np.arange(t), k)
    logits[rows, choice.reshape(-1)] = np.tile(rank_vals, t)
    return logits.astype(dtype)


def rotating_active_sets(num_experts: int, active_experts: int, count: int) -> list[list[int]]:
    """``count`` groups of ``active_experts`` expert ids; group r starts at
    ``r * active_experts`` (mod E). Consecutive groups are disjoint when
    ``2 * active_experts <= E``; the cycle length is ``E / gcd(E, active)``."""
    if not 1 <= active_experts <= num_experts:
        raise ValueError(f"active experts {active_experts} not in [1, {num_experts}]")
    return [
        [(r * active_experts + i) % num_experts for i in range(active_experts)]
        for r in range(count)
    ]


def rotation_period(num_experts: int, active_experts: int) -> int:
    return num_experts // math.gcd(num_experts, active_experts)


@dataclass
class RoutingPlan:
    """Logits for ``tokens_per_expert`` with the active set rotating per step."""

    num_experts: int
    k: int
    tokens_per_expert: int
    active_experts: int
    dtype: object = np.float32

    def __post_init__(self) -> None:
        self.num_tokens = tokens_for(self.tokens_per_expert, self.active_experts, self.k)
        period = rotation_period(self.num_experts, self.active_experts)
        self._sets = rotating_active_sets(self.num_experts, self.active_experts, period)
        self._logits = [
            crafted_logits(self.num_experts, self.k, self.tokens_per_expert, s, self.dtype)
            for s in self._sets
        ]

    @property
    def period(self) -> int:
        return len(self._sets)

    def active_set(self, step: int) -> list[int]:
        return self._sets[step % len(self._sets)]

    def logits(self, step: int) -> np.ndarray:
        return self._logits[step % len(self._logits)]


def expert_token_counts(logits: np.ndarray, k: int) -> np.ndarray:
    """Tokens per expert that top-k (ties toward the higher index) selects."""
    lg = np.asarray(logits, dtype=np.float64)
    e = lg.shape[1]
    # stable argsort of (-logit, -index): higher logit first, then higher index
    order = np.lexsort((-np.arange(e)[None, :].repeat(lg.shape[0], 0), -lg), axis=1)
    top = order[:, :k]
    return np.bincount(top.reshape(-1), minlength=e)
