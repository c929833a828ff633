"""``hina-serve MODEL_DIR``: the OpenAI-compatible server."""

from __future__ import annotations

import argparse
import os
import sys

from .server import ServeOptions

EPILOG = """\
endpoints: POST /v1/chat/completions, POST /v1/completions (stream: true for
server-sent events), GET /v1/models, GET /health, GET /metrics (Prometheus).

examples:
  hina-serve ./qwen3-int4                       # a hina-export folder
  hina-serve ./gpt-oss-genai --parallel 8 -t 2  # an onnxruntime-genai folder
  python -m hinamoe.models.tiny_lm /tmp/tiny --tokenizer && hina-serve /tmp/tiny
  curl localhost:8000/v1/completions -H 'Content-Type: application/json' \\
       -d '{"model": "tiny", "prompt": "Hello", "max_tokens": 16}'
"""


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="hina-serve", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve a model folder (onnxruntime-genai, hina-export or tiny_lm) on HinaMoE with an "
                    "OpenAI-compatible HTTP API and continuous batching: requests that arrive while others "
                    "decode join the running batch at the next step.")
    ap.add_argument("model_dir", help="model folder")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine "
                    "only; 0.0.0.0 opens it to the network, best with --api-key)")
    ap.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    ap.add_argument("-np", "--parallel", type=int, default=4,
                    help="sequences decoded together, one KV slot each (default 4)")
    ap.add_argument("--max-queue", type=int, default=64,
                    help="requests waiting for a slot; beyond this the server answers 429 (default 64)")
    ap.add_argument("-c", "--ctx-size", type=int, default=0,
                    help="context length per sequence (default: the model's, at most 4096)")
    ap.add_argument("--prefill-chunk", type=int, default=512,
                    help="prompt tokens per prefill call: a long prompt pauses the others' decoding for one "
                         "chunk at a time (default 512)")
    ap.add_argument("-t", "--threads", type=int, default=0, help="intra-op threads (default: one per core)")
    ap.add_argument("--ep", choices=("HinaMoE", "cpu"), default="HinaMoE",
                    help="HinaMoE (default; ORT's CPU EP runs the nodes it does not claim) or ORT's CPU EP alone")
    ap.add_argument("--no-strict", action="store_true",
                    help="let HinaMoE leave nodes it claims to the CPU EP instead of failing at load")
    ap.add_argument("--isa", help="HinaMoE kernel tier: auto, scalar, avx2, avx512, amx (default auto)")
    ap.add_argument("--numa", help="HinaMoE NUMA option (see docs/numa.md)")
    ap.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE",
                    help="another HinaMoE provider option (repeatable)")
    ap.add_argument("--model-name", help="the model id clients send (default: the folder's name)")
    ap.add_argument("--api-key", default=os.environ.get("HINA_SERVE_API_KEY"),
                    help="require 'Authorization: Bearer KEY' on /v1/ (default: $HINA_SERVE_API_KEY, else none)")
    ap.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    return ap.parse_args(argv)


def options_from_args(args) -> ServeOptions:
    provider = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"hina-serve: --option {item!r}: expected KEY=VALUE")
        provider[key] = value
    for key in ("isa", "numa"):
        if getattr(args, key):
            provider[key] = getattr(args, key)
    if args.ep == "cpu" and provider:
        raise SystemExit("hina-serve: HinaMoE options given with --ep cpu")
    return ServeOptions(ep=args.ep, strict=not args.no_strict, provider_options=provider, threads=args.threads,
                        parallel=args.parallel, max_queue=args.max_queue, context_length=args.ctx_size,
                        prefill_chunk=args.prefill_chunk, model_name=args.model_name, api_key=args.api_key)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        import uvicorn
    except ImportError:
        print("hina-serve needs the serve extra: pip install 'hinamoe[serve]'", file=sys.stderr)
        return 2
    from .model_folder import ModelFolderError
    from .server import build_app

    try:
        app = build_app(args.model_dir, options_from_args(args))
    except (ModelFolderError, ValueError, FileNotFoundError) as e:
        print(f"hina-serve: {e}", file=sys.stderr)
        return 2
    engine = app.state.engine
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"hina-serve: warning: listening on {args.host} with no --api-key: anyone who can reach this port "
              "can use the model", file=sys.stderr)
    print(f"hina-serve: {args.model_dir} on {args.ep}, {engine.parallel} slots of {engine.context_length} "
          f"tokens, http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
