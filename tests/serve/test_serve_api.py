"""hina-serve over HTTP, as clients use it: the official ``openai`` client
for chat, completions, streaming and usage; greedy text equal to the
library's; 16 concurrent streams sharing decode steps; bad input answered
with a 4xx while the server keeps serving; a client leaving mid-stream; the
queue limit; the API key."""

from __future__ import annotations

import json
import threading
import time

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from support.serve_support import MODEL_NAME, Server, server, tiny_model  # noqa: F401,E402  (fixtures)


def client(srv, **kw):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=kw.pop("api_key", "none"), max_retries=0, **kw)


def library_text(tm, prompt_ids, new_tokens, ignore_eos=False):
    """The library's greedy continuation, decoded, cut at the end token
    unless ``ignore_eos``."""
    from hinamoe.models.hf_tiny import EOS

    toks, margins = tm.greedy(prompt_ids, new_tokens)
    if EOS in toks and not ignore_eos:
        toks = toks[:toks.index(EOS)]
    return tm.tokenizer.decode(toks, skip_special_tokens=True), margins


def printable(rng, n):
    return "".join(chr(c) for c in rng.integers(0x61, 0x7B, n))


def test_models_health_metrics(server):  # noqa: F811
    assert [m.id for m in client(server).models.list().data] == [MODEL_NAME]
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    text = httpx.get(server.url + "/metrics").text
    assert "# TYPE hina_generated_tokens_total counter" in text and "hina_queue_depth" in text


def test_completion_greedy_equals_library(server, tiny_model, rng):  # noqa: F811
    prompt = printable(rng, int(rng.integers(4, 30)))
    ids = tiny_model.tokenizer.encode(prompt)
    want, margins = library_text(tiny_model, ids, 20)
    r = client(server).completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=20, temperature=0)
    assert r.usage.prompt_tokens == len(ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].finish_reason in ("stop", "length")
    if margins.min() > 1e-3:
        assert r.choices[0].text == want
    # token ids as the prompt give the same answer
    r2 = client(server).completions.create(model=MODEL_NAME, prompt=ids, max_tokens=20, temperature=0)
    assert r2.choices[0].text == r.choices[0].text


def test_chat_stream_equals_whole_answer_with_usage(server, tiny_model, rng):  # noqa: F811
    msgs = [{"role": "system", "content": printable(rng, 8)}, {"role": "user", "content": printable(rng, 12)}]
    c = client(server)
    whole = c.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=16, temperature=0)
    text = tiny_model.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids = tiny_model.tokenizer.encode(text, add_special_tokens=False)
    assert whole.usage.prompt_tokens == len(ids)
    want, margins = library_text(tiny_model, ids, 16)
    if margins.min() > 1e-3:
        assert whole.choices[0].message.content == want
    assert whole.choices[0].message.role == "assistant"
    chunks = list(c.chat.completions.create(model=MODEL_NAME, messages=msgs, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == whole.choices[0].message.content
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_stop_string_and_sampling_options(server, rng):  # noqa: F811
    c = client(server)
    base = c.completions.create(model=MODEL_NAME, prompt="hello", max_tokens=24, temperature=0,
                                extra_body={"ignore_eos": True})
    text = base.choices[0].text
    stop = text[5:7]
    cut = c.completions.create(model=MODEL_NAME, prompt="hello", max_tokens=24, temperature=0, stop=[stop],
                               extra_body={"ignore_eos": True})
    assert cut.choices[0].text == text[:text.find(stop)]
    assert cut.choices[0].finish_reason == "stop"
    seed = int(rng.integers(1 << 30))
    a, b = (c.completions.create(model=MODEL_NAME, prompt="x", max_tokens=12, temperature=1.0, top_p=0.9,
                                 seed=seed, extra_body={"top_k": 40, "ignore_eos": True}) for _ in range(2))
    assert a.choices[0].text == b.choices[0].text and a.usage.completion_tokens == 12


def test_sixteen_concurrent_streams_share_steps(server, tiny_model, rng):  # noqa: F811
    n, new = 16, 24
    prompts = [printable(rng, int(k)) for k in rng.integers(3, 20, n)]
    results, errors = [None] * n, []

    def one(i):
        try:
            parts, finish, used = [], None, None
            for ch in client(server).completions.create(model=MODEL_NAME, prompt=prompts[i], max_tokens=new,
                                                        temperature=0, stream=True,
                                                        stream_options={"include_usage": True},
                                                        extra_body={"ignore_eos": True}):
                if ch.choices:
                    parts.append(ch.choices[0].text)
                    finish = ch.choices[0].finish_reason or finish
                if ch.usage is not None:
                    used = ch.usage.completion_tokens
            results[i] = ("".join(parts), finish, used)
        except Exception as e:  # collected: a thread's failure must fail the test
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    for i, (text, finish, used) in enumerate(results):
        assert finish == "length" and used == new
        want, margins = library_text(tiny_model, tiny_model.tokenizer.encode(prompts[i]), new, ignore_eos=True)
        if margins.min() > 1e-3:
            assert text == want, i
        # else a near-tie may pick another token; special tokens (ignore_eos
        # lets the random model pick them) decode to no text, so the count
        # comes from the usage chunk, not from re-encoding the text.
    assert server.metric("hina_batch_size_max") > 1


BAD = [
    (b'{"model": "tiny", "prompt": "x"', 400, None),                                   # malformed JSON
    (b'not json at all', 400, None),
    ({"model": "tiny", "prompt": "x", "frobnicate": 1}, 400, "frobnicate"),            # unknown field
    ({"model": "tiny", "prompt": "x", "temperature": -1}, 400, "temperature"),
    ({"model": "tiny", "prompt": "x", "temperature": 1e9}, 400, "temperature"),
    ({"model": "tiny", "prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"model": "tiny", "prompt": "x", "top_k": -5}, 400, "top_k"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"model": "tiny", "prompt": "x", "max_tokens": 100000}, 400, "max_tokens"),       # beyond the context
    ({"model": "tiny", "prompt": "a" * 600}, 400, "prompt"),                            # longer than it
    ({"model": "tiny", "prompt": [1, 2, 99999]}, 400, "prompt"),                        # token id out of range
    ({"model": "tiny", "prompt": ""}, 400, "prompt"),
    ({"model": "tiny", "prompt": "x", "n": 3}, 400, "n"),
    ({"model": "tiny", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"model": "nope", "prompt": "x"}, 404, "model"),                                   # unknown model
    ({"prompt": "x"}, 400, "model"),
]
BAD_CHAT = [
    ({"model": "tiny", "messages": []}, 400, "messages"),
    ({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    ({"model": "tiny", "messages": [{"role": "user"}]}, 400, "messages.0.content"),
    ({"model": "tiny", "messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": True}},
     400, None),
]


@pytest.mark.parametrize("path, body, status, param",
                         [("/v1/completions", *b) for b in BAD] + [("/v1/chat/completions", *b) for b in BAD_CHAT])
def test_bad_input_is_a_4xx_and_the_server_lives(server, path, body, status, param):  # noqa: F811
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=data, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    if param is not None:
        assert err["param"] == param, err
    assert server.alive()
    ok = client(server).completions.create(model=MODEL_NAME, prompt="ok", max_tokens=2)
    assert ok.usage.completion_tokens >= 1


def test_client_leaving_mid_stream_frees_its_slot(server):  # noqa: F811
    cancelled = server.metric('hina_requests_total{finish_reason="cancelled"}')
    body = {"model": MODEL_NAME, "prompt": "go", "max_tokens": 400, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
    assert any(line.startswith("data: ") for line in got)
    end = time.monotonic() + 10
    while time.monotonic() < end:
        health = httpx.get(server.url + "/health").json()
        if health["running"] == 0 and server.metric('hina_requests_total{finish_reason="cancelled"}') > cancelled:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the slot was not freed: {health}")


def test_queue_limit_and_api_key(tiny_model, tmp_path):  # noqa: F811
    srv = Server(tiny_model.folder, "--parallel", "1", "--max-queue", "1", "--api-key", "sesame",
                 log=tmp_path / "server.log")
    try:
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        assert httpx.get(srv.url + "/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        c = client(srv, api_key="sesame")
        assert [m.id for m in c.models.list().data] == [MODEL_NAME]
        # 8 at once on 1 slot and a queue of 1: the first runs, the next waits, the rest are refused
        results, barrier = [], threading.Barrier(8)

        def one():
            barrier.wait()
            try:
                r = c.completions.create(model=MODEL_NAME, prompt="q", max_tokens=480,
                                         extra_body={"ignore_eos": True})
                results.append(r.usage.completion_tokens)
            except openai.RateLimitError as e:
                results.append(e.status_code)

        threads = [threading.Thread(target=one) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert sorted(results).count(480) >= 1 and 429 in results and set(results) <= {429, 480}, results
        assert srv.metric("hina_requests_rejected_total") >= 1
        # once they are gone, it serves again
        end = time.monotonic() + 10
        while httpx.get(srv.url + "/health").json()["running"] and time.monotonic() < end:
            time.sleep(0.05)
        assert c.completions.create(model=MODEL_NAME, prompt="x", max_tokens=2).usage.completion_tokens >= 1
    finally:
        srv.stop()


def test_cli_help_and_bad_folder(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "hinamoe.serve.cli", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--parallel" in out.stdout and "/v1/chat/completions" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "hinamoe.serve.cli", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "not a model folder" in bad.stderr
