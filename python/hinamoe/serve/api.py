"""The HTTP face of the engine: OpenAI's chat and text completion endpoints
(streamed as server-sent events or whole), ``/v1/models``, ``/health`` and
Prometheus ``/metrics``, on FastAPI."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from .engine import Engine, Event, QueueFull
from .schemas import ApiError, ChatRequest, CompletionRequest, Sampling

DISCONNECT_POLL_S = 0.5


def create_app(engine: Engine, tokenizer, model_name: str, api_key: str | None = None) -> FastAPI:
    """The app serving ``engine`` as ``model_name``. ``tokenizer`` turns
    prompts into tokens (the engine keeps its own instance for the output:
    Hugging Face tokenizers are not safe to share between threads)."""
    app = FastAPI(title="hina-serve", description="OpenAI-compatible server on HinaMoE")
    created = int(time.time())
    fingerprint = "hinamoe-" + uuid.uuid4().hex[:12]   # one per app instance: tells replicas apart

    @app.exception_handler(ApiError)
    async def _api_error(_, e: ApiError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_, e: RequestValidationError):
        err = e.errors()[0] if e.errors() else {}
        if err.get("type") == "json_invalid":
            at = err.get("loc", ("body", "?"))[-1]
            return JSONResponse(ApiError(400, f"malformed JSON (at character {at}): {err.get('msg', '')}").body(),
                                status_code=400)
        param = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or None
        what = "unknown field" if err.get("type") == "extra_forbidden" else err.get("msg", "invalid request")
        return JSONResponse(ApiError(400, f"{param}: {what}" if param else what, param=param).body(),
                            status_code=400)

    @app.middleware("http")
    async def _auth(request: Request, call_next):
        if api_key and request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "")
            if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                e = ApiError(401, "missing or wrong API key (Authorization: Bearer ...)", code="invalid_api_key")
                return JSONResponse(e.body(), status_code=401)
        return await call_next(request)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, "running": engine.running,
                "waiting": engine.metrics.queue_depth}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(engine.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "hinamoe"}]}

    def check_model(body: Sampling) -> None:
        if body.model != model_name:
            raise ApiError(404, f"model {body.model!r} does not exist; this server serves {model_name!r}",
                           param="model", code="model_not_found")

    def prompt_ids(body) -> list[int]:
        if isinstance(body, ChatRequest):
            if not getattr(tokenizer, "chat_template", None):
                raise ApiError(400, "the model folder has no chat template: use /v1/completions",
                               param="messages")
            msgs = [{"role": m.role, "content": m.text()} for m in body.messages]
            try:
                text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            except Exception as e:  # the template's own raise_exception, e.g. role order
                raise ApiError(400, f"chat template: {e}", param="messages") from e
            return tokenizer.encode(text, add_special_tokens=False)
        if isinstance(body.prompt, str):
            return tokenizer.encode(body.prompt)
        vocab = engine.runner.vocab or len(tokenizer)
        if any(not 0 <= t < vocab for t in body.prompt):
            raise ApiError(400, f"prompt: token ids must be in [0, {vocab})", param="prompt")
        return list(body.prompt)

    def submit(body, ids: list[int], sink):
        ctx = engine.context_length
        if len(ids) >= ctx:
            raise ApiError(400, f"the prompt has {len(ids)} tokens; the context holds {ctx}",
                           param="messages" if isinstance(body, ChatRequest) else "prompt",
                           code="context_length_exceeded")
        want = body.wanted_tokens()
        if want is not None and len(ids) + want > ctx:
            raise ApiError(400, f"prompt ({len(ids)} tokens) + max_tokens ({want}) exceeds the context "
                           f"of {ctx} tokens", param="max_tokens", code="context_length_exceeded")
        try:
            return engine.submit(ids, body.sampling(want or ctx - len(ids)), sink)
        except QueueFull as e:
            raise ApiError(429, f"the server is busy: {e}", type_="server_busy", code="queue_full") from e

    async def handle(body, request: Request, chat: bool):
        check_model(body)
        ids = prompt_ids(body)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()
        req = submit(body, ids, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        kind = "chat.completion" if chat else "text_completion"
        now = int(time.time())

        def usage() -> dict:
            n = len(req.generated)
            return {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}

        def choice(text: str | None, finish: str | None, delta: bool) -> dict:
            if not chat:
                return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            if delta:
                return {"index": 0, "delta": {} if text is None else {"content": text}, "finish_reason": finish}
            return {"index": 0, "message": {"role": "assistant", "content": text},
                    "logprobs": None, "finish_reason": finish}

        def finish_of(ev: Event) -> str:
            return "length" if ev.finish_reason == "length" else "stop"

        if not body.stream:
            parts = []
            try:
                while True:
                    try:
                        ev = await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
                    except asyncio.TimeoutError:
                        if await request.is_disconnected():
                            req.cancel()
                            return None
                        continue
                    parts.append(ev.text)
                    if ev.finish_reason is not None:
                        break
            except asyncio.CancelledError:
                req.cancel()
                raise
            if ev.finish_reason == "error":
                raise ApiError(500, ev.error or "generation failed", type_="server_error")
            return {"id": rid, "object": kind, "created": now, "model": model_name,
                    "system_fingerprint": fingerprint, "choices": [choice("".join(parts), finish_of(ev), False)],
                    "usage": usage()}

        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        chunk_kind = kind + ".chunk" if chat else kind

        def sse(payload: dict) -> str:
            return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"

        def chunk(choices: list, **extra) -> str:
            return sse({"id": rid, "object": chunk_kind, "created": now, "model": model_name,
                        "system_fingerprint": fingerprint, "choices": choices, **extra})

        async def stream():
            try:
                if chat:
                    yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                  "finish_reason": None}])
                while True:
                    ev = await events.get()
                    if ev.finish_reason == "error":
                        yield sse(ApiError(500, ev.error or "generation failed", type_="server_error").body())
                        break
                    if ev.token is not None or ev.text:   # a chunk per token, as llama-server: "" while text is held
                        yield chunk([choice(ev.text, None, True)])
                    if ev.finish_reason is not None:
                        yield chunk([choice(None, finish_of(ev), True)])
                        if include_usage:
                            yield chunk([], usage=usage())
                        break
                yield "data: [DONE]\n\n"
            finally:
                req.cancel()   # a no-op once finished; frees the slot when the client left

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        return await handle(body, request, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await handle(body, request, chat=False)

    return app
