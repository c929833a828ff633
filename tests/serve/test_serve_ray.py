"""hina-serve's app on Ray Serve: two replicas on this machine answer through
Ray's HTTP proxy, each with its own engine, and greedy answers equal the
library's."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")

from support.serve_support import MODEL_NAME, free_port, tiny_model  # noqa: F401,E402  (fixture)


@pytest.fixture(scope="module")
def ray_serve(tiny_model):  # noqa: F811
    import ray
    from ray import serve

    from hinamoe.serve import ServeOptions
    from hinamoe.serve.ray_app import application

    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(application(str(tiny_model.folder), ServeOptions(parallel=2, max_queue=8, model_name=MODEL_NAME),
                              num_replicas=2, num_cpus=1), name="hina", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_replicas_answer_through_the_proxy(ray_serve, tiny_model, rng):  # noqa: F811
    from ray import serve

    status = serve.status().applications["hina"]
    assert status.status == "RUNNING"
    (dep,) = status.deployments.values()
    assert dep.replica_states.get("RUNNING") == 2

    c = openai.OpenAI(base_url=ray_serve + "/v1", api_key="none", max_retries=0)
    prompts = ["".join(chr(x) for x in rng.integers(0x61, 0x7B, 6)) for _ in range(12)]
    results, errors = [None] * len(prompts), []

    def one(i):
        try:
            results[i] = c.completions.create(model=MODEL_NAME, prompt=prompts[i], max_tokens=48, temperature=0,
                                              extra_body={"ignore_eos": True})
        except Exception as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len({r.system_fingerprint for r in results}) == 2, "one replica answered everything"
    for p, r in zip(prompts, results):
        toks, margins = tiny_model.greedy(tiny_model.tokenizer.encode(p), 48)
        assert r.usage.completion_tokens == 48
        if margins.min() > 1e-3:
            assert r.choices[0].text == tiny_model.tokenizer.decode(toks, skip_special_tokens=True)
    # streaming passes through the proxy too
    chunks = list(c.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=8, stream=True))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
