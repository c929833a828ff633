"""What an exported attention mask means, found by running it.

transformers builds the 4-D mask [B, 1, S, T] of every layer from
attention_mask, the cache length and the new tokens, in code that changes
between versions (bool or additive, sliding windows, vmap or arange
arithmetic). Rather than match that code, the mask's subgraph is run by
ONNX Runtime on a few batches (left padding, a prompt, decode steps after
a past, and one step at the far end of the context) and compared with

    visible(b, s, t) = attention_mask[b, t] and t <= P + s
                       and (no window, or P + s - t < window)

at every real query (a pad query attends to nothing the model keeps).
When it matches, GroupQueryAttention can take the padding straight from
attention_mask, causality from its own rule and the window from its
local_window_size, and the exported mask arithmetic, which reads the past's
shape, can go: the cache may then be a buffer larger than the past.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .subgraph_run import graph_slice, slice_runner

MASK_INPUT = "attention_mask"


def _feeds(inputs: list[ir.Value], mask: np.ndarray, new: int) -> dict | None:
    """Feeds for the mask subgraph's graph inputs: `mask` [B, P + new]."""
    b, total = mask.shape
    past = total - new
    feeds = {}
    for value in inputs:
        name = value.name or ""
        if name == MASK_INPUT:
            feeds[name] = mask.astype(np.int64)
        elif name == "input_ids":
            feeds[name] = np.ones((b, new), np.int64)
        elif name == "position_ids":
            pos = np.cumsum(mask, 1) - 1
            feeds[name] = np.where(mask == 0, 1, pos)[:, past:].astype(np.int64)
        elif name.startswith("past_key_values."):
            # Only its length matters to a mask; one head of one element
            # keeps a probe at the far end of a long context small (the
            # subgraph's inputs carry no declared shape).
            feeds[name] = np.zeros((b, 1, past, 1), np.float32)
        else:
            return None
    return feeds


def _visible(out: np.ndarray, kind: str) -> np.ndarray:
    """[B, S, T] bool from the exported mask (bool, or additive 0 / very negative)."""
    out = out[:, 0]
    return out.astype(bool) if kind == "bool" else out > np.finfo(np.float32).min / 2


def _expected(mask: np.ndarray, new: int, window: int | None) -> np.ndarray:
    b, total = mask.shape
    past = total - new
    q = past + np.arange(new)[:, None]
    t = np.arange(total)[None, :]
    causal = (t <= q) & ((q - t < window) if window else True)
    return mask.astype(bool)[:, None, :] & causal[None]


def window_of(model: ir.Model, mask_value: ir.Value, kind: str, positions: int) -> tuple[bool, int | None]:
    """(True, window or None) when the exported mask is key padding & causal
    [& a sliding window] for contexts up to `positions`; (False, None) when
    it is anything else or cannot be run alone."""
    found = graph_slice(model.graph, [mask_value])
    if found is None:
        return False, None
    nodes, inputs = found
    if MASK_INPUT not in {v.name for v in inputs}:
        return False, None
    try:
        run = slice_runner(model, nodes, inputs, [mask_value])
        # The far end: one new token after positions - 1, no padding. Its
        # visible keys are the window (or all of them).
        far = np.ones((1, positions), np.int64)
        feeds = _feeds(list(inputs), far, 1)
        if feeds is None:
            return False, None
        seen = int(_visible(run(feeds)[0], kind)[0, 0].sum())
        window = None if seen == positions else seen
        cases = [far]
        for past, new, pads in ((0, 6, 2), (5, 1, 3), (5, 3, 1), (9, 1, 0)):
            mask = np.ones((2, past + new), np.int64)
            mask[1, :pads] = 0
            cases.append((mask, new))
        for case in cases[1:] + [(far, 1)]:
            mask, new = case
            feeds = _feeds(list(inputs), mask, new)
            got = _visible(run(feeds)[0], kind)
            want = _expected(mask, new, window)
            real = mask[:, mask.shape[1] - new:].astype(bool)  # real query rows
            if got.shape != want.shape or not np.array_equal(got[real], want[real]):
                return False, None
    except Exception:  # noqa: BLE001 - a mask ORT cannot run alone keeps the exported form
        return False, None
    return True, window
