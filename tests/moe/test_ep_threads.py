"""Concurrent ``run`` calls on one session from several Python threads."""

from __future__ import annotations

import threading

import pytest

from hinamoe.models import MoEConfig, build_moe_model, random_input, random_logits, run_moe

from support.moe_reference import check_close, reference_for
from support.runtime import require_isa
from support.sessions import hina_session


@pytest.mark.parametrize("isa", ["ref", "avx2", "avx512"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_concurrent_runs_one_session(dtype, isa, rng, seed):
    require_isa(isa)
    cfg = MoEConfig(hidden=100, inter=72, experts=16, k=4, activation="swiglu",
                    swiglu_fusion=1, dtype=dtype, fc1_bias=True, fc2_bias=True)
    model, w = build_moe_model(cfg, rng=rng)
    sess = hina_session(model, isa=isa, threads=2)
    n_threads, iters = 4, 8
    # distinct inputs (and token counts) per thread, references computed up front
    cases = []
    for i in range(n_threads):
        t = [1, 7, 33, 64][i]
        x, lg = random_input(cfg, t, rng), random_logits(cfg, t, rng)
        cases.append((x, lg, reference_for(cfg, x, lg, w)))
    errors: list[str] = []
    barrier = threading.Barrier(n_threads)

    def worker(i: int) -> None:
        x, lg, ref = cases[i]
        try:
            barrier.wait()
            for it in range(iters):
                out = run_moe(sess, x, lg)
                check_close(out, ref, dtype, f"seed {seed} thread {i} iter {it}")
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    assert not errors, "\n".join(errors)
