"""One ONNX Runtime session of a decoder, driven a step at a time: a
sequence's prompt on its own (batch 1, in chunks), or one token of every
sequence in a ``KVBatch``.

The graph's inputs are read by name: ``input_ids``, ``attention_mask``,
``position_ids`` when it has one, ``past_key_values.{i}.key|value``; its
outputs ``logits`` and ``present.{i}.key|value``.
"""

from __future__ import annotations

import re

import numpy as np

from .kv_batch import KVBatch

# Columns a shared cache holds beyond its tokens: a move to a larger buffer
# every SPARE_COLUMNS steps instead of a copy of the cache every step.
SPARE_COLUMNS = 64
_PAST = re.compile(r"past_key_values\.(\d+)\.(key|value)$")
_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def make_session(model_file, ep: str = "HinaMoE", threads: int = 0, options: dict | None = None):
    """A session on HinaMoE (its ``options``, e.g. ``{"strict": "1"}``; ORT's
    CPU EP runs the nodes HinaMoE does not claim) or on the CPU EP alone
    (``ep="cpu"``)."""
    from ..models.tiny_lm import make_session as session

    if ep.lower() == "cpu":
        return session(str(model_file), "CPU", threads)
    if ep != "HinaMoE":
        raise ValueError(f"unknown EP {ep!r}: 'HinaMoE' or 'cpu'")
    return session(str(model_file), ep, threads, provider_options={k: str(v) for k, v in (options or {}).items()})


class Runner:
    def __init__(self, sess, layout: str, kv_shape: tuple[int, int] | None = None,
                 rings: dict[str, int] | None = None, share_buffer: bool = False):
        """``kv_shape``: (KV heads, head size) where the graph leaves them
        symbolic (onnxruntime-genai's builder does). ``rings``: past inputs
        kept as sliding-window ring buffers (GroupQueryAttention
        ``sliding_window_cache=1``, genai's gpt-oss) and their capacity; the
        op evicts inside them, so each is bound as its own present.
        ``share_buffer``: every cache may be past and present at once
        (``ModelFolder.share_buffer``: genai's ``past_present_share_buffer``,
        or hina-export's mark in the graph's metadata)."""
        self.sess, self.layout = sess, layout
        inputs = {i.name: i for i in sess.get_inputs()}
        outputs = {o.name for o in sess.get_outputs()}
        missing = {"input_ids", "attention_mask"} - set(inputs)
        if missing or "logits" not in outputs:
            raise ValueError(f"the graph lacks {sorted(missing | ({'logits'} - outputs))}: "
                             "not a decoder with input_ids, attention_mask and logits")
        past = sorted((int(m[1]), m[2] == "value", name) for name in inputs if (m := _PAST.match(name)))
        self.layers = len(past) // 2
        if not past or len(past) != 2 * self.layers:
            raise ValueError("the graph has no past_key_values.{i}.key/value pairs")
        self.past_names = [name for _, _, name in past]
        self.present_names = [n.replace("past_key_values.", "present.") for n in self.past_names]
        absent = [n for n in self.present_names if n not in outputs]
        if absent:
            raise ValueError(f"the graph lacks outputs {absent[:2]}...")
        first = inputs[self.past_names[0]]
        if first.type not in _DTYPES:
            raise ValueError(f"KV cache of type {first.type}: the server feeds float32 or float16")
        fed = {"input_ids", "attention_mask", "position_ids", *self.past_names}
        other = sorted(set(inputs) - fed)
        if other:  # e.g. LFM2's convolution states, Qwen3.5's linear-attention states
            raise ValueError(f"the graph has inputs the server does not feed: {other[:4]}; it serves decoders "
                             "whose only state is past_key_values.*")
        self.dtype = _DTYPES[first.type]
        dims = [d if isinstance(d, int) else None for d in (first.shape[1], first.shape[3])]
        self.kv_heads, self.head_dim = (d if d is not None else (kv_shape or (None, None))[i] for i, d in enumerate(dims))
        if self.kv_heads is None or self.head_dim is None:
            raise ValueError(f"{first.name} has shape {first.shape} and the folder's config names no KV heads "
                             "and head size")
        self.has_positions = "position_ids" in inputs
        self.output_names = ["logits", *self.present_names]
        rings = rings or {}
        self.capacity = [rings.get(n) for n in self.past_names]   # None: a growing cache
        # Prompts go in one call where a ring holds less than a later chunk may need.
        self.whole_prompts = any(c is not None for c in self.capacity)
        logits = next(o for o in sess.get_outputs() if o.name == "logits")
        self.vocab = logits.shape[-1] if isinstance(logits.shape[-1], int) else None
        # Decode binds each growing cache as past and present at once.
        self.spare = SPARE_COLUMNS if share_buffer else 0

    def new_batch(self) -> KVBatch:
        return KVBatch(self.layout, self.layers, self.kv_heads, self.head_dim, self.dtype, self.capacity,
                       spare=self.spare)

    def empty_caches(self) -> list[np.ndarray]:
        return [np.zeros((1, self.kv_heads, c or 0, self.head_dim), self.dtype) for c in self.capacity]

    def _run(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, caches: list[np.ndarray],
             shared: bool = False):
        """Logits of the last position [B, V] and the presents. Rings, and
        with ``shared`` every cache, are bound as past and present at once
        (written in place; returned as they are)."""
        feeds = {"input_ids": ids, "attention_mask": mask}
        if self.has_positions:
            feeds["position_ids"] = positions
        in_place = [shared or cap is not None for cap in self.capacity]
        if not any(in_place):
            feeds.update(zip(self.past_names, caches))
            logits, *presents = self.sess.run(self.output_names, feeds)
            return logits[:, -1].astype(np.float32), presents
        import onnxruntime as ort

        io = self.sess.io_binding()
        for name, arr in feeds.items():
            io.bind_cpu_input(name, np.ascontiguousarray(arr))
        io.bind_output("logits")
        keep = []
        for past, present, arr, here in zip(self.past_names, self.present_names, caches, in_place):
            if not here:
                io.bind_cpu_input(past, np.ascontiguousarray(arr))
                io.bind_output(present)
            else:
                ov = ort.OrtValue.ortvalue_from_numpy(arr)
                keep.append(ov)
                io.bind_ortvalue_input(past, ov)
                io.bind_ortvalue_output(present, ov)
        self.sess.run_with_iobinding(io)
        # In binding order: logits, then every present. Those in place are
        # the caches already: only the others are read out (copying the
        # shared ones would cost what sharing saves).
        out = io.get_outputs()
        presents = [arr if here else np.array(got.numpy()) for arr, here, got in zip(caches, in_place, out[1:])]
        return np.array(out[0].numpy()[:, -1], np.float32), presents

    def prefill(self, ids: np.ndarray, caches: list[np.ndarray], start: int):
        """Appends ``ids`` (int64 ``[S]``) to one sequence whose ``caches``
        hold its first ``start`` tokens (``empty_caches()`` for none).
        Returns the last position's logits ``[V]`` and the grown caches."""
        s = len(ids)
        mask = np.ones((1, start + s), np.int64)
        positions = np.arange(start, start + s, dtype=np.int64)[None, :]
        logits, presents = self._run(np.asarray(ids, np.int64)[None, :], mask, positions, caches)
        return logits[0], presents

    def decode(self, batch: KVBatch, tokens: np.ndarray) -> np.ndarray:
        """One token per row of ``batch`` (int64 ``[B]``); returns the logits
        ``[B, V]`` and advances the batch."""
        step = batch.step_inputs()
        logits, presents = self._run(np.asarray(tokens, np.int64)[:, None], step["attention_mask"],
                                     step["position_ids"], batch.caches, shared=batch.shared)
        batch.advance(presents)
        return logits
