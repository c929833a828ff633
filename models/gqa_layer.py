"""Build single-node ``com.microsoft::GroupQueryAttention`` ONNX models and
run them the way onnxruntime-genai does (KV cache shared between past and
present through IOBinding).

    cfg = GQAConfig(num_heads=32, kv_num_heads=4, head_dim=128, do_rotary=True)
    model = build_gqa_model(cfg)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=[...])
    cache = KVCache.empty(cfg, batch=1, capacity=4096)
    out = run_gqa_shared(sess, cfg, cache, q, k, v, seqlens_k, total)

Every tensor is a graph input (dynamic dims), so one model serves prefill
and decode at any context. Layouts (ORT's): query ``[B, S, N*d]`` or packed
``[B, S, (N + 2*Nkv)*d]``, key/value ``[B, S, Nkv*d]``, past/present
``[B, Nkv, capacity, d]`` (BNSH), seqlens_k ``[B]`` int32 (tokens - 1),
total_sequence_length a scalar int32, cos/sin ``[positions, R/2]``,
position_ids ``[B, S]`` int64, attention_bias ``[B|1, N|1, S, total]``,
head_sink ``[N]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper

from .moe_layer import MS_DOMAIN, canon_dtype, np_dtype, onnx_dtype
from .moe_layer import _ortvalue as ortvalue  # bfloat16-aware (plain numpy binding cannot take it)

# Input names in the op's order (index = ONNX input position).
GQA_INPUTS = ("query", "key", "value", "past_key", "past_value", "seqlens_k",
              "total_sequence_length", "cos_cache", "sin_cache", "position_ids",
              "attention_bias", "head_sink", "k_scale", "v_scale", "q_norm_weight",
              "k_norm_weight", "query_seqlens")
GQA_OUTPUTS = ("output", "present_key", "present_value", "output_qk")


@dataclass
class GQAConfig:
    num_heads: int
    kv_num_heads: int
    head_dim: int
    dtype: str = "float32"
    packed: bool = False              # query carries Q, K and V; key/value absent
    with_past: bool = True            # past_key/past_value inputs
    with_present: bool = True         # present_key/present_value outputs
    do_rotary: bool = False
    rotary_interleaved: bool = False
    rotary_dim: int = 0               # R (<= head_dim); 0 means head_dim
    position_ids: bool = False        # position_ids input
    attention_bias: bool = False      # attention_bias input
    bias_broadcast_batch: bool = False  # bias dim 0 is 1
    bias_broadcast_heads: bool = False  # bias dim 1 is 1
    head_sink: bool = False           # head_sink input
    smooth_softmax: bool = False
    local_window_size: int = -1
    softcap: float = 0.0
    scale: float = 0.0                # 0: attribute absent (1/sqrt(d))
    extra_attrs: dict = field(default_factory=dict)   # e.g. unsupported ones, for tests
    extra_inputs: tuple = ()          # names from GQA_INPUTS[12:] to add (unsupported ones)
    output_qk: bool = False           # request output 3 (unsupported by HinaMoE)

    def __post_init__(self) -> None:
        self.dtype = canon_dtype(self.dtype)

    @property
    def group(self) -> int:
        return self.num_heads // self.kv_num_heads

    @property
    def rdim(self) -> int:
        return self.rotary_dim or self.head_dim

    def attributes(self) -> dict:
        a = {"num_heads": self.num_heads, "kv_num_heads": self.kv_num_heads}
        if self.do_rotary:
            a["do_rotary"] = 1
            a["rotary_interleaved"] = int(self.rotary_interleaved)
        if self.smooth_softmax:
            a["smooth_softmax"] = 1
        if self.local_window_size != -1:
            a["local_window_size"] = self.local_window_size
        if self.softcap:
            a["softcap"] = float(self.softcap)
        if self.scale:
            a["scale"] = float(self.scale)
        a.update(self.extra_attrs)
        return a

    def describe(self) -> str:
        parts = [f"N={self.num_heads}", f"Nkv={self.kv_num_heads}", f"d={self.head_dim}", self.dtype]
        for name in ("packed", "do_rotary", "rotary_interleaved", "position_ids", "attention_bias",
                     "head_sink", "smooth_softmax"):
            if getattr(self, name):
                parts.append(name)
        if self.do_rotary and self.rdim != self.head_dim:
            parts.append(f"R={self.rdim}")
        if self.local_window_size != -1:
            parts.append(f"window={self.local_window_size}")
        if self.softcap:
            parts.append(f"softcap={self.softcap:g}")
        if self.scale:
            parts.append(f"scale={self.scale:g}")
        if not self.with_past:
            parts.append("no past")
        return " ".join(parts)

    def to_dict(self) -> dict:
        return asdict(self)


def build_gqa_model(cfg: GQAConfig, name: str = "gqa") -> onnx.ModelProto:
    """A one-node GroupQueryAttention model; every tensor is a graph input."""
    et = onnx_dtype(cfg.dtype)
    n, nkv, d = cfg.num_heads, cfg.kv_num_heads, cfg.head_dim
    q_width = (n + 2 * nkv) * d if cfg.packed else n * d
    vi = helper.make_tensor_value_info
    present = set()
    present.add("query")
    graph_inputs = [vi("query", et, ["batch", "seq", q_width])]
    if not cfg.packed:
        present.update(("key", "value"))
        graph_inputs += [vi("key", et, ["batch", "seq", nkv * d]),
                         vi("value", et, ["batch", "seq", nkv * d])]
    if cfg.with_past:
        present.update(("past_key", "past_value"))
        graph_inputs += [vi("past_key", et, ["batch", nkv, "past_seq", d]),
                         vi("past_value", et, ["batch", nkv, "past_seq", d])]
    present.update(("seqlens_k", "total_sequence_length"))
    graph_inputs += [vi("seqlens_k", TensorProto.INT32, ["batch"]),
                     vi("total_sequence_length", TensorProto.INT32, [])]
    if cfg.do_rotary:
        present.update(("cos_cache", "sin_cache"))
        graph_inputs += [vi("cos_cache", et, ["positions", cfg.rdim // 2]),
                         vi("sin_cache", et, ["positions", cfg.rdim // 2])]
    if cfg.position_ids:
        present.add("position_ids")
        graph_inputs.append(vi("position_ids", TensorProto.INT64, ["batch", "seq"]))
    if cfg.attention_bias:
        present.add("attention_bias")
        graph_inputs.append(vi("attention_bias", et,
                               [1 if cfg.bias_broadcast_batch else "batch",
                                1 if cfg.bias_broadcast_heads else n, "seq", "total"]))
    if cfg.head_sink:
        present.add("head_sink")
        graph_inputs.append(vi("head_sink", et, [n]))
    for extra in cfg.extra_inputs:
        present.add(extra)
        if extra == "query_seqlens":
            graph_inputs.append(vi(extra, TensorProto.INT32, ["batch"]))
        elif extra in ("k_scale", "v_scale"):
            graph_inputs.append(vi(extra, TensorProto.FLOAT, [1]))
        else:
            graph_inputs.append(vi(extra, et, [d]))

    last = max(GQA_INPUTS.index(x) for x in present)
    node_inputs = [x if x in present else "" for x in GQA_INPUTS[:last + 1]]
    outputs = [vi("output", et, ["batch", "seq", n * d])]
    node_outputs = ["output"]
    if cfg.with_present or cfg.output_qk:
        node_outputs += ["present_key", "present_value"]
        outputs += [vi("present_key", et, ["batch", nkv, "present_seq", d]),
                    vi("present_value", et, ["batch", nkv, "present_seq", d])]
    if cfg.output_qk:
        node_outputs.append("output_qk")
        outputs.append(vi("output_qk", et, ["batch", n, "seq", "total"]))

    node = helper.make_node("GroupQueryAttention", node_inputs, node_outputs, name=name,
                            domain=MS_DOMAIN, **cfg.attributes())
    graph = helper.make_graph([node], name, graph_inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS_DOMAIN, 1)],
                              producer_name="hinamoe.models.gqa_layer")
    model.ir_version = 8
    return model


# ---------------------------------------------------------------- inputs


def rotary_caches(positions: int, rotary_dim: int, dtype="float32", base: float = 10000.0):
    """cos/sin caches ``[positions, R/2]`` as in RoPE (theta_i = base^(-2i/R))."""
    inv = base ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    ang = np.arange(positions, dtype=np.float64)[:, None] * inv[None, :]
    dt = np_dtype(dtype)
    return np.cos(ang).astype(dt), np.sin(ang).astype(dt)


@dataclass
class GQAStep:
    """The inputs of one call (numpy arrays; None where absent)."""
    query: np.ndarray
    key: np.ndarray | None
    value: np.ndarray | None
    seqlens_k: np.ndarray
    total_sequence_length: int
    cos_cache: np.ndarray | None = None
    sin_cache: np.ndarray | None = None
    position_ids: np.ndarray | None = None
    attention_bias: np.ndarray | None = None
    head_sink: np.ndarray | None = None

    def feeds(self) -> dict[str, np.ndarray]:
        """Feeds for everything but the KV cache."""
        f = {"query": self.query, "seqlens_k": self.seqlens_k,
             "total_sequence_length": np.array(self.total_sequence_length, dtype=np.int32)}
        for name in ("key", "value", "cos_cache", "sin_cache", "position_ids",
                     "attention_bias", "head_sink"):
            arr = getattr(self, name)
            if arr is not None:
                f[name] = arr
        return f


def random_step(cfg: GQAConfig, rng: np.random.Generator, past_lens, new_tokens: int,
                positions: int = 0, position_offsets=None) -> GQAStep:
    """Random inputs for a call after a prompt: row b holds ``past_lens[b]``
    tokens and gets ``new_tokens`` (S) more; total_sequence_length is the
    longest row. (S > 1 with B > 1 is a continued prompt, which ORT only
    allows for B = 1.)

    positions: rows of the cos/sin caches (default: just enough).
    position_offsets: per row, added to the derived positions to make the
    ``position_ids`` input (when ``cfg.position_ids``) differ from them.
    """
    totals = np.asarray(past_lens, dtype=np.int64) + new_tokens
    return _make_step(cfg, rng, totals, new_tokens, int(totals.max()), positions,
                      position_offsets)


def prompt_step(cfg: GQAConfig, rng: np.random.Generator, prompt_lens, positions: int = 0,
                position_offsets=None) -> GQAStep:
    """A first prompt for rows of different lengths: S = max(prompt_lens),
    shorter rows right-padded; total_sequence_length = S."""
    lens = np.asarray(prompt_lens, dtype=np.int64)
    s = int(lens.max())
    return _make_step(cfg, rng, lens, s, s, positions, position_offsets)


def _make_step(cfg, rng, totals, s, total_seq, positions, position_offsets) -> GQAStep:
    dt = np_dtype(cfg.dtype)
    b = len(totals)
    n, nkv, d = cfg.num_heads, cfg.kv_num_heads, cfg.head_dim

    def rnd(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(dt)

    if cfg.packed:
        query, key, value = rnd(b, s, (n + 2 * nkv) * d), None, None
    else:
        query, key, value = rnd(b, s, n * d), rnd(b, s, nkv * d), rnd(b, s, nkv * d)
    step = GQAStep(query, key, value, (totals - 1).astype(np.int32), int(total_seq))
    if cfg.position_ids:
        off = np.zeros(b, np.int64) if position_offsets is None else np.asarray(position_offsets)
        pos = (totals - s)[:, None] + np.arange(s)[None, :]
        if s == total_seq:  # first prompt: rows start at 0
            pos = np.broadcast_to(np.arange(s)[None, :], (b, s))
        step.position_ids = (pos + off[:, None]).astype(np.int64)
    if cfg.do_rotary:
        need = int(totals.max()) + s + 1
        if step.position_ids is not None:
            need = max(need, int(step.position_ids.max()) + 1)
        step.cos_cache, step.sin_cache = rotary_caches(max(positions, need), cfg.rdim, cfg.dtype)
    if cfg.attention_bias:
        step.attention_bias = rnd(1 if cfg.bias_broadcast_batch else b,
                                  1 if cfg.bias_broadcast_heads else n, s, total_seq)
    if cfg.head_sink:
        step.head_sink = rnd(n)
    return step


# ---------------------------------------------------------------- running


@dataclass
class KVCache:
    """A BNSH KV cache ``[B, Nkv, capacity, d]`` used as past and present at
    once (onnxruntime-genai's past_present_share_buffer)."""
    key: np.ndarray
    value: np.ndarray

    @classmethod
    def empty(cls, cfg: GQAConfig, batch: int, capacity: int, rng=None, fill=np.nan) -> "KVCache":
        """A cache of ``capacity`` rows; unused rows hold ``fill`` (NaN by
        default: a kernel that reads a row it must not shows it at once), or
        random values when ``rng`` is given."""
        shape = (batch, cfg.kv_num_heads, capacity, cfg.head_dim)
        dt = np_dtype(cfg.dtype)
        if rng is not None:
            return cls(rng.standard_normal(shape).astype(dt), rng.standard_normal(shape).astype(dt))
        return cls(np.full(shape, fill, dtype=dt), np.full(shape, fill, dtype=dt))

    def copy(self) -> "KVCache":
        return KVCache(self.key.copy(), self.value.copy())


def run_gqa_shared(sess, cfg: GQAConfig, cache: KVCache, step: GQAStep,
                   poison: float = np.nan) -> np.ndarray:
    """One call with past and present bound to the same buffers (the cache is
    updated in place). The output buffer is filled with ``poison`` first.
    Works for bfloat16 (``ml_dtypes.bfloat16`` arrays) too."""
    b, s = step.query.shape[:2]
    out = np.full((b, s, cfg.num_heads * cfg.head_dim), poison, dtype=np_dtype(cfg.dtype))
    io = sess.io_binding()
    keep = []  # the OrtValues wrap these arrays: keep both alive until the run ends
    for name, arr in step.feeds().items():
        arr = np.ascontiguousarray(arr)
        ov = ortvalue(arr)
        keep.append((arr, ov))
        io.bind_ortvalue_input(name, ov)
    k, v = ortvalue(cache.key), ortvalue(cache.value)
    io.bind_ortvalue_input("past_key", k)
    io.bind_ortvalue_input("past_value", v)
    io.bind_ortvalue_output("present_key", k)
    io.bind_ortvalue_output("present_value", v)
    io.bind_ortvalue_output("output", ortvalue(out))
    sess.run_with_iobinding(io)
    return out


def run_gqa(sess, cfg: GQAConfig, step: GQAStep, past: KVCache | None = None):
    """One call with separate past and present (plain ``sess.run``).
    Returns ``(output, present_key, present_value)`` (presents None when the
    model has none)."""
    feeds = step.feeds()
    if cfg.with_past:
        if past is None:
            b = step.query.shape[0]
            past = KVCache.empty(cfg, b, 0)
        feeds["past_key"], feeds["past_value"] = past.key, past.value
    names = [o.name for o in sess.get_outputs()]
    if np_dtype(cfg.dtype) != np.dtype(ml_dtypes.bfloat16):
        got = dict(zip(names, sess.run(None, feeds)))
        return got["output"], got.get("present_key"), got.get("present_value")
    # bfloat16: plain run cannot feed or fetch it; bind preallocated outputs.
    b, s = step.query.shape[:2]
    cap = max(step.total_sequence_length, past.key.shape[2] if cfg.with_past else 0)
    shapes = {"output": (b, s, cfg.num_heads * cfg.head_dim),
              "present_key": (b, cfg.kv_num_heads, cap, cfg.head_dim),
              "present_value": (b, cfg.kv_num_heads, cap, cfg.head_dim)}
    got = {name: np.full(shapes[name], np.nan, dtype=ml_dtypes.bfloat16) for name in names}
    io = sess.io_binding()
    keep = []
    for name, arr in feeds.items():
        arr = np.ascontiguousarray(arr)
        ov = ortvalue(arr)
        keep.append((arr, ov))
        io.bind_ortvalue_input(name, ov)
    for name, arr in got.items():
        ov = ortvalue(arr)
        keep.append(ov)
        io.bind_ortvalue_output(name, ov)
    sess.run_with_iobinding(io)
    return got["output"], got.get("present_key"), got.get("present_value")


# ---------------------------------------------------------------- real shapes


@dataclass(frozen=True)
class AttentionShape:
    """The attention of one decoder layer of a real model."""
    name: str
    num_heads: int
    kv_num_heads: int
    head_dim: int
    head_sink: bool = False  # learned per-head sink logits (gpt-oss)
    hf_name: str = ""

    def config(self, do_rotary: bool = True, dtype: str = "float32") -> GQAConfig:
        return GQAConfig(num_heads=self.num_heads, kv_num_heads=self.kv_num_heads,
                         head_dim=self.head_dim, do_rotary=do_rotary, head_sink=self.head_sink,
                         dtype=dtype)

    def kv_bytes(self, batch: int, context: int, itemsize: int = 4) -> int:
        """K and V bytes one decode step reads at this context."""
        return 2 * batch * self.kv_num_heads * context * self.head_dim * itemsize


ATTENTION_SHAPES = {
    s.name: s for s in (
        AttentionShape("qwen3-30b-a3b", 32, 4, 128, hf_name="Qwen/Qwen3-30B-A3B"),
        AttentionShape("mixtral-8x7b", 32, 8, 128, hf_name="mistralai/Mixtral-8x7B-v0.1"),
        AttentionShape("gpt-oss-20b", 64, 8, 64, head_sink=True, hf_name="openai/gpt-oss-20b"),
    )
}
