"""Continuous batching: one thread runs the model for every request.

Each turn of the loop takes waiting requests into free slots (at most
``parallel`` sequences at once), prefills one chunk of one new prompt on its
own (batch 1: ONNX Runtime's GroupQueryAttention takes several new tokens
after a past only for one sequence), then decodes one token of every running
sequence in a single call. A prompt that finishes its prefill joins the
batch at the next step; a sequence that ends (end of sequence, a stop
string, ``max_tokens``, the context, or its client gone) leaves it at once.
So N users share one pass over the weights per token, and a long prompt
delays the others by one chunk at a time, not by its whole length.

Requests are consumed through a callback (``sink``) called on the engine
thread with each ``Event``; ``Engine.stream`` wraps it in an iterator.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from .metrics import Metrics
from .runner import Runner
from .sampling import SamplingParams, sample
from .text_stream import TextStream

log = logging.getLogger("hinamoe.serve")


@dataclass
class Event:
    text: str                          # new text ("" while held back)
    token: int | None = None           # the token generated, None on a closing event
    finish_reason: str | None = None   # "stop", "length", "cancelled" or "error" on the last event
    error: str | None = None


class QueueFull(RuntimeError):
    pass


class Request:
    _ids = itertools.count()

    def __init__(self, prompt: list[int], params: SamplingParams, sink: Callable[[Event], None]):
        self.id = next(self._ids)
        self.prompt = np.asarray(prompt, np.int64)
        self.params, self.sink = params, sink
        self.rng = params.rng()
        self.text: TextStream | None = None
        self.generated: list[int] = []
        self.caches = None            # own KV caches while prefilling
        self.prefilled = 0
        self.cancelled = False
        self.finish_reason: str | None = None
        self.submitted = time.monotonic()
        self.first_token_at: float | None = None

    def cancel(self) -> None:
        """Frees the request's slot at the engine's next turn (e.g. its client left)."""
        self.cancelled = True


class Engine:
    def __init__(self, runner: Runner, tokenizer, eos_token_ids=(), context_length: int = 4096,
                 parallel: int = 4, max_queue: int = 64, prefill_chunk: int = 512):
        if parallel < 1 or max_queue < 0 or prefill_chunk < 1:
            raise ValueError("parallel and prefill_chunk must be >= 1, max_queue >= 0")
        self.runner, self.tokenizer = runner, tokenizer
        self.eos = set(int(t) for t in eos_token_ids)
        self.context_length, self.parallel = context_length, parallel
        self.max_queue, self.prefill_chunk = max_queue, prefill_chunk
        self.metrics = Metrics()
        self._waiting: deque[Request] = deque()
        self._prefilling: list[Request] = []
        self._rows: list[Request] = []           # the batch's rows, in order
        self._batch = runner.new_batch()
        self._cv = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="hina-serve-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ clients

    def submit(self, prompt: list[int], params: SamplingParams, sink: Callable[[Event], None]) -> Request:
        """Queues a request; raises ``QueueFull`` when ``max_queue`` wait
        already, ``ValueError`` when it cannot fit the context."""
        if not len(prompt):
            raise ValueError("the prompt is empty")
        if len(prompt) + params.max_tokens > self.context_length:
            raise ValueError(f"prompt of {len(prompt)} tokens + max_tokens {params.max_tokens} exceeds "
                             f"the context length {self.context_length}")
        req = Request(prompt, params, sink)
        with self._cv:
            if self._stopping:
                raise RuntimeError("the engine has stopped")
            if len(self._waiting) >= self.max_queue + max(0, self.parallel - self._busy()):
                self.metrics.rejected += 1
                raise QueueFull(f"{len(self._waiting)} requests are waiting (limit {self.max_queue})")
            self._waiting.append(req)
            self.metrics.queue_depth = len(self._waiting)
            self._cv.notify()
        return req

    def stream(self, prompt: list[int], params: SamplingParams) -> Iterator[Event]:
        """Submits and yields the request's events until its last one;
        leaving the loop early cancels it."""
        q: queue.Queue[Event] = queue.Queue()
        req = self.submit(prompt, params, q.put)
        try:
            while True:
                ev = q.get()
                yield ev
                if ev.finish_reason is not None:
                    return
        finally:
            req.cancel()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join()
        for req in [*self._waiting, *self._prefilling, *self._rows]:
            self._finish(req, "cancelled")

    def _busy(self) -> int:
        return len(self._prefilling) + len(self._rows)

    @property
    def running(self) -> int:
        return len(self._rows)

    # ------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not (self._waiting or self._prefilling or self._rows):
                    self._cv.wait()
                if self._stopping:
                    return
                while self._waiting and self._busy() < self.parallel:
                    self._prefilling.append(self._waiting.popleft())
                self.metrics.queue_depth = len(self._waiting)
                dropped = [r for r in self._waiting if r.cancelled]
                for r in dropped:
                    self._waiting.remove(r)
            try:
                for r in dropped:
                    self._finish(r, "cancelled")
                self._drop_cancelled()
                self._step()
            except Exception as e:  # never leaves the thread: every client gets its last event
                log.exception("engine turn failed")
                with self._cv:
                    stranded = [*self._waiting, *self._prefilling, *self._rows]
                    self._waiting.clear()
                self._prefilling, self._rows, self._batch = [], [], self.runner.new_batch()
                for r in stranded:
                    self._finish(r, "error", f"the engine failed: {e}")

    def _step(self) -> None:
        """One prefill chunk, then one decode step; a failure fails only the
        requests it concerns."""
        if self._prefilling:
            req = self._prefilling[0]
            try:
                self._prefill_chunk(req)
            except Exception as e:  # a bad request must not take the server down
                log.exception("prefill failed")
                if req in self._prefilling:
                    self._prefilling.remove(req)
                self._finish(req, "error", f"prefill failed: {e}")
        if self._rows:
            try:
                self._decode_step()
            except Exception as e:
                log.exception("decode step failed")
                for r in self._rows:
                    self._finish(r, "error", f"decode failed: {e}")
                self._rows, self._batch = [], self.runner.new_batch()

    def _drop_cancelled(self) -> None:
        for r in [r for r in self._prefilling if r.cancelled]:
            self._prefilling.remove(r)
            self._finish(r, "cancelled")
        gone = [i for i, r in enumerate(self._rows) if r.cancelled]
        if gone:
            self._leave(gone, "cancelled")

    def _prefill_chunk(self, req: Request) -> None:
        start = req.prefilled
        size = len(req.prompt) if self.runner.whole_prompts else self.prefill_chunk
        chunk = req.prompt[start:start + size]
        caches = req.caches if req.caches is not None else self.runner.empty_caches()
        t0 = time.perf_counter()
        logits, req.caches = self.runner.prefill(chunk, caches, start)
        self.metrics.prefill(len(chunk), time.perf_counter() - t0)
        req.prefilled += len(chunk)
        if req.prefilled < len(req.prompt):
            return
        self._prefilling.remove(req)
        req.text = TextStream(self.tokenizer, req.params.stop)
        req.first_token_at = time.monotonic()
        if self._emit(req, logits):
            self._batch.add(req.caches, len(req.prompt))
            self._rows.append(req)
        req.caches = None

    def _decode_step(self) -> None:
        tokens = np.array([r.generated[-1] for r in self._rows], np.int64)
        t0 = time.perf_counter()
        logits = self.runner.decode(self._batch, tokens)
        self.metrics.decode(len(self._rows), time.perf_counter() - t0)
        done = [i for i, r in enumerate(self._rows) if not self._emit(r, logits[i])]
        if done:
            self._leave(done, None)

    def _emit(self, req: Request, logits: np.ndarray) -> bool:
        """Samples the request's next token and sends it; False when the
        request has finished."""
        tok = sample(logits, req.params, req.rng)
        req.generated.append(tok)
        if tok in self.eos and not req.params.ignore_eos:
            self._finish(req, "stop")
            return False
        piece = req.text.push(tok)
        if req.text.stopped:
            self._send(req, Event(piece, tok))
            self._finish(req, "stop")
            return False
        full = (len(req.generated) >= req.params.max_tokens
                or len(req.prompt) + len(req.generated) >= self.context_length)
        if full:
            self._send(req, Event(piece, tok))
            self._finish(req, "length")
            return False
        self._send(req, Event(piece, tok))
        return True

    def _leave(self, rows: list[int], reason: str | None) -> None:
        for i in rows:
            if reason is not None:
                self._finish(self._rows[i], reason)
        self._batch.remove(rows)
        self._rows = [r for i, r in enumerate(self._rows) if i not in set(rows)]

    def _send(self, req: Request, ev: Event) -> None:
        try:
            req.sink(ev)
        except Exception:  # a consumer that has gone away
            log.debug("request %d: sink failed", req.id, exc_info=True)
            req.cancelled = True

    def _finish(self, req: Request, reason: str, error: str | None = None) -> None:
        if req.finish_reason is not None:
            return
        req.finish_reason = reason
        tail = req.text.flush() if req.text is not None and reason in ("stop", "length") else ""
        self.metrics.finished(reason)
        self._send(req, Event(tail, None, reason, error))
