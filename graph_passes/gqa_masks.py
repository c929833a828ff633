"""The lengths and mask inputs of the fused GroupQueryAttention nodes
(seqlens_k, total_sequence_length, attention_bias, and the factor that
zeroes pad query rows), built once and shared by the layers that can
share them. gqa_fusion's builder mixes this in: it supplies ``const``,
``model``, ``rotary_positions``, ``graph_mask_input`` and the caches
``forms``, ``lengths``, ``masks`` and ``padding``.

Two constructions:

* from attention_mask alone (``from_attention_mask``), where
  mask_semantics.py found the exported mask to be its padding, causal and
  perhaps windowed: nothing then reads the past's length;
* from the exported mask (``lengths_and_mask``), lengths from the past's
  shape plus the new tokens, the mask sliced to them as the bias.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from . import mask_semantics


class MaskInputs:
    def padding_form(self, site) -> tuple[bool, int | None]:
        """(True, sliding window or None) when `site`'s exported mask is
        attention_mask's padding & causal [& a window] (mask_semantics.py),
        so the op can take both from attention_mask; needs rotary_positions
        (the longest context the model is exported for)."""
        if not self.rotary_positions or self.graph_mask_input is None:
            return False, None
        key = (site.mask, site.mask_kind)
        if key not in self.forms:
            self.forms[key] = mask_semantics.window_of(self.model, site.mask, site.mask_kind, self.rotary_positions)
        return self.forms[key]

    def from_attention_mask(self, tape: ir.tape.Tape, site, row_factor: bool):
        """(seqlens_k, total_sequence_length, attention_bias, row factor or
        None) from attention_mask [B, T] alone, shared by every layer: T keys
        in each row (seqlens_k = T - 1; the cache may hold more columns), the
        padding as the bias [B, 1, S, T], causality from the op, and a pad
        query's row factor 0 from its own mask entry."""
        i64 = lambda *xs: np.array(xs, np.int64)  # noqa: E731
        if self.padding is None:
            am = self.graph_mask_input
            total = tape.op("Shape", [am], {"start": 1, "end": 2})
            total_i32 = tape.op("Cast", [tape.op("Squeeze", [total, self.const(i64(0), "axes")])],
                                {"to": ir.DataType.INT32})
            batch = tape.op("Shape", [am], {"start": 0, "end": 1})
            seqlens = tape.op("Expand", [tape.op("Cast", [tape.op("Sub", [total, self.const(i64(1), "one")])],
                                                 {"to": ir.DataType.INT32}), batch])
            new_len = tape.op("Shape", [site.x_k], {"start": 1, "end": 2})
            keys = tape.op("Unsqueeze", [tape.op("Cast", [am], {"to": ir.DataType.BOOL}),
                                         self.const(i64(1, 2), "axes")])
            bias = tape.op("Where", [keys, self.const(np.array(0, np.float32), "zero_f"),
                                     self.const(np.array(np.finfo(np.float32).min, np.float32), "lowest")])
            rows = tape.op("Concat", [self.const(i64(1, 1), "ones"), new_len, self.const(i64(1), "one")],
                           {"axis": 0})
            bias = tape.op("Expand", [bias, rows])
            own = tape.op("Slice", [am, tape.op("Sub", [total, new_len]), total, self.const(i64(1), "axes")])
            factor = tape.op("Unsqueeze", [tape.op("Cast", [own], {"to": site.dtype}), self.const(i64(-1), "axes")])
            self.padding = (seqlens, total_i32, bias, factor)
        seqlens, total_i32, bias, factor = self.padding
        return seqlens, total_i32, bias, factor if row_factor else None

    def lengths_and_mask(self, tape: ir.tape.Tape, site):
        """(seqlens_k, total_sequence_length, attention_bias, row factor or
        None) of `site`. The lengths are built once per past length and the
        bias once per (mask, past length): layers whose past has the same
        symbolic length (optimum names it past_sequence_length on every
        layer) share them, so they are computed once per run, not per layer."""
        past_dim = site.past_k.shape[2] if site.past_k.shape is not None else None
        same_past = past_dim if isinstance(past_dim, ir.SymbolicDim) and past_dim.value else site.past_k
        i64 = lambda *xs: np.array(xs, np.int64)  # noqa: E731
        if same_past not in self.lengths:
            # Every row holds past + S keys (padding is in the mask).
            past_len = tape.op("Shape", [site.past_k], {"start": 2, "end": 3})
            new_len = tape.op("Shape", [site.x_k], {"start": 1, "end": 2})
            total = tape.op("Add", [past_len, new_len])
            total_i32 = tape.op("Cast", [tape.op("Squeeze", [total, self.const(i64(0), "axes")])],
                                {"to": ir.DataType.INT32})
            batch = tape.op("Shape", [site.x_k], {"start": 0, "end": 1})
            seqlens = tape.op("Expand", [tape.op("Cast", [tape.op("Sub", [total, self.const(i64(1), "one")])],
                                                 {"to": ir.DataType.INT32}), batch])
            self.lengths[same_past] = (seqlens, total_i32, total)
        seqlens, total_i32, total = self.lengths[same_past]
        key = (site.mask, site.mask_kind, same_past)
        if key not in self.masks:
            # Padding: the exported mask [B, 1, S, T] as an additive bias.
            mask = tape.op("Slice", [site.mask, self.const(i64(0), "zero"), total, self.const(i64(3), "axes")])
            row_factor = None
            if site.mask_kind == "bool":
                bias = tape.op("Where", [mask, self.const(np.array(0, np.float32), "zero_f"),
                                         self.const(np.array(np.finfo(np.float32).min, np.float32), "lowest")])
                visible = tape.op("ReduceMax", [tape.op("Cast", [mask], {"to": site.dtype}),
                                                self.const(i64(1, 3), "axes")], {"keepdims": 0})
                row_factor = tape.op("Unsqueeze", [visible, self.const(i64(-1), "axes")])
            else:
                bias = mask
            self.masks[key] = (bias, row_factor)
        return (seqlens, total_i32) + self.masks[key]
