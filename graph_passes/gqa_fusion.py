"""GQA fusion: each layer's exported attention becomes one
``com.microsoft::GroupQueryAttention`` node.

What optimum's TorchScript export gives per layer (k/v the same, with Nkv
heads)::

    X_q [B,S,N,D] -> Transpose(0,2,1,3) -> x*cos + rotate_half(x)*sin -> Mul(c)
    present.i.key   = Concat(past_key_values.i.key, rotated k)        (BNSH)
    present.i.value = Concat(past_key_values.i.value, Transpose(X_v))
    repeat_kv       = Unsqueeze(2) -> Expand(n_rep) -> Reshape [B,N,T,D]
    scores = MatMul(q*c, K^T*c) + Where(mask, 0, -inf) -> Softmax
             -> Where(IsNaN, 0, .) -> MatMul(V) -> Transpose -> Reshape [B,S,N*D]
    (c may be computed from Shape(q); the mask may be an additive float one;
    gpt-oss rotates in the chunked form of rotary.py and adds a per-head sink
    logit to the softmax: Concat(scores, sinks) -> Softmax -> Slice(0:-1))

What it becomes::

    Reshape [B,S,heads*D] -> RotaryEmbedding(position_ids, cos/sin caches)
        (or the same elementwise rotary in [B,S,heads,D], then Reshape)
    GroupQueryAttention(q, k, v, past_key, past_value, seqlens_k,
        total_sequence_length, attention_bias = Where(mask, 0, lowest)
        [, head_sink = sinks])
        -> present.i.key / present.i.value (same names, same BNSH layout,
           length past + S like the Concat)
    output * (row has a visible key)   (the unfused graph's NaN -> 0)

Why this construction keeps left-padded batches exact:

* Every row is given the full length: seqlens_k = past + S - 1 for all
  rows, so GQA appends the new keys at column `past` of each row, exactly
  where Concat puts them, and its causal limit (key j <= past + s) is the
  one the exported mask already contains.
* Padding lives only in the graph's own boolean mask, passed as an additive
  attention_bias. The fill is the lowest finite float, not -inf, so no
  kernel can turn a row that sees nothing (a left-pad query) into NaN; the
  row factor then makes that row 0, as the unfused IsNaN/Where does,
  whatever the kernel computes for it (ORT's CPU EP already gives 0 there).
* Some exports (older transformers mask code, e.g. Qwen2-MoE's) add a float
  mask (0 / lowest) instead: it goes in as attention_bias unchanged. Real
  query rows are then exact as above; a pad query row, which that export
  lets attend to every key (later ones too), gets a causal average instead.
  No real token ever reads a pad position (its bias is lowest), so logits
  and cache agree at every real position.
* Rotary stays outside GQA, driven by the exported cos/sin (from
  position_ids). ONNX Runtime's CPU GroupQueryAttention (checked on 1.32)
  rotates a first prompt at positions 0..S-1 whatever position_ids says,
  so a left-padded row would store keys rotated at shifted positions and
  every later decode step would read them wrong. Rotary inside the op is
  therefore never emitted. Given the number of positions
  (``rotary_positions``), q and k are each rotated by one
  com.microsoft::RotaryEmbedding node that reads position_ids per token,
  from cos/sin caches holding the export's own values (rotary_cache.py);
  otherwise the elementwise rotary is rebuilt in [B,S,heads,D] so no
  transposes remain.
* The lengths, the attention bias and the row factor below are built once
  for all layers that read the same mask with the same past length.

Limits: float32 attention only; a step with past context and S > 1 new
tokens needs batch 1 on ONNX Runtime's CPU GroupQueryAttention (prefill and
one-token decode, what generate() does, work for any batch).

Anything that differs from the pattern (no rotary, a different repeat_kv,
another mask form, an intermediate used elsewhere ...) leaves the layer
unfused with the reason in the report.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from . import mask_semantics, rotary, rotary_cache
from .gqa_masks import MaskInputs
from .graph_walk import const_array
from .match_helpers import (NoMatch, check_axis, check_transpose, float_scalar, ints,
                            only_consumer, producer, scalar)
from .report import PassReport
from .shape_values import Dim, dims_of

NAME = "gqa"
# Model metadata a runner reads: past and present may be one buffer.
SHARE_BUFFER_KEY = "hinamoe.past_present_share_buffer"


@dataclasses.dataclass
class _Site:
    """One layer's attention, as matched."""

    where: str
    x_q: ir.Value  # [B, S, N, D], before rotary (after q_norm if any)
    x_k: ir.Value  # [B, S, Nkv, D]
    x_v: ir.Value  # [B, S, Nkv, D]
    cos: ir.Value  # [B, S, D], what the exported rotary unsqueezes at axis 1
    sin: ir.Value
    past_k: ir.Value
    past_v: ir.Value
    present_k: ir.Value  # graph outputs the fused node must produce
    present_v: ir.Value
    mask: ir.Value  # [B, 1, S, >= T] before the per-layer slice
    mask_kind: str  # "bool" (True = visible) or "additive" (0 / huge negative)
    sinks: np.ndarray | None  # [N] per-head sink logits (gpt-oss) or None
    rotary_form: str  # see rotary.py
    out: ir.Value  # attention output [B, S, N*D] (o_proj's input)
    num_heads: int
    kv_num_heads: int
    head_dim: int
    scale: float
    dtype: ir.DataType


def _match_repeat_kv(present: ir.Value, kv_heads: int, head_dim: int, what: str):
    """present -> Unsqueeze(2) -> Expand([.., .., n_rep, .., ..]) -> Reshape
    [B, Nkv*n_rep, T, D]. Returns (repeated value, n_rep)."""
    unsq = only_consumer(present, f"{what} cache")
    if unsq.op_type != "Unsqueeze" or ints(unsq.inputs[1], {}, f"{what} repeat_kv axes") != [2]:
        raise NoMatch(f"{what} repeat_kv: expected Unsqueeze(axis 2), got {unsq.op_type}")
    expand = only_consumer(unsq.outputs[0], f"{what} repeat_kv")
    if expand.op_type != "Expand":
        raise NoMatch(f"{what} repeat_kv: expected Expand, got {expand.op_type}")
    target = ints(expand.inputs[1], {}, f"{what} repeat_kv Expand shape")
    if len(target) != 5 or not isinstance(target[2], int) or target[2] < 1:
        raise NoMatch(f"{what} repeat_kv: Expand shape {target} has no repeat count")
    if target[1] != kv_heads or target[4] != head_dim:
        raise NoMatch(f"{what} repeat_kv: Expand shape {target} is not [B, {kv_heads}, n_rep, T, {head_dim}]")
    n_rep = target[2]
    reshape = only_consumer(expand.outputs[0], f"{what} repeat_kv")
    if reshape.op_type != "Reshape":
        raise NoMatch(f"{what} repeat_kv: expected Reshape, got {reshape.op_type}")
    shape = ints(reshape.inputs[1], {}, f"{what} repeat_kv Reshape shape")
    pdims = dims_of(present) or []
    if (len(shape) != 4 or shape[1] != kv_heads * n_rep or shape[3] not in (head_dim, -1)
            or (len(pdims) == 4 and (shape[0] != pdims[0] or shape[2] != pdims[2]))):
        raise NoMatch(f"{what} repeat_kv: Reshape to {shape}, expected [B, {kv_heads * n_rep}, T, {head_dim}]")
    return reshape.outputs[0], n_rep


def _match_cache(past: ir.Value, what: str) -> ir.Node:
    concat = only_consumer(past, f"{what} past")
    if concat.op_type != "Concat" or len(concat.inputs) != 2 or concat.inputs[0] is not past:
        raise NoMatch(f"{what}: past is not the first input of a 2-way Concat")
    check_axis(concat.attributes.get_int("axis"), 4, 2, f"{what} cache Concat")
    if not concat.outputs[0].is_graph_output():
        raise NoMatch(f"{what}: the cache Concat is not a graph output")
    return concat


def _layer_name(node: ir.Node, fallback: str) -> str:
    m = re.match(r"/?(.*?)/self_attn/", node.name or "")
    return m.group(1).replace("/", ".") + ".self_attn" if m else fallback


def _match_layer(past_k: ir.Value, past_v: ir.Value, where: str) -> _Site:
    kdims, vdims = dims_of(past_k), dims_of(past_v)
    if kdims is None or len(kdims) != 4 or not isinstance(kdims[1], int) or not isinstance(kdims[3], int):
        raise NoMatch(f"{past_k.name}: needs a static [B, kv_heads, T, head_dim] shape, has {kdims}")
    if vdims is None or len(vdims) != 4 or vdims[1] != kdims[1] or vdims[3] != kdims[3]:
        raise NoMatch(f"{past_v.name}: shape {vdims} differs from {past_k.name} {kdims}")
    if past_k.dtype != ir.DataType.FLOAT or past_v.dtype != past_k.dtype:
        # fp16 would need its own care (lowest + score overflows to -inf).
        raise NoMatch(f"{past_k.name}: dtype {past_k.dtype}; the pass fuses float32 attention only")
    nkv, d = kdims[1], kdims[3]
    if d % 2:
        raise NoMatch(f"head_dim {d} is odd")

    k_cat = _match_cache(past_k, "key")
    v_cat = _match_cache(past_v, "value")
    present_k, present_v = k_cat.outputs[0], v_cat.outputs[0]

    k_rep, n_rep = _match_repeat_kv(present_k, nkv, d, "key")
    v_rep, n_rep_v = _match_repeat_kv(present_v, nkv, d, "value")
    if n_rep != n_rep_v:
        raise NoMatch(f"repeat_kv: keys repeated {n_rep}x, values {n_rep_v}x")
    n = nkv * n_rep

    # Scores: MatMul(q [* c], Transpose(K_rep) [* c]) [* c | / c]. The
    # constants may be computed from the head dim (Shape of q), so they are
    # evaluated once q and K^T are known.
    kt = only_consumer(k_rep, "repeated key")
    if kt.op_type != "Transpose":
        raise NoMatch(f"repeated key: expected Transpose to K^T, got {kt.op_type}")
    check_transpose(kt, [0, 1, 3, 2], "K^T")
    k_side = k_scaled = kt.outputs[0]
    node = only_consumer(k_side, "K^T")
    k_mul = None
    if node.op_type == "Mul":
        k_mul, k_scaled = node, node.outputs[0]
        node = only_consumer(k_scaled, "scaled K^T")
    if node.op_type != "MatMul" or node.inputs[1] is not k_scaled:
        raise NoMatch(f"K^T: expected MatMul(q, K^T), got {node.op_type}")
    qk = node
    q_side = qk.inputs[0]
    q_mul = q_side.producer()
    if q_mul is not None and q_mul.op_type == "Mul":
        q_side = q_mul.inputs[0]
    else:
        q_mul = None
    qk_dims = {q_side: [Dim("B", 0), n, Dim("S", 0), d], k_side: [Dim("B", 0), n, d, Dim("T", 0)]}
    scale = 1.0
    for mul, base, what in ((q_mul, q_side, "q"), (k_mul, k_side, "K^T")):
        if mul is None:
            continue
        c = float_scalar(mul.inputs[1] if mul.inputs[0] is base else mul.inputs[0], qk_dims)
        if c is None:
            raise NoMatch(f"{what} is multiplied by a non-constant")
        scale *= c
    scores = qk.outputs[0]
    node = only_consumer(scores, "scores")
    if node.op_type in ("Mul", "Div"):
        c = float_scalar(node.inputs[1], qk_dims)
        if c is None or node.inputs[0] is not scores:
            raise NoMatch(f"scores: {node.op_type} by a non-constant")
        scale = scale * c if node.op_type == "Mul" else scale / c
        scores = node.outputs[0]
        node = only_consumer(scores, "scaled scores")

    # Mask: Add(scores, Where(Slice(bool mask), 0, -inf)) or, from older
    # mask code, Add(scores, Slice(float mask)) holding 0 / a huge negative.
    if node.op_type != "Add":
        raise NoMatch(f"scores: expected Add(mask), got {node.op_type}")
    bias = node.inputs[1] if node.inputs[0] is scores else node.inputs[0]
    fill = bias.producer()
    if fill is not None and fill.op_type == "Where":
        if scalar(fill.inputs[1]) != 0.0 or scalar(fill.inputs[2]) != float("-inf"):
            raise NoMatch("attention mask: Where(mask, a, b) with (a, b) != (0, -inf)")
        mask_kind, sliced = "bool", fill.inputs[0]
    else:
        mask_kind, sliced = "additive", bias
    sl = producer(sliced, "Slice", f"{mask_kind} attention mask")
    sl_ins = list(sl.inputs) + [None] * (5 - len(sl.inputs))
    if (ints(sl_ins[1], {}, "mask slice start") != [0]
            or sl_ins[3] is None or ints(sl_ins[3], {}, "mask slice axes") not in ([3], [-1])
            or (sl_ins[4] is not None and ints(sl_ins[4], {}, "mask slice steps") != [1])):
        raise NoMatch(f"{mask_kind} attention mask: not sliced [0:T] on the key axis")
    mask = sl.inputs[0]

    soft = only_consumer(node.outputs[0], "masked scores")
    sinks = None
    if soft.op_type == "Concat":
        sinks, soft = _match_sinks(soft, node.outputs[0], n)
    if soft.op_type != "Softmax":
        raise NoMatch(f"masked scores: expected Softmax, got {soft.op_type}")
    check_axis(soft.attributes.get_int("axis", -1), 4, 3, "Softmax")
    probs = soft.outputs[0]
    if sinks is not None:
        probs = _drop_sink_column(probs)
    users = {u.node for u in probs.uses()}
    isnan = [u for u in users if u.op_type == "IsNaN"]
    if isnan:
        # Where(IsNaN(p), 0, p): a row with no visible key gives 0.
        wh = only_consumer(isnan[0].outputs[0], "IsNaN")
        if (wh.op_type != "Where" or wh.inputs[2] is not probs or scalar(wh.inputs[1]) != 0.0
                or len(users) != 2 or wh not in users):
            raise NoMatch("softmax: IsNaN guard is not Where(IsNaN(p), 0, p)")
        probs = wh.outputs[0]
    pv = only_consumer(probs, "probabilities")
    if pv.op_type != "MatMul" or pv.inputs[0] is not probs or pv.inputs[1] is not v_rep:
        raise NoMatch(f"probabilities: expected MatMul(p, repeated V), got {pv.op_type}")
    tr = only_consumer(pv.outputs[0], "attention BNSH")
    if tr.op_type != "Transpose":
        raise NoMatch(f"attention output: expected Transpose, got {tr.op_type}")
    check_transpose(tr, [0, 2, 1, 3], "attention output to BSNH")
    rs = only_consumer(tr.outputs[0], "attention BSNH")
    if rs.op_type != "Reshape":
        raise NoMatch(f"attention output: expected Reshape to [B, S, N*D], got {rs.op_type}")
    target = ints(rs.inputs[1], {}, "attention output Reshape shape")
    if len(target) != 3 or target[2] not in (-1, n * d):
        raise NoMatch(f"attention output: Reshape to {target}, expected [B, S, {n * d}]")

    # Rotary on q and on the new keys; values go in unrotated.
    rot_q = rotary.match(q_side, d, n, "query")
    rot_k = rotary.match(k_cat.inputs[1], d, nkv, "key")
    if rot_q.cos is not rot_k.cos or rot_q.sin is not rot_k.sin or rot_q.form != rot_k.form:
        raise NoMatch("rotary: query and key use different cos/sin or forms")
    v_tr = producer(v_cat.inputs[1], "Transpose", "new values")
    check_transpose(v_tr, [0, 2, 1, 3], "values to BNSH")

    # The fused graph no longer computes the rotated BNSH q/k; anything else
    # reading them would be left dangling on the unfused path.
    for val, what in ((q_side, "rotated query"), (k_cat.inputs[1], "rotated key")):
        extra = {u.node.op_type for u in val.uses()} - {"MatMul", "Concat", "Mul", "Shape"}
        if extra:
            raise NoMatch(f"{what} is also read by {sorted(extra)}")

    return _Site(where=where, x_q=rot_q.x, x_k=rot_k.x, x_v=v_tr.inputs[0], cos=rot_q.cos, sin=rot_q.sin,
                 rotary_form=rot_q.form, past_k=past_k, past_v=past_v, present_k=present_k,
                 present_v=present_v, mask=mask, mask_kind=mask_kind, sinks=sinks, out=rs.outputs[0],
                 num_heads=n, kv_num_heads=nkv, head_dim=d, scale=scale, dtype=past_k.dtype)


def _match_sinks(concat: ir.Node, masked: ir.Value, heads: int):
    """gpt-oss: Concat(masked scores, Expand(sinks [1, N, 1, 1])) on the key
    axis, optionally minus its row max, into Softmax. Returns (sinks [N],
    the Softmax node)."""
    check_axis(concat.attributes.get_int("axis"), 4, 3, "attention sinks Concat")
    if len(concat.inputs) != 2 or concat.inputs[0] is not masked:
        raise NoMatch("masked scores: Concat that is not (scores, sinks)")
    expand = producer(concat.inputs[1], "Expand", "attention sinks")
    sinks = const_array(expand.inputs[0])
    if sinks is None or sinks.size != heads or sinks.shape not in ((1, heads, 1, 1), (heads, 1, 1)):
        raise NoMatch(f"attention sinks: not a constant of {heads} per-head logits")
    joined = concat.outputs[0]
    users = {u.node for u in joined.uses() if u.node.op_type != "Shape"}
    sub = next((u for u in users if u.op_type == "Sub"), None)
    if sub is not None:
        # x - max(x) before Softmax changes nothing but rounding.
        rmax = sub.inputs[1].producer()
        if (sub.inputs[0] is not joined or rmax is None or rmax.op_type != "ReduceMax"
                or rmax.inputs[0] is not joined or users != {sub, rmax}
                or rmax.attributes.get_int("keepdims", 1) != 1
                or ints(rmax.inputs[1], {}, "sinks ReduceMax axes")[0] not in (3, -1)):
            raise NoMatch("attention sinks: not Softmax(x - ReduceMax(x)) over the keys")
        joined = sub.outputs[0]
    soft = only_consumer(joined, "scores with sinks")
    return sinks.reshape(heads).astype(np.float32), soft


def _drop_sink_column(probs: ir.Value) -> ir.Value:
    """[Cast to float ->] Slice(p, 0, -1) on the key axis: the sink's share
    leaves the denominator only."""
    node = only_consumer(probs, "probabilities with sinks")
    if node.op_type == "Cast" and node.attributes.get_int("to") == ir.DataType.FLOAT:
        probs = node.outputs[0]
        node = only_consumer(probs, "probabilities with sinks")
    if node.op_type != "Slice":
        raise NoMatch(f"probabilities with sinks: expected Slice dropping the sink, got {node.op_type}")
    arg = list(node.inputs) + [None] * (5 - len(node.inputs))
    if (ints(arg[1], {}, "sink slice start") != [0] or ints(arg[2], {}, "sink slice end") != [-1]
            or arg[3] is None or ints(arg[3], {}, "sink slice axes")[0] not in (3, -1)
            or (arg[4] is not None and ints(arg[4], {}, "sink slice steps") != [1])):
        raise NoMatch("probabilities with sinks: the Slice does not drop exactly the sink column")
    return node.outputs[0]


# ------------------------------------------------------------------ rewriting


class _Builder(MaskInputs):
    """Creates the fused nodes, sharing constants and the per-model rotary
    broadcast (cos/sin unsqueezed for [B, S, heads, D]) across layers."""

    def __init__(self, model: ir.Model, rotary_positions: int | None):
        self.model = model
        self.graph = model.graph
        self.rotary_positions = rotary_positions
        self.caches: dict[tuple, tuple | None] = {}
        self.forms: dict[tuple, tuple[bool, int | None]] = {}
        self.graph_mask_input = next((v for v in model.graph.inputs if v.name == mask_semantics.MASK_INPUT), None)
        self.consts: dict[tuple, ir.Value] = {}
        self.bsnh: dict[ir.Value, ir.Value] = {}
        self.lengths: dict[object, tuple] = {}
        self.masks: dict[tuple, tuple] = {}
        self.padding: tuple | None = None  # from_attention_mask's values

    def const(self, array: np.ndarray, name: str) -> ir.Value:
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self.consts:
            value = ir.Value(name=f"gqa_fusion/{name}_{len(self.consts)}", const_value=ir.tensor(array))
            self.graph.register_initializer(value)
            self.consts[key] = value
        return self.consts[key]

    def cos_sin_bsnh(self, tape: ir.tape.Tape, src: ir.Value) -> ir.Value:
        if src not in self.bsnh:
            self.bsnh[src] = tape.op("Unsqueeze", [src, self.const(np.array([2], np.int64), "axes")])
        return self.bsnh[src]

    def rotary_caches(self, site: _Site):
        """(position_ids, cos cache, sin cache) as graph values for
        RotaryEmbedding, or None: without rotary_positions, or where the
        exported cos/sin are not a per-position table (rotary_cache.py)."""
        if not self.rotary_positions:
            return None
        key = (site.cos, site.sin, site.rotary_form)
        if key not in self.caches:
            found = rotary_cache.caches(self.model, site.cos, site.sin, site.rotary_form, site.head_dim,
                                        self.rotary_positions)
            if found is not None:
                position_ids, cos, sin = found
                found = (position_ids, self._initializer(cos, "cos_cache"), self._initializer(sin, "sin_cache"))
            self.caches[key] = found
        return self.caches[key]

    def _initializer(self, array: np.ndarray, name: str) -> ir.Value:
        value = ir.Value(name=f"gqa_fusion/{name}_{len(self.caches)}", const_value=ir.tensor(array))
        self.graph.register_initializer(value)
        return value


def _fuse(graph: ir.Graph, b: _Builder, site: _Site) -> dict:
    i64 = lambda *xs: np.array(xs, np.int64)  # noqa: E731
    tape = ir.tape.Tape()
    flat = b.const(i64(0, 0, -1), "bsd")
    cached = b.rotary_caches(site)
    if cached is not None:
        position_ids, cos_cache, sin_cache = cached
        q, k = (tape.op("RotaryEmbedding", [tape.op("Reshape", [x, flat]), position_ids, cos_cache, sin_cache],
                        {"interleaved": 0}, domain="com.microsoft") for x in (site.x_q, site.x_k))
    else:
        cos = b.cos_sin_bsnh(tape, site.cos)
        sin = b.cos_sin_bsnh(tape, site.sin)
        halves = b.const(rotary.halves_constant(site.head_dim), "halves")
        q = tape.op("Reshape", [rotary.build(tape, halves, site.x_q, cos, sin, site.rotary_form), flat])
        k = tape.op("Reshape", [rotary.build(tape, halves, site.x_k, cos, sin, site.rotary_form), flat])
    v = tape.op("Reshape", [site.x_v, flat])

    padding, window = b.padding_form(site)
    if padding:
        seqlens, total_i32, bias, row_factor = b.from_attention_mask(tape, site, site.mask_kind == "bool")
    else:
        seqlens, total_i32, bias, row_factor = b.lengths_and_mask(tape, site)
    attrs = {"num_heads": site.num_heads, "kv_num_heads": site.kv_num_heads, "scale": float(site.scale),
             "do_rotary": 0}
    if window:
        attrs["local_window_size"] = window
    attn, present_k, present_v = tape.op_multi_out(
        "GroupQueryAttention",
        [q, k, v, site.past_k, site.past_v, seqlens, total_i32, None, None, None, bias,
         None if site.sinks is None else b.const(site.sinks, "head_sink")],
        attrs, domain="com.microsoft", num_outputs=3, name=f"{site.where}/GroupQueryAttention")
    out = attn if row_factor is None else tape.op("Mul", [attn, row_factor])

    old_out_node = site.out.producer()
    graph.insert_before(old_out_node, tape.nodes)
    dead_roots = [old_out_node, site.present_k.producer(), site.present_v.producer()]
    site.out.replace_all_uses_with(out)
    for old, new in ((site.present_k, present_k), (site.present_v, present_v)):
        name = old.name
        ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=True)
        old.name = f"{name}/unfused"
        new.name, new.type, new.shape = name, old.type, old.shape
    removed = _remove_dead(graph, dead_roots)
    return {"layer": site.where, "num_heads": site.num_heads, "kv_num_heads": site.kv_num_heads,
            "head_dim": site.head_dim, "mask": site.mask_kind, "rotary": site.rotary_form,
            "rotary_op": "RotaryEmbedding" if cached is not None else "elementwise",
            "lengths": "attention_mask" if padding else "past shape", "window": window,
            "sinks": site.sinks is not None, "nodes_removed": removed,
            "nodes_added": len(tape.nodes)}


def _remove_dead(graph: ir.Graph, roots: list[ir.Node]) -> int:
    """Removes `roots` and, transitively, their producers once nothing reads
    them (a node another part of the graph still uses stays)."""
    removed = 0
    work = list(roots)
    seen: set[ir.Node] = set()
    while work:
        node = work.pop()
        if node in seen or node.graph is not graph:
            continue
        if any(o.uses() or o.is_graph_output() for o in node.outputs):
            continue
        seen.add(node)
        inputs = [v for v in node.inputs if v is not None]
        graph.remove(node, safe=True)
        removed += 1
        work.extend(v.producer() for v in inputs if v.producer() is not None)
    return removed


# ------------------------------------------------------------------ the pass


def _kv_inputs(graph: ir.Graph) -> list[tuple[str, ir.Value, ir.Value]]:
    """(layer index, past key, past value) of optimum's KV-cache inputs."""
    by_name = {v.name: v for v in graph.inputs}
    pairs = []
    for name, value in by_name.items():
        m = re.fullmatch(r"past_key_values\.(\d+)\.key", name or "")
        if m and f"past_key_values.{m.group(1)}.value" in by_name:
            pairs.append((int(m.group(1)), value, by_name[f"past_key_values.{m.group(1)}.value"]))
    return [(str(i), k, v) for i, k, v in sorted(pairs, key=lambda p: p[0])]


def apply(model: ir.Model, *, rotary_positions: int | None = None, **options) -> PassReport:
    """Fuses every layer whose attention matches. `rotary_positions` (the
    model's max_position_embeddings) makes the rotation one RotaryEmbedding
    node per q and k with cos/sin caches of that many positions; without it
    the rotation stays elementwise. Other options are ignored."""
    report = PassReport(name=NAME)
    graph = model.graph
    builder = _Builder(model, rotary_positions)
    for index, past_k, past_v in _kv_inputs(graph):
        if any(u.node.op_type == "GroupQueryAttention" for u in past_k.uses()):
            continue  # fused already (the pass ran before)
        where = f"layer {index}"
        concat = next((u.node for u in past_k.uses() if u.node.op_type == "Concat"), None)
        if concat is not None:
            where = _layer_name(concat, where)
        try:
            site = _match_layer(past_k, past_v, where)
        except NoMatch as e:
            report.skipped.append({"where": where, "reason": str(e)})
            continue
        report.fused.append(_fuse(graph, builder, site))
    if report.fused:
        graph.sort()
        common_passes.RemoveUnusedNodesPass()(model)
        pasts = [v for v in graph.inputs if (v.name or "").startswith("past_key_values.")]
        if all(u.node.op_type == "GroupQueryAttention" for v in pasts for u in v.uses()):
            # Nothing reads the past's length any more: a runner may bind
            # each cache as past and present at once, with spare columns.
            model.metadata_props[SHARE_BUFFER_KEY] = "1"
        if "com.microsoft" not in model.opset_imports:
            model.opset_imports["com.microsoft"] = 1
    return report
