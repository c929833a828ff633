"""The KV caches of the sequences decoding together, as one batch.

Each layer's key and value are ``[B, Nkv, P, d]`` arrays fed as
``past_key_values.*``; the ``present.*`` a step returns become the next
step's past. Rows have different lengths; where a row's tokens sit inside
its P columns depends on how the graph attends:

* ``"front"`` (GroupQueryAttention fed ``seqlens_k`` from the attention
  mask, as onnxruntime-genai's builder writes it): a row's tokens fill
  columns ``[0, len)`` and the op writes the next one at column ``len``;
  the mask is ``len + 1`` ones then zeros.
* ``"back"`` (past and new keys concatenated, as optimum exports and
  hina-export keep it): a row's tokens fill ``[P - len, P)`` and every row's
  next key lands at column P; the mask is zeros over the left padding.
  Rotary positions come from ``position_ids``, so the padding shifts no key.

Sequences join after their own prefill and leave when done; the padding is
then grown or trimmed, so P stays the longest row's length and a step reads
no more cache than the longest sequence needs.

Where the graph reads lengths from the attention mask alone (hina-export
marks such models ``hinamoe.past_present_share_buffer``), a growing cache
is allocated with ``spare`` columns beyond its ``P``: each step the runner
binds it as past and present at once, the op writes the new key in place,
and no step copies the cache (with past and present apart, every step
copied all P columns of every layer). Only the first P columns are
tokens; when the spare runs out the cache moves to a larger buffer.

A cache with a fixed capacity is a ring (a sliding-window layer whose
GroupQueryAttention evicts inside it, ``sliding_window_cache=1``): each row
keeps its own ring, rows are only stacked and dropped.
"""

from __future__ import annotations

import numpy as np

LAYOUTS = ("front", "back")


class KVBatch:
    def __init__(self, layout: str, layers: int, kv_heads: int, head_dim: int, dtype=np.float32,
                 capacity: list[int | None] | None = None, spare: int = 0):
        """``capacity``: per cache (2 per layer), None for a growing cache or
        the ring's fixed size. ``spare``: columns allocated past P in the
        growing caches (0: exactly P, past and present are apart)."""
        if layout not in LAYOUTS:
            raise ValueError(f"KV layout {layout!r}: one of {LAYOUTS}")
        self.layout, self.layers = layout, layers
        self.kv_heads, self.head_dim, self.dtype = kv_heads, head_dim, np.dtype(dtype)
        self.capacity = list(capacity) if capacity is not None else [None] * (2 * layers)
        self.spare = spare
        self.lengths: list[int] = []
        self.cols = 0  # P: the growing caches' columns holding tokens
        self.caches: list[np.ndarray] = [self._empty(0, 0) if c is None else self._ring(0, c) for c in self.capacity]

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def columns(self) -> int:
        """Columns of the growing caches that hold tokens (P)."""
        return self.cols

    @property
    def shared(self) -> bool:
        """Whether the growing caches are bound as past and present at once."""
        return self.spare > 0

    def _ring(self, rows: int, size: int) -> np.ndarray:
        return np.zeros((rows, self.kv_heads, size, self.head_dim), self.dtype)

    def _empty(self, rows: int, columns: int) -> np.ndarray:
        return np.zeros((rows, self.kv_heads, columns + self.spare, self.head_dim), self.dtype)

    def _place(self, dst: np.ndarray, dst_cols: int, src: np.ndarray, src_cols: int, length: int) -> None:
        """Copies a row's ``length`` tokens from ``src [Nkv, >= src_cols, d]``
        (P = src_cols) into ``dst`` (P = dst_cols)."""
        if self.layout == "front":
            dst[:, :length] = src[:, :length]
        else:
            dst[:, dst_cols - length:dst_cols] = src[:, src_cols - length:src_cols]

    def _moved(self, old: np.ndarray, rows: list[int], cols: int) -> np.ndarray:
        """The growing cache ``old`` with its ``rows`` only, P = ``cols``."""
        arr = self._empty(len(rows), cols)
        for i, r in enumerate(rows):
            self._place(arr[i], cols, old[r], self.cols, self.lengths[r])
        return arr

    def add(self, caches: list[np.ndarray], length: int) -> int:
        """Appends a sequence whose ``caches`` (2 per layer, ``[1, Nkv, L, d]``
        holding its ``length`` tokens where the layout puts them) come from its
        own prefill; returns its row."""
        if len(caches) != len(self.caches):
            raise ValueError(f"{len(caches)} caches for a batch of {len(self.caches)}")
        cols = max(self.cols, length)
        grown = []
        for old, new, cap in zip(self.caches, caches, self.capacity):
            if cap is not None:
                grown.append(np.concatenate([old, new]))
                continue
            arr = self._moved(old, list(range(len(self))), cols)
            arr = np.concatenate([arr, self._empty(1, cols)])
            self._place(arr[-1], cols, new[0], new.shape[2], length)
            grown.append(arr)
        self.caches, self.cols = grown, cols
        self.lengths.append(length)
        return len(self) - 1

    def remove(self, rows: list[int]) -> None:
        """Drops ``rows``; the others keep their order."""
        drop = set(rows)
        keep = [r for r in range(len(self)) if r not in drop]
        cols = max((self.lengths[r] for r in keep), default=0)
        self.caches = [np.ascontiguousarray(arr[keep]) if cap is not None else self._moved(arr, keep, cols)
                       for arr, cap in zip(self.caches, self.capacity)]
        self.lengths, self.cols = [self.lengths[r] for r in keep], cols

    def step_inputs(self) -> dict[str, np.ndarray]:
        """``attention_mask [B, T]`` and ``position_ids [B, 1]`` (int64) of a
        one-token step of every row."""
        lens = np.asarray(self.lengths, np.int64)
        b = len(lens)
        if self.layout == "front":
            total = int(lens.max()) + 1
            mask = (np.arange(total)[None, :] <= lens[:, None]).astype(np.int64)
        else:
            total = self.columns + 1
            mask = (np.arange(total)[None, :] >= (self.columns - lens)[:, None]).astype(np.int64)
        return {"attention_mask": mask, "position_ids": lens.reshape(b, 1).copy()}

    def advance(self, presents: list[np.ndarray]) -> None:
        """Takes a step's ``present.*`` as the batch's caches (with shared
        buffers they are the caches, written in place): every row grew by
        one token."""
        self.caches = list(presents)
        self.lengths = [n + 1 for n in self.lengths]
        self.cols += 1
        if self.shared:
            # Room for the next step's key, else a larger buffer.
            if any(cap is None and arr.shape[2] < self.cols + 1 for arr, cap in zip(self.caches, self.capacity)):
                rows = list(range(len(self)))
                self.caches = [arr if cap is not None else self._moved(arr, rows, self.cols)
                               for arr, cap in zip(self.caches, self.capacity)]
        elif self.columns != next((c.shape[2] for c, cap in zip(self.caches, self.capacity) if cap is None),
                                  self.columns):
            raise RuntimeError(f"present holds {self.caches[0].shape[2]} columns for {self.columns} tokens")
