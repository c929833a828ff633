"""Run an exported decoder (ORT) and its PyTorch checkpoint side by side on the
same left-padded batch: one prefill then greedy decode steps, collecting
logits and the KV cache after each step. Shared by the export tests."""

from __future__ import annotations

import numpy as np


def left_padded_batch(rng: np.random.Generator, vocab: int, lengths=(7, 4), pad_id: int = 0):
    """input_ids and attention_mask [B, max(lengths)], row b padded on the left
    to lengths[b] real (random, non-pad) tokens."""
    S = max(lengths)
    ids = np.full((len(lengths), S), pad_id, dtype=np.int64)
    mask = np.zeros((len(lengths), S), dtype=np.int64)
    for b, n in enumerate(lengths):
        ids[b, S - n:] = rng.integers(0, vocab - 50, size=n)
        mask[b, S - n:] = 1
    return ids, mask


def position_ids(mask: np.ndarray, new: int) -> np.ndarray:
    """HF's left-padding positions for the last `new` columns of `mask`
    (cumsum - 1, pad columns set to 1 as transformers' generate does)."""
    pos = np.cumsum(mask, axis=1) - 1
    pos = np.where(mask == 0, 1, pos)
    return pos[:, -new:].astype(np.int64)


def ort_steps(sess, ids, mask, decode_steps: int, tokens=None):
    """Prefill + greedy decode on an ORT session of optimum's export. Returns
    [(logits [B,S,V], {present name: array}), ...], one per step. `tokens`
    forces the decode tokens (another run's decode_tokens)."""
    past_inputs = [i for i in sess.get_inputs() if i.name.startswith("past_key_values.")]
    B = ids.shape[0]
    feeds_past = {i.name: np.zeros((B, i.shape[1], 0, i.shape[3]), dtype=np.float32)
                  for i in past_inputs}
    out_names = [o.name for o in sess.get_outputs()]
    steps = []
    cur_ids, cur_mask = ids, mask
    for step in range(decode_steps + 1):
        feeds = {"input_ids": cur_ids, "attention_mask": cur_mask,
                 "position_ids": position_ids(cur_mask, cur_ids.shape[1]), **feeds_past}
        outs = dict(zip(out_names, sess.run(None, feeds)))
        presents = {k: v for k, v in outs.items() if k.startswith("present.")}
        steps.append((outs["logits"], presents))
        feeds_past = {k.replace("present.", "past_key_values."): v for k, v in presents.items()}
        if tokens is not None and step < decode_steps:
            next_tok = tokens[step]
        else:
            next_tok = outs["logits"][:, -1].argmax(-1)[:, None].astype(np.int64)
        cur_ids = next_tok
        cur_mask = np.concatenate([cur_mask, np.ones((B, 1), dtype=np.int64)], axis=1)
    return steps


def torch_steps(model, ids, mask, decode_steps: int, tokens=None):
    """Same as ort_steps with the PyTorch model. `tokens` forces the decode
    tokens (those ORT picked), so both sides see the same inputs."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache()
    steps = []
    cur_ids, cur_mask = ids, mask
    B = ids.shape[0]
    with torch.no_grad():
        for step in range(decode_steps + 1):
            out = model(input_ids=torch.from_numpy(cur_ids), attention_mask=torch.from_numpy(cur_mask),
                        position_ids=torch.from_numpy(position_ids(cur_mask, cur_ids.shape[1])),
                        past_key_values=cache, use_cache=True)
            logits = out.logits.float().numpy()
            presents = {}
            for layer in range(len(cache.layers)):
                presents[f"present.{layer}.key"] = cache.layers[layer].keys.float().numpy().copy()
                presents[f"present.{layer}.value"] = cache.layers[layer].values.float().numpy().copy()
            steps.append((logits, presents))
            if tokens is not None and step < decode_steps:
                next_tok = tokens[step]
            else:
                next_tok = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
            cur_ids = next_tok
            cur_mask = np.concatenate([cur_mask, np.ones((B, 1), dtype=np.int64)], axis=1)
    return steps


def decode_tokens(steps):
    """The greedy token each step chose, [B, 1] per decode step."""
    return [s[0][:, -1].argmax(-1)[:, None].astype(np.int64) for s in steps[:-1]]


def compare_steps(got, want, mask, rtol: float, atol: float):
    """Asserts logits and present KV agree at every real (non-pad) position."""
    for step, ((g_logits, g_kv), (w_logits, w_kv)) in enumerate(zip(got, want)):
        if step == 0:
            real = mask.astype(bool)  # [B, S] prefill rows
            np.testing.assert_allclose(g_logits[real], w_logits[real], rtol=rtol, atol=atol,
                                       err_msg="prefill logits")
        else:
            np.testing.assert_allclose(g_logits, w_logits, rtol=rtol, atol=atol,
                                       err_msg=f"decode step {step} logits")
        assert set(g_kv) == set(w_kv), (sorted(g_kv), sorted(w_kv))
        kv_real = np.concatenate([mask, np.ones((mask.shape[0], step), dtype=mask.dtype)], 1).astype(bool)
        for name in g_kv:
            assert g_kv[name].shape == w_kv[name].shape, (name, g_kv[name].shape, w_kv[name].shape)
            # [B, kv_heads, T, d] -> compare the real positions only
            g = np.transpose(g_kv[name], (0, 2, 1, 3))[kv_real]
            w = np.transpose(w_kv[name], (0, 2, 1, 3))[kv_real]
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"step {step} {name}")
