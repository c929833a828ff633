"""The cos/sin caches of an exported rotary embedding, for
``com.microsoft::RotaryEmbedding``.

An export computes cos/sin per token from position_ids (inv_freq x
position, then Cos/Sin, YaRN's scaling included) on every call, then
rotates q and k with six elementwise nodes each. RotaryEmbedding does the
rotation in one node from caches [positions, D/2] indexed by position_ids.
The caches are the export's own subgraph run once by ONNX Runtime for
positions 0..P-1, so each entry has the bits the export computes for that
position; the subgraph is checked to depend on position_ids alone and
elementwise (a batch of random positions gives the cache rows), and for
the "half" form that both halves of cos/sin are equal (rotate_half with
emb = cat(freqs, freqs)). Anything else: None, and the caller keeps the
elementwise rotary.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .subgraph_run import graph_slice, slice_runner

POSITIONS_INPUT = "position_ids"


def caches(model: ir.Model, cos: ir.Value, sin: ir.Value, form: str, head_dim: int, positions: int):
    """(position_ids value, cos cache, sin cache [positions, head_dim / 2]
    float32) for the exported cos/sin, or None where they are not a pure
    per-position function."""
    if positions < 1:
        return None
    found = graph_slice(model.graph, [cos, sin])
    if found is None:
        return None
    nodes, inputs = found
    if len(inputs) != 1 or next(iter(inputs)).name != POSITIONS_INPUT:
        return None
    (position_ids,) = inputs
    try:
        session = slice_runner(model, nodes, inputs, [cos, sin])
        run = lambda pos: session({POSITIONS_INPUT: pos})  # noqa: E731
        c, s = run(np.arange(positions, dtype=np.int64)[None, :])
        if c.dtype != np.float32 or s.dtype != np.float32:
            return None
        half = head_dim // 2
        if form == "half":
            if c.shape != (1, positions, head_dim) or s.shape != c.shape:
                return None
            if not (np.array_equal(c[..., :half], c[..., half:]) and np.array_equal(s[..., :half], s[..., half:])):
                return None
            c, s = c[..., :half], s[..., :half]
        elif c.shape != (1, positions, half) or s.shape != c.shape:
            return None
        cos_cache, sin_cache = np.ascontiguousarray(c[0]), np.ascontiguousarray(s[0])
        # Per position and elementwise: a batch of scattered positions reads the rows.
        probe = np.random.default_rng(0).integers(0, positions, size=(2, 5), dtype=np.int64)
        pc, ps = run(probe)
        if form == "half":
            pc, ps = pc[..., :half], ps[..., :half]
        if not (np.array_equal(pc, cos_cache[probe]) and np.array_equal(ps, sin_cache[probe])):
            return None
    except Exception:  # noqa: BLE001 - a subgraph ORT cannot run alone is simply not cached
        return None
    return position_ids, cos_cache, sin_cache
