"""hina-serve's pieces on their own: sampling against a float64 reference
distribution, text streaming and stop strings against whole-text decoding,
and the batch KV cache's layouts against per-sequence copies."""

from __future__ import annotations

import numpy as np
import pytest

from hinamoe.serve.kv_batch import KVBatch
from hinamoe.serve.sampling import SamplingParams, sample

# ------------------------------------------------------------ sampling


def reference_distribution(logits, temperature, top_k, top_p):
    """What sampling should draw from, written independently: sort once,
    cut by rank (top-k) and by mass (top-p), renormalise."""
    x = np.asarray(logits, np.float64) / temperature
    order = np.argsort(-x, kind="stable")
    p = np.exp(x[order] - x[order[0]])
    if top_k:
        p[top_k:] = 0.0
    p /= p.sum()
    n = len(p)
    if top_p < 1.0:
        n = next(i + 1 for i, c in enumerate(np.cumsum(p)) if c >= top_p)
        p[n:] = 0.0
        p /= p.sum()
    out = np.zeros_like(p)
    out[order] = p
    return out


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.3, 0, 0.8), (1.0, 8, 0.6)])
def test_sampling_matches_reference_distribution(rng, temperature, top_k, top_p):
    logits = (rng.standard_normal(24) * 1.5).astype(np.float32)
    want = reference_distribution(logits, temperature, top_k, top_p)
    params = SamplingParams(max_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p)
    draws = 20000
    got = np.bincount([sample(logits, params, rng) for _ in range(draws)], minlength=len(logits)) / draws
    assert np.all(got[want == 0] == 0), "a token outside top-k / top-p was drawn"
    sigma = np.sqrt(want * (1 - want) / draws)
    assert np.all(np.abs(got - want) <= 5 * sigma + 1e-12), (got, want)


def test_greedy_and_seeds(rng):
    logits = rng.standard_normal(50).astype(np.float32)
    assert sample(logits, SamplingParams(max_tokens=1, temperature=0.0), rng) == int(np.argmax(logits))
    assert sample(logits, SamplingParams(max_tokens=1, top_k=1), rng) == int(np.argmax(logits))
    params = SamplingParams(max_tokens=1, seed=int(rng.integers(1 << 30)))
    a, b = params.rng(), params.rng()
    assert [sample(logits, params, a) for _ in range(20)] == [sample(logits, params, b) for _ in range(20)]


@pytest.mark.parametrize("kwargs", [{"max_tokens": 0}, {"max_tokens": 1, "temperature": -0.1},
                                    {"max_tokens": 1, "top_p": 0.0}, {"max_tokens": 1, "top_k": -2}])
def test_sampling_params_reject_bad_values(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


# ------------------------------------------------------------ text


@pytest.fixture(scope="module")
def byte_tokenizer():
    pytest.importorskip("transformers")
    from hinamoe.models.hf_tiny import byte_tokenizer

    return byte_tokenizer()


def random_text(rng, n: int) -> str:
    pieces = list("abc xyz.,!") + ["é", "ß", "中", "文", "🙂", "\n"]
    return "".join(pieces[i] for i in rng.integers(0, len(pieces), n))


def stream_text(tok, text: str, stop=()):
    from hinamoe.serve.text_stream import TextStream

    ts = TextStream(tok, tuple(stop))
    out = []
    for t in tok.encode(text):
        out.append(ts.push(t))
        if ts.stopped:
            break
    out.append(ts.flush())
    return "".join(out), ts


def test_text_stream_rebuilds_multibyte_text(byte_tokenizer, rng):
    text = random_text(rng, 200)
    got, ts = stream_text(byte_tokenizer, text)
    assert got == text and ts.text == text and not ts.stopped


def test_text_stream_stops_at_first_stop_string(byte_tokenizer, rng):
    for _ in range(20):
        text = random_text(rng, 120)
        a = int(rng.integers(5, 100))
        stops = [text[a:a + int(rng.integers(1, 4))], "never-there"]
        got, ts = stream_text(byte_tokenizer, text, stops)
        cut = min(i for i in (text.find(s) for s in stops) if i >= 0)
        assert got == text[:cut], (stops, got, text[:cut])
        assert ts.stopped


def test_text_stream_holds_back_a_possible_stop(byte_tokenizer):
    from hinamoe.serve.text_stream import TextStream

    ts = TextStream(byte_tokenizer, ("END",))
    sent = "".join(ts.push(t) for t in byte_tokenizer.encode("abcEN"))
    assert sent == "abc"                       # "EN" may still become "END"
    assert ts.push(byte_tokenizer.encode("X")[0]) == "ENX"
    assert ts.flush() == ""


# ------------------------------------------------------------ KV batch


def cache_rows(batch: KVBatch):
    """Each row's tokens, per cache, read where its layout keeps them."""
    out = []
    for r, n in enumerate(batch.lengths):
        if batch.layout == "front":
            out.append([c[r, :, :n] for c in batch.caches])
        else:
            out.append([c[r, :, batch.columns - n:batch.columns] for c in batch.caches])
    return out


@pytest.mark.parametrize("spare", [0, 3], ids=["apart", "shared"])
@pytest.mark.parametrize("layout", ["front", "back"])
def test_kv_batch_keeps_rows_through_joins_and_leaves(rng, layout, spare):
    """Rows join and leave while the batch decodes; every row keeps its
    tokens where the mask says. "shared": the caches have spare columns and
    the op writes each new key into them in place (a spare of 3 runs out
    every few steps and moves the caches to larger buffers)."""
    layers, heads, d = 2, 3, 4
    batch = KVBatch(layout, layers, heads, d, spare=spare)
    want = []   # (length, [caches]) per live row
    for step in range(12):
        if step % 3 == 0 or not want:           # a sequence joins
            n = int(rng.integers(1, 9))
            own = [rng.standard_normal((1, heads, n, d)).astype(np.float32) for _ in range(2 * layers)]
            batch.add(own, n)
            want.append([c[0] for c in own])
        if step % 4 == 3 and len(want) > 1:     # one leaves
            r = int(rng.integers(len(want)))
            batch.remove([r])
            want.pop(r)
        # a one-token step: the masks say which columns are each row's
        inp = batch.step_inputs()
        lens = np.asarray(batch.lengths)
        assert np.array_equal(inp["attention_mask"].sum(1), lens + 1)
        assert np.array_equal(inp["position_ids"][:, 0], lens)
        mask = inp["attention_mask"]
        if layout == "front":
            assert np.all(mask[:, 0] == 1) and mask.shape[1] == lens.max() + 1
        else:
            assert np.all(mask[:, -1] == 1) and mask.shape[1] == batch.columns + 1
        # what the graph would return: each row's new token at the column its mask opens
        new = [rng.standard_normal((len(lens), heads, 1, d)).astype(np.float32) for _ in range(2 * layers)]
        presents = []
        for c, k in zip(batch.caches, new):
            if spare:   # in place: the column each row's mask opens, inside the buffer
                assert c.shape[2] >= batch.columns + 1
                for r, n in enumerate(lens):
                    c[r, :, n if layout == "front" else batch.columns] = k[r, :, 0]
                presents.append(c)
                continue
            if layout == "front":
                p = np.zeros((c.shape[0], heads, max(c.shape[2], lens.max() + 1), d), np.float32)
                p[:, :, :c.shape[2]] = c
                for r, n in enumerate(lens):
                    p[r, :, n] = k[r, :, 0]
            else:
                p = np.concatenate([c, k], axis=2)
            presents.append(p)
        batch.advance(presents)
        want = [[np.concatenate([w, k[r]], axis=1) for w, k in zip(row, new)] for r, row in enumerate(want)]
        assert batch.columns == max(batch.lengths)
        for got_row, want_row in zip(cache_rows(batch), want):
            for g, w in zip(got_row, want_row):
                assert np.array_equal(g, w)
