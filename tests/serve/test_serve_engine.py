"""The batching engine in process: sequences that join and leave a running
batch (chunked prefill, ragged lengths, more requests than slots) generate
what each would alone with the library's greedy loop, on HinaMoE and on the
CPU EP, for both KV layouts (a genai-form graph and a hina-export folder)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("transformers")

from hinamoe.serve import Engine, Runner, SamplingParams, make_session, read_model_folder

from support.serve_support import tiny_model  # noqa: F401  (fixture)


def greedy_params(n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def run_all(engine: Engine, prompts, new_tokens: int, stagger=None):
    """Submits every prompt (the i-th after ``stagger[i]`` decode steps of
    the batch) and collects each one's tokens and finish reason."""
    out = [None] * len(prompts)
    done = threading.Event()
    left = [len(prompts)]
    lock = threading.Lock()

    def sink_for(i):
        toks = []

        def sink(ev):
            if ev.token is not None:
                toks.append(ev.token)
            if ev.finish_reason is not None:
                out[i] = (toks, ev.finish_reason)
                with lock:
                    left[0] -= 1
                    if not left[0]:
                        done.set()
        return sink

    for i, p in enumerate(prompts):
        if stagger is not None:
            while engine.metrics.decode_steps < stagger[i]:
                threading.Event().wait(0.001)
        engine.submit(list(p), greedy_params(new_tokens), sink_for(i))
    assert done.wait(120), "the engine did not finish every request"
    return out


def agree(got, want, margins, eps=1e-3):
    """Tokens equal up to the first near-tie of the reference (a batched
    call may round differently from a single one by ~1e-6)."""
    n = len(want)
    for j, m in enumerate(margins):
        if m < eps:
            n = j + 1
            break
    return got[:n] == want[:n]


@pytest.mark.parametrize("ep", ["HinaMoE", "cpu"])
def test_batched_greedy_matches_each_alone(tiny_model, rng, ep):  # noqa: F811
    tm = tiny_model
    prompts = [rng.integers(0, 256, int(n)) for n in rng.integers(3, 40, 6)]
    new = 12
    sess = make_session(tm.folder / "model.onnx", ep, 2, {"strict": "1"} if ep == "HinaMoE" else None)
    engine = Engine(Runner(sess, "front"), tm.tokenizer, context_length=512, parallel=3, max_queue=8,
                    prefill_chunk=7)
    try:
        got = run_all(engine, prompts, new, stagger=[0, 0, 2, 3, 5, 9])
    finally:
        engine.stop()
    assert engine.metrics.max_batch_size > 1
    for p, (toks, reason) in zip(prompts, got):
        want, margins = tm.greedy(p, new, "CPU" if ep == "cpu" else "HinaMoE")
        assert reason == "length" and len(toks) == new
        assert agree(toks, want, margins), (toks, want)


def test_seeded_sampling_is_reproducible_in_a_batch(tiny_model, rng):  # noqa: F811
    tm = tiny_model
    sess = make_session(tm.folder / "model.onnx", "HinaMoE", 2, {"strict": "1"})
    engine = Engine(Runner(sess, "front"), tm.tokenizer, context_length=512, parallel=4)
    seed = int(rng.integers(1 << 30))
    params = SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=seed, ignore_eos=True)
    prompt = list(rng.integers(0, 256, 9))
    try:
        alone = [ev.token for ev in engine.stream(prompt, params) if ev.token is not None]
        # the same request beside three others gives the same tokens
        streams = [engine.stream(list(rng.integers(0, 256, 5)), greedy_params(10)) for _ in range(3)]
        first = [next(s) for s in streams]
        batched = [ev.token for ev in engine.stream(prompt, params) if ev.token is not None]
        for s in streams:
            s.close()
    finally:
        engine.stop()
    assert all(ev.token is not None for ev in first)
    assert batched == alone


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
def test_export_folder_matches_optimum_generate(tiny_export, rng, arch):
    """A hina-export folder (the "back" layout: concatenated KV, rotary from
    position_ids; gpt-oss with its sliding-window layers and sinks) served
    in a batch gives optimum's greedy generate() tokens on the same session
    type."""
    import torch

    from hinamoe.export import load_causal_lm
    from hinamoe.serve import ServeOptions, load_engine

    exp = tiny_export.fused(arch)
    folder = read_model_folder(exp.model.parent)
    assert folder.kind == "export" and folder.layout == "back"
    engine, tok, _ = load_engine(exp.model.parent, ServeOptions(threads=2, parallel=3, prefill_chunk=5))
    assert engine.runner.spare > 0  # hina-export's graph reads lengths from attention_mask: shared caches
    vocab = engine.runner.vocab
    prompts = [rng.integers(3, vocab, int(n)) for n in (4, 11, 7, 16)]  # longer than gpt-oss's window
    new = 8
    try:
        got = run_all(engine, prompts, new, stagger=[0, 1, 1, 3])
    finally:
        engine.stop()
    lm = load_causal_lm(exp.model.parent)
    for p, (toks, reason) in zip(prompts, got):
        ids = torch.tensor(np.asarray(p)[None, :])
        # no min_new_tokens: its processor would forbid the end token the engine (ignore_eos) may pick
        out = lm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)
        want = [int(t) for t in out[0, len(p):]]
        assert reason == "length" and len(toks) == new
        assert toks[:len(want)] == want, (toks, want)   # optimum stops at the end token


def test_a_failing_request_ends_with_an_error_and_the_others_go_on(tiny_model, rng):  # noqa: F811
    """A request whose prefill fails, and one that fails while joining the
    batch after its first token, each end with an error event (never a
    client left waiting); the requests beside them finish normally."""
    tm = tiny_model
    sess = make_session(tm.folder / "model.onnx", "HinaMoE", 2, {"strict": "1"})
    runner = Runner(sess, "front")
    engine = Engine(runner, tm.tokenizer, context_length=512, parallel=4)
    bad_len, join_len = 17, 23
    real_prefill, real_add = runner.prefill, engine._batch.add

    def prefill(ids, caches, start):
        if start + len(ids) == bad_len:
            raise RuntimeError("injected prefill failure")
        return real_prefill(ids, caches, start)

    def add(caches, length):
        if length == join_len:
            raise RuntimeError("injected join failure")
        return real_add(caches, length)

    runner.prefill = prefill
    engine._batch.add = add
    lens = [5, bad_len, 9, join_len, 7]
    try:
        got = run_all(engine, [rng.integers(0, 256, n) for n in lens], 6)
    finally:
        engine.stop()
    reasons = [reason for _, reason in got]
    assert reasons == ["length", "error", "length", "error", "length"], reasons
    assert [len(t) for t, _ in got] == [6, 0, 6, 1, 6]
