"""Concurrent session.run on one HinaMoE GroupQueryAttention session from
several Python threads, each with its own shared KV cache: every result
matches the reference (kernels keep no per-call state in the kernel object)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hinamoe.models import GQAConfig, build_gqa_model

from support.gqa_cases import run_sequence
from support.runtime import require_isa
from support.sessions import hina_session


@pytest.mark.parametrize("isa", ["ref", "avx2"])
def test_concurrent_runs_one_session(isa, rng, seed):
    require_isa(isa)
    cfg = GQAConfig(num_heads=16, kv_num_heads=4, head_dim=64, do_rotary=True, attention_bias=True)
    sess = hina_session(build_gqa_model(cfg), isa=isa, threads=2)
    n_threads = 4
    seeds = rng.integers(0, 2 ** 32, size=n_threads)
    errors: list = []

    def worker(i: int) -> None:
        try:
            r = np.random.default_rng(int(seeds[i]))
            lens = [int(x) for x in r.integers(1, 40, size=2)]
            run_sequence(sess, cfg, r, lens, decode_steps=4, capacity=max(lens) + 6,
                         what=f"thread {i} seed {seed}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append((i, exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
