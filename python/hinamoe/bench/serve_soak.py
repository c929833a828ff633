"""``hina-bench serve-soak``: a server under steady concurrent load with bad
requests mixed in, for minutes: nothing may fail or get lost, memory must
stay flat."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np

from .machine import cpu_name
from .serve import WORDS, one_request, parse_target

NAME = "serve-soak"
HELP = "soak-test an OpenAI-compatible server: concurrent clients, bad requests mixed in, memory over time"
DESCRIPTION = """\
--clients streaming clients send completions to one server for --minutes;
every --bad-every-th request is a bad one instead (malformed JSON, an
unknown field, a negative temperature, max_tokens beyond any context, an
unknown model), which must be answered with a 4xx. Reported: good requests
answered in full, failures (any error, short answer or a bad request not
answered with a 4xx: the run fails), and, when the server publishes
hina_process_resident_memory_bytes on /metrics (hina-serve does), its
resident memory sampled every 10 s: the first sample after --warmup-s, the
largest, the last.

Example:
  hina-serve qwen3-int4 -np 8 -t 2 &
  hina-bench serve-soak http://127.0.0.1:8000 --clients 8 --minutes 10 --json soak.json
"""

BAD = [
    (b'{"model": "M", "prompt": "x"', 400),
    (b'{"model": "M", "prompt": "x", "frobnicate": true}', 400),
    (b'{"model": "M", "prompt": "x", "temperature": -3}', 400),
    (b'{"model": "M", "prompt": "x", "max_tokens": 100000000}', 400),
    (b'{"model": "no-such-model", "prompt": "x"}', 404),
]
RSS = "hina_process_resident_memory_bytes"


def add_arguments(p) -> None:
    p.add_argument("target", metavar="URL", help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    p.add_argument("--minutes", type=float, default=10, help="how long (default 10)")
    p.add_argument("--bad-every", type=int, default=5, help="every N-th request is a bad one (default 5; 0: none)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per good request (default 64)")
    p.add_argument("--prompt-words", type=int, default=32, help="random words per prompt (default 32)")
    p.add_argument("--warmup-s", type=float, default=30, help="memory samples before this are warm-up (default 30)")
    p.add_argument("--api-key", help="Authorization: Bearer key")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the counts and memory samples here")


def resident(client, url: str) -> float | None:
    try:
        for line in client.get(url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(RSS + " "):
                return float(line.split()[1])
    except Exception:
        return None
    return None


def run(args) -> int:
    import httpx

    target = parse_target(args.target, 0)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        target.model = httpx.get(target.url + "/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
    except Exception as e:
        print(f"hina-bench serve-soak: no /v1/models answer from {target.url} ({e})")
        return 2
    end = time.monotonic() + 60 * args.minutes
    lock = threading.Lock()
    counter = iter(range(1 << 62))
    stats = {"good": 0, "bad_answered": 0, "failures": 0, "tokens": 0, "errors": []}
    memory: list[tuple[float, float]] = []
    t0 = time.monotonic()

    def worker(seed: int):
        rng = np.random.default_rng(seed)
        limits = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(timeout=600, headers=headers, limits=limits) as client:
            while time.monotonic() < end:
                with lock:
                    i = next(counter)
                try:
                    if args.bad_every and i % args.bad_every == args.bad_every - 1:
                        body, want = BAD[(i // args.bad_every) % len(BAD)]
                        r = client.post(target.url + "/v1/completions", content=body.replace(b'"M"', json.dumps(
                            target.model).encode()), headers={"Content-Type": "application/json"})
                        ok = r.status_code == want and "error" in r.json()
                        with lock:
                            stats["bad_answered" if ok else "failures"] += 1
                            if not ok:
                                stats["errors"].append(f"bad request answered {r.status_code}: {r.text[:120]}")
                        continue
                    prompt = " ".join(rng.choice(WORDS, args.prompt_words))
                    _, _, n = one_request(client, target, prompt, args.max_tokens)
                    with lock:
                        stats["good"] += 1
                        stats["tokens"] += n
                except Exception as e:
                    with lock:
                        stats["failures"] += 1
                        stats["errors"].append(str(e)[:200])

    def sampler():
        with httpx.Client(headers=headers) as client:
            while time.monotonic() < end:
                rss = resident(client, target.url)
                if rss:
                    memory.append((time.monotonic() - t0, rss))
                time.sleep(10)

    threads = [threading.Thread(target=worker, args=(args.seed + k,)) for k in range(args.clients)]
    threads.append(threading.Thread(target=sampler, daemon=True))
    for t in threads:
        t.start()
    last = time.monotonic()
    while any(t.is_alive() for t in threads[:-1]):
        time.sleep(1)
        if time.monotonic() - last > 60:
            last = time.monotonic()
            print(f"  {(last - t0) / 60:.0f} min: {stats['good']} good, {stats['bad_answered']} bad answered, "
                  f"{stats['failures']} failures", flush=True)
    wall = time.monotonic() - t0
    warm = [m for t, m in memory if t >= args.warmup_s] or [m for _, m in memory]
    mem = {"first_mib": warm[0] / 2 ** 20, "max_mib": max(warm) / 2 ** 20, "last_mib": warm[-1] / 2 ** 20} \
        if warm else None
    print(f"{cpu_name()}; {target.url} ({target.model}), {args.clients} clients, {wall / 60:.1f} min")
    print(f"good requests {stats['good']} ({stats['tokens'] / wall:.1f} tok/s), bad requests answered 4xx "
          f"{stats['bad_answered']}, failures {stats['failures']}")
    if mem:
        print(f"resident memory after warm-up: first {mem['first_mib']:.0f} MiB, max {mem['max_mib']:.0f}, "
              f"last {mem['last_mib']:.0f}")
    for e in stats["errors"][:5]:
        print("  error:", e)
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": cpu_name(), "target": target.__dict__, "clients": args.clients,
                                               "minutes": wall / 60, **stats, "memory": memory,
                                               "memory_summary": mem}, indent=1))
    return 1 if stats["failures"] else 0
