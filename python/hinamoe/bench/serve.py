"""``hina-bench serve``: concurrent clients against OpenAI-compatible servers
(hina-serve, llama-server, ...), side by side."""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .cli import csv
from .machine import cpu_name

NAME = "serve"
HELP = "load-test OpenAI-compatible servers: aggregate tok/s, time to first token, per-token latency"
DESCRIPTION = """\
Concurrent streaming clients against one or more OpenAI-compatible servers
(POST /v1/completions with stream: true), e.g. hina-serve and llama-server
serving the same weights. For each client count, each server gets
--requests requests from that many clients at once (each client sends its
next request when its last one ends); servers alternate within a round and
--rounds rounds are run, medians reported.

Per request: time to first token (TTFT: send to the first token's chunk), per-token
latency (first to last token / (tokens - 1)). Per run: aggregate tok/s
(generated tokens / wall time), p50 and p99 of both latencies, failures
(HTTP errors, broken streams, short answers). Every request asks for exactly
--max-tokens tokens (ignore_eos, temperature 0) after a prompt of
--prompt-words random words, fresh for every request (the servers of a
round get the same ones), so servers do the same work and none can answer
from a cached prompt.

Examples:
  hina-serve qwen3-int4 -np 8 -t 2 &                      # port 8000
  llama-server -m qwen3-q4_0.gguf -np 8 -t 2 -c 16384 --port 8090 &
  hina-bench serve hina=http://127.0.0.1:8000 llama=http://127.0.0.1:8090 --clients 1,2,4,8
"""

WORDS = ("the of and to in is was for on that with as by at from it his an were are which this be or has had "
         "not but first one their its new after who they have her she two been other when there all during into "
         "school time may years more most only over city some world would where later up such used many can "
         "state about national out known university united then made").split()


@dataclass
class Target:
    name: str
    url: str
    model: str = ""


@dataclass
class Run:
    target: str
    clients: int
    round: int
    requests: int
    failures: int
    wall_s: float
    tokens: int
    ttft_s: list = field(default_factory=list)
    per_token_s: list = field(default_factory=list)
    errors: list = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def add_arguments(p) -> None:
    p.add_argument("targets", nargs="+", metavar="[NAME=]URL",
                   help="server base URLs (e.g. http://127.0.0.1:8000), optionally named; the first is the "
                        "reference of the ratios")
    p.add_argument("--clients", type=csv(int), default=[1, 2, 4, 8], help="concurrent clients (default 1,2,4,8)")
    p.add_argument("--requests", type=int, default=0,
                   help="requests per run (default: 2 per client, at least 4)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request (default 64)")
    p.add_argument("--prompt-words", type=int, default=32, help="random words per prompt (default 32)")
    p.add_argument("--rounds", type=int, default=3, help="rounds alternating the servers (default 3)")
    p.add_argument("--model", help="model id to send (default: each server's first /v1/models entry)")
    p.add_argument("--api-key", help="Authorization: Bearer key")
    p.add_argument("--timeout", type=float, default=600, help="seconds per request (default 600)")
    p.add_argument("--seed", type=int, default=0, help="prompt words seed")
    p.add_argument("--json", help="write runs and summary here")
    p.add_argument("--plot", help="write aggregate tok/s vs clients here (PNG)")


def parse_target(text: str, i: int) -> Target:
    name, sep, url = text.partition("=")
    if not sep:
        name, url = f"server{i + 1}", text
    return Target(name, url.rstrip("/"))


def one_request(client, target: Target, prompt: str, max_tokens: int):
    """``(ttft, per-token, tokens)`` of one streamed completion."""
    body = {"model": target.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = last = None
    chunks, usage = 0, None
    with client.stream("POST", target.url + "/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:200]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            msg = json.loads(line[6:])
            if "error" in msg:
                raise RuntimeError(f"stream error: {msg['error']}")
            usage = msg.get("usage") or usage
            if any(c.get("finish_reason") is None for c in msg.get("choices", ())):  # a token (its text may be "")
                now = time.perf_counter()
                first = first or now
                last = now
                chunks += 1
    tokens = int(usage["completion_tokens"]) if usage else chunks
    if first is None or tokens < max_tokens:
        raise RuntimeError(f"short answer: {tokens} of {max_tokens} tokens")
    return first - t0, (last - first) / max(tokens - 1, 1), tokens


def run_level(target: Target, clients: int, requests: int, prompts: list[str], args, rnd: int) -> Run:
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    todo = list(range(requests))
    lock = threading.Lock()
    run = Run(target.name, clients, rnd, requests, 0, 0.0, 0)

    def worker():
        # a connection per request: a server may close idle keep-alive connections between requests
        limits = httpx.Limits(max_keepalive_connections=0)
        with httpx.Client(timeout=args.timeout, headers=headers, limits=limits) as client:
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop()
                try:
                    ttft, per_tok, n = one_request(client, target, prompts[i], args.max_tokens)
                    with lock:
                        run.ttft_s.append(ttft)
                        run.per_token_s.append(per_tok)
                        run.tokens += n
                except Exception as e:  # counted, reported, never fatal
                    with lock:
                        run.failures += 1
                        run.errors.append(str(e)[:200])

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    run.wall_s = time.perf_counter() - t0
    return run


def pct(values, q):
    return float(np.percentile(values, q)) if values else float("nan")


def summarize(runs: list[Run]) -> list[dict]:
    rows = []
    order = list(dict.fromkeys(r.target for r in runs))   # as given on the command line
    for key in sorted({(r.clients, r.target) for r in runs}, key=lambda k: (k[0], order.index(k[1]))):
        rs = [r for r in runs if (r.clients, r.target) == key]
        ttft = [x for r in rs for x in r.ttft_s]
        per = [x for r in rs for x in r.per_token_s]
        toks = [r.tok_s for r in rs]
        rows.append({"clients": key[0], "target": key[1], "tok_s": statistics.median(toks),
                     "tok_s_min": min(toks), "tok_s_max": max(toks),
                     "ttft_p50_ms": 1e3 * pct(ttft, 50), "ttft_p99_ms": 1e3 * pct(ttft, 99),
                     "per_token_p50_ms": 1e3 * pct(per, 50), "per_token_p99_ms": 1e3 * pct(per, 99),
                     "failures": sum(r.failures for r in rs), "requests": sum(r.requests for r in rs)})
    return rows


def print_table(rows: list[dict], ref: str) -> None:
    base = {r["clients"]: r["tok_s"] for r in rows if r["target"] == ref}
    print(f"{'clients':>7} {'server':<12} {'tok/s':>8} {'(min-max)':>15} {'vs ' + ref:>10} {'TTFT p50':>9} "
          f"{'p99':>8} {'tok p50':>8} {'p99':>8} {'fail':>6}")
    for r in rows:
        ratio = r["tok_s"] / base[r["clients"]] if base.get(r["clients"]) else float("nan")
        print(f"{r['clients']:>7} {r['target']:<12} {r['tok_s']:>8.1f} {r['tok_s_min']:>7.1f}-{r['tok_s_max']:<7.1f} "
              f"{ratio:>10.2f} {r['ttft_p50_ms']:>7.0f}ms {r['ttft_p99_ms']:>6.0f}ms {r['per_token_p50_ms']:>6.1f}ms "
              f"{r['per_token_p99_ms']:>6.1f}ms {r['failures']:>3}/{r['requests']}")


def plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(r["target"] for r in rows):
        pts = [r for r in rows if r["target"] == name]
        ax.errorbar([r["clients"] for r in pts], [r["tok_s"] for r in pts],
                    yerr=[[r["tok_s"] - r["tok_s_min"] for r in pts], [r["tok_s_max"] - r["tok_s"] for r in pts]],
                    marker="o", capsize=3, label=name)
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("aggregate generated tok/s")
    ax.set_xscale("log", base=2)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run(args) -> int:
    import httpx

    targets = [parse_target(t, i) for i, t in enumerate(args.targets)]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    for t in targets:
        try:
            t.model = args.model or httpx.get(t.url + "/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
        except Exception as e:
            print(f"hina-bench serve: {t.name} at {t.url}: no /v1/models answer ({e})")
            return 2
    rng = np.random.default_rng(args.seed)
    runs: list[Run] = []
    print(f"{cpu_name()}; {args.max_tokens} tokens after {args.prompt_words} words; "
          f"{', '.join(f'{t.name}={t.url} ({t.model})' for t in targets)}")
    for clients in args.clients:
        requests = args.requests or max(4, 2 * clients)
        for rnd in range(args.rounds):
            # fresh prompts per run, the same for every server: no server can reuse a cached prompt
            prompts = [" ".join(rng.choice(WORDS, args.prompt_words)) for _ in range(requests)]
            for t in (targets if rnd % 2 == 0 else targets[::-1]):
                r = run_level(t, clients, requests, prompts, args, rnd)
                runs.append(r)
                print(f"  {clients} clients, round {rnd + 1}, {t.name}: {r.tok_s:.1f} tok/s, "
                      f"{r.failures} failed" + (f" ({r.errors[0]})" if r.errors else ""), flush=True)
    rows = summarize(runs)
    print_table(rows, targets[0].name)
    meta = {"cpu": cpu_name(), "max_tokens": args.max_tokens, "prompt_words": args.prompt_words,
            "targets": [asdict(t) for t in targets]}
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "summary": rows, "runs": [
            {**asdict(r), "tok_s": r.tok_s} for r in runs]}, indent=1))
    if args.plot:
        plot(rows, args.plot, f"{meta['cpu']}\n{args.max_tokens} tokens/request, prompt {args.prompt_words} words")
    return 1 if any(r["failures"] for r in rows) else 0
