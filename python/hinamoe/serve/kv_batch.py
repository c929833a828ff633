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

A cache with a fixed capacity is a ring (a sliding-window layer whose
GroupQueryAttention evicts inside it, ``sliding_window_cache=1``): each row
keeps its own ring, rows are only stacked and dropped.
"""

from __future__ import annotations

import numpy as np

LAYOUTS = ("front", "back")


class KVBatch:
    def __init__(self, layout: str, layers: int, kv_heads: int, head_dim: int, dtype=np.float32,
                 capacity: list[int | None] | None = None):
        """``capacity``: per cache (2 per layer), None for a growing cache or
        the ring's fixed size."""
        if layout not in LAYOUTS:
            raise ValueError(f"KV layout {layout!r}: one of {LAYOUTS}")
        self.layout, self.layers = layout, layers
        self.kv_heads, self.head_dim, self.dtype = kv_heads, head_dim, np.dtype(dtype)
        self.capacity = list(capacity) if capacity is not None else [None] * (2 * layers)
        self.lengths: list[int] = []
        self.caches: list[np.ndarray] = [self._empty(0, c or 0) for c in self.capacity]

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def columns(self) -> int:
        """Columns of the growing caches."""
        return next((c.shape[2] for c, cap in zip(self.caches, self.capacity) if cap is None), 0)

    def _empty(self, rows: int, columns: int) -> np.ndarray:
        return np.zeros((rows, self.kv_heads, columns, self.head_dim), self.dtype)

    def _place(self, dst: np.ndarray, src: np.ndarray, length: int) -> None:
        """Copies a row's ``length`` tokens from ``src [Nkv, L, d]`` into ``dst``."""
        if self.layout == "front":
            dst[:, :length] = src[:, :length]
        else:
            dst[:, dst.shape[1] - length:] = src[:, src.shape[1] - length:]

    def add(self, caches: list[np.ndarray], length: int) -> int:
        """Appends a sequence whose ``caches`` (2 per layer, ``[1, Nkv, L, d]``
        holding its ``length`` tokens where the layout puts them) come from its
        own prefill; returns its row."""
        if len(caches) != len(self.caches):
            raise ValueError(f"{len(caches)} caches for a batch of {len(self.caches)}")
        cols = max(self.columns, length)
        grown = []
        for old, new, cap in zip(self.caches, caches, self.capacity):
            if cap is not None:
                grown.append(np.concatenate([old, new]))
                continue
            arr = self._empty(len(self) + 1, cols)
            for r, n in enumerate(self.lengths):
                self._place(arr[r], old[r], n)
            self._place(arr[-1], new[0], length)
            grown.append(arr)
        self.caches = grown
        self.lengths.append(length)
        return len(self) - 1

    def remove(self, rows: list[int]) -> None:
        """Drops ``rows``; the others keep their order."""
        drop = set(rows)
        keep = [r for r in range(len(self)) if r not in drop]
        lengths = [self.lengths[r] for r in keep]
        cols = max(lengths, default=0)
        out = []
        for arr, cap in zip(self.caches, self.capacity):
            arr = arr[keep]
            if cap is None:
                arr = arr[:, :, :cols] if self.layout == "front" else arr[:, :, arr.shape[2] - cols:]
            out.append(np.ascontiguousarray(arr))
        self.caches, self.lengths = out, lengths

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
        """Takes a step's ``present.*`` as the batch's caches: every row grew
        by one token."""
        self.caches = list(presents)
        self.lengths = [n + 1 for n in self.lengths]
        if self.layout == "front" and self.columns < max(self.lengths):
            raise RuntimeError(f"present holds {self.columns} columns for a row of {max(self.lengths)} tokens")
