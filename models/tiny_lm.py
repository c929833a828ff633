"""A small random MoE language model, built offline with numpy and onnx, and
a greedy generate loop over ONNX Runtime with a shared KV cache.

The graph is written the way onnxruntime-genai's model builder writes a
decoder, in a handful of fused ops per layer::

    input_ids -> Gather (embedding)
    per layer:  SimplifiedLayerNormalization (layer 0) or
                com.microsoft::SkipSimplifiedLayerNormalization (residual add fused)
                -> MatMul (packed QKV)
                -> com.microsoft::GroupQueryAttention (rotary inside, cos/sin caches
                   as initializers, past/present KV in BNSH)
                -> MatMul (o_proj)
                -> SkipSimplifiedLayerNormalization
                -> MatMul (router) -> Reshape [T, E]
                -> com.microsoft::MoE (float32 experts, SwiGLU, interleaved
                   gate/up rows: swiglu_fusion=1, top-k renormalised)
    SkipSimplifiedLayerNormalization (final norm) -> MatMul (LM head) -> logits

GroupQueryAttention's ``seqlens_k`` and ``total_sequence_length`` come from
``attention_mask`` as in genai's builder (ReduceSum - 1, Shape[1]), so the
graph's inputs and outputs are genai's: ``input_ids [B, S]`` and
``attention_mask [B, total]`` (int64), ``past_key_values.{i}.key|value``
``[B, Nkv, capacity, d]``; outputs ``logits [B, S, V]`` and
``present.{i}.key|value``.

    cfg = TinyLMConfig(layers=2, hidden=256, experts=8)
    model, weights = build_tiny_lm(cfg, seed=0)
    sess = make_session(model, "HinaMoE", threads=2)
    gen = Generator(sess, cfg)
    result = gen.generate(prompt_ids, new_tokens=32)   # greedy
    result.tokens, result.prefill_tok_s, result.decode_tok_s

``python -m hinamoe.models.tiny_lm OUT`` writes a model folder
(``model.onnx`` + ``tiny_lm.json``) that ``load_tiny_lm`` reads back; with
``--tokenizer`` also a byte-level tokenizer with a chat template, so
``hina-serve OUT`` serves it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from .gqa_layer import GQAConfig, KVCache, rotary_caches
from .moe_layer import MS_DOMAIN, MoEConfig, random_weights
from .moe_layer import _ortvalue as ortvalue

MODEL_FILE = "model.onnx"
CONFIG_FILE = "tiny_lm.json"
CPU_EP = "CPUExecutionProvider"


# ---------------------------------------------------------------- config


@dataclass
class TinyLMConfig:
    layers: int = 2
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 0            # 0: hidden // heads
    inter: int = 256             # expert intermediate size
    experts: int = 8
    k: int = 2
    vocab: int = 512
    max_length: int = 1024       # rotary cache rows = longest sequence the model takes
    rope_theta: float = 10000.0
    eps: float = 1e-6            # RMSNorm epsilon
    # SwiGLU as gpt-oss writes it (and the MoE op takes as attributes):
    # gate * sigmoid(alpha * gate) * (up + beta), gate <= limit, |up| <= limit
    swiglu_alpha: float = 1.702
    swiglu_beta: float = 1.0
    swiglu_limit: float = 7.0

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise ValueError(f"hidden {self.hidden} is not a multiple of heads {self.heads}")
            self.head_dim = self.hidden // self.heads
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even (rotary)")
        if not 1 <= self.k <= self.experts:
            raise ValueError(f"k={self.k} must be in [1, experts={self.experts}]")

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    def gqa_config(self) -> GQAConfig:
        """The attention of one layer (for ``KVCache``)."""
        return GQAConfig(num_heads=self.heads, kv_num_heads=self.kv_heads, head_dim=self.head_dim,
                         packed=True, do_rotary=True)

    def moe_config(self) -> MoEConfig:
        """The MoE of one layer (``MoEConfig`` semantics: float32, fc1 [E, 2I, H])."""
        return MoEConfig(hidden=self.hidden, inter=self.inter, experts=self.experts, k=self.k,
                         activation="swiglu", swiglu_fusion=1, dtype="float32",
                         normalize_routing_weights=1, activation_alpha=self.swiglu_alpha,
                         activation_beta=self.swiglu_beta, swiglu_limit=self.swiglu_limit,
                         input_rank=3)

    def describe(self) -> str:
        return (f"{self.layers} layers, hidden {self.hidden}, {self.heads} heads "
                f"({self.kv_heads} KV) x {self.head_dim}, {self.experts} experts (k={self.k}, "
                f"inter {self.inter}, swiglu), vocab {self.vocab}")

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------- weights


def weight_shapes(cfg: TinyLMConfig) -> dict[str, tuple[int, ...]]:
    """Every weight of the model. MatMul weights are ``[in, out]`` (x @ W);
    MoE weights are ORT's ``fc1 [E, 2I, H]`` (rows 2j gate, 2j+1 up) and
    ``fc2 [E, H, I]``."""
    h, e = cfg.hidden, cfg.experts
    shapes: dict[str, tuple[int, ...]] = {"embed": (cfg.vocab, h)}
    for i in range(cfg.layers):
        p = f"layers.{i}."
        shapes[p + "attn_norm"] = (h,)
        shapes[p + "qkv"] = (h, cfg.qkv_width)
        shapes[p + "o_proj"] = (cfg.heads * cfg.head_dim, h)
        shapes[p + "ffn_norm"] = (h,)
        shapes[p + "router"] = (h, e)
        shapes[p + "fc1"] = (e, 2 * cfg.inter, h)
        shapes[p + "fc2"] = (e, h, cfg.inter)
    shapes["final_norm"] = (h,)
    shapes["lm_head"] = (h, cfg.vocab)
    return shapes


def random_tiny_lm_weights(cfg: TinyLMConfig, rng: np.random.Generator,
                           router_scale: float = 2.0, logit_scale: float = 4.0) -> dict[str, np.ndarray]:
    """float32 weights keeping activations O(1): projections N(0, 1/fan_in),
    norm gains 1 + N(0, 0.1^2), embedding N(0, 1). Router logits have a std
    of about ``router_scale`` and next-token logits about ``logit_scale``,
    so top-k routing and greedy picks are rarely near-ties."""
    h = cfg.hidden
    moe = cfg.moe_config()

    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    w: dict[str, np.ndarray] = {"embed": normal((cfg.vocab, h), 1.0)}
    for i in range(cfg.layers):
        p = f"layers.{i}."
        w[p + "attn_norm"] = (1.0 + normal((h,), 0.1)).astype(np.float32)
        w[p + "qkv"] = normal((h, cfg.qkv_width), 1.0 / np.sqrt(h))
        w[p + "o_proj"] = normal((cfg.heads * cfg.head_dim, h), 1.0 / np.sqrt(cfg.heads * cfg.head_dim))
        w[p + "ffn_norm"] = (1.0 + normal((h,), 0.1)).astype(np.float32)
        w[p + "router"] = normal((h, cfg.experts), router_scale / np.sqrt(h))
        experts = random_weights(moe, rng)
        w[p + "fc1"], w[p + "fc2"] = experts["fc1"], experts["fc2"]
    w["final_norm"] = (1.0 + normal((h,), 0.1)).astype(np.float32)
    w["lm_head"] = normal((h, cfg.vocab), logit_scale / np.sqrt(h))
    return w


# ---------------------------------------------------------------- graph


def _init(name: str, arr: np.ndarray) -> TensorProto:
    arr = np.ascontiguousarray(arr)
    et = helper.np_dtype_to_tensor_dtype(arr.dtype)
    return helper.make_tensor(name, et, list(arr.shape), vals=arr.tobytes(), raw=True)


def build_tiny_lm(cfg: TinyLMConfig, weights: dict[str, np.ndarray] | None = None,
                  seed: int | None = 0, rng: np.random.Generator | None = None,
                  name: str = "tiny_moe_lm") -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The decoder graph (module docstring) with ``weights`` as initializers
    (``random_tiny_lm_weights`` from ``rng`` / ``seed`` when None). Returns
    ``(model, weights)``: the float32 arrays the model holds."""
    if weights is None:
        weights = random_tiny_lm_weights(cfg, rng if rng is not None else np.random.default_rng(seed))
    shapes = weight_shapes(cfg)
    w = {}
    for key, shape in shapes.items():
        arr = np.ascontiguousarray(np.asarray(weights[key], dtype=np.float32))
        if arr.shape != shape:
            raise ValueError(f"{key}: shape {arr.shape}, expected {shape}")
        w[key] = arr
    cos, sin = rotary_caches(cfg.max_length, cfg.head_dim, "float32", base=cfg.rope_theta)

    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    nkv, d = cfg.kv_heads, cfg.head_dim
    vi = helper.make_tensor_value_info
    inputs = [vi("input_ids", i64, ["batch_size", "sequence_length"]),
              vi("attention_mask", i64, ["batch_size", "total_sequence_length"])]
    outputs = [vi("logits", f32, ["batch_size", "sequence_length", cfg.vocab])]
    for i in range(cfg.layers):
        for kv in ("key", "value"):
            inputs.append(vi(f"past_key_values.{i}.{kv}", f32, ["batch_size", nkv, "past_sequence_length", d]))
            outputs.append(vi(f"present.{i}.{kv}", f32, ["batch_size", nkv, "total_sequence_length", d]))

    inits = [_init(key, arr) for key, arr in w.items()]
    inits += [_init("cos_cache", cos), _init("sin_cache", sin),
              _init("one_i64", np.array(1, np.int64)), _init("axes_1", np.array([1], np.int64)),
              _init("router_shape", np.array([-1, cfg.experts], np.int64))]

    nodes = []

    def node(op, ins, outs, name, domain="", **attrs):
        nodes.append(helper.make_node(op, ins, outs, name=name, domain=domain, **attrs))

    # attention_mask -> seqlens_k [B] int32 (tokens - 1), total_sequence_length int32
    node("ReduceSum", ["attention_mask", "axes_1"], ["mask_sum"], "mask/ReduceSum", keepdims=0)
    node("Sub", ["mask_sum", "one_i64"], ["mask_sum_m1"], "mask/Sub")
    node("Cast", ["mask_sum_m1"], ["seqlens_k"], "mask/Cast_seqlens", to=TensorProto.INT32)
    node("Shape", ["attention_mask"], ["mask_shape"], "mask/Shape")
    node("Gather", ["mask_shape", "one_i64"], ["total_len_i64"], "mask/Gather", axis=0)
    node("Cast", ["total_len_i64"], ["total_sequence_length"], "mask/Cast_total", to=TensorProto.INT32)

    node("Gather", ["embed", "input_ids"], ["embeds"], "embed/Gather", axis=0)
    moe_attrs = cfg.moe_config().attributes()
    x, residual = "embeds", None
    for i in range(cfg.layers):
        p = f"layers.{i}."
        if residual is None:
            node("SimplifiedLayerNormalization", [x, p + "attn_norm"], [p + "attn_in"],
                 p + "attn_norm/SimplifiedLayerNorm", axis=-1, epsilon=cfg.eps)
            residual = x
        else:
            node("SkipSimplifiedLayerNormalization", [x, residual, p + "attn_norm"],
                 [p + "attn_in", "", "", p + "attn_residual"], p + "attn_norm/SkipSimplifiedLayerNorm",
                 domain=MS_DOMAIN, epsilon=cfg.eps)
            residual = p + "attn_residual"
        node("MatMul", [p + "attn_in", p + "qkv"], [p + "qkv_out"], p + "attn/qkv_proj/MatMul")
        node("GroupQueryAttention",
             [p + "qkv_out", "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value",
              "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"],
             [p + "attn_out", f"present.{i}.key", f"present.{i}.value"], p + "attn/GroupQueryAttention",
             domain=MS_DOMAIN, num_heads=cfg.heads, kv_num_heads=nkv, do_rotary=1, rotary_interleaved=0)
        node("MatMul", [p + "attn_out", p + "o_proj"], [p + "o_out"], p + "attn/o_proj/MatMul")
        node("SkipSimplifiedLayerNormalization", [p + "o_out", residual, p + "ffn_norm"],
             [p + "ffn_in", "", "", p + "ffn_residual"], p + "ffn_norm/SkipSimplifiedLayerNorm",
             domain=MS_DOMAIN, epsilon=cfg.eps)
        residual = p + "ffn_residual"
        node("MatMul", [p + "ffn_in", p + "router"], [p + "router_logits"], p + "moe/router/MatMul")
        node("Reshape", [p + "router_logits", "router_shape"], [p + "router_logits_2d"], p + "moe/router/Reshape")
        node("MoE", [p + "ffn_in", p + "router_logits_2d", p + "fc1", "", p + "fc2"], [p + "moe_out"],
             p + "moe/MoE", domain=MS_DOMAIN, **moe_attrs)
        x = p + "moe_out"
    node("SkipSimplifiedLayerNormalization", [x, residual, "final_norm"], ["final_out", "", "", ""],
         "final_norm/SkipSimplifiedLayerNorm", domain=MS_DOMAIN, epsilon=cfg.eps)
    node("MatMul", ["final_out", "lm_head"], ["logits"], "lm_head/MatMul")

    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS_DOMAIN, 1)],
                              producer_name="hinamoe.models.tiny_lm")
    model.ir_version = 8
    return model, w


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    """``{op_type: count}`` of the graph's nodes."""
    out: dict[str, int] = {}
    for n in model.graph.node:
        out[n.op_type] = out.get(n.op_type, 0) + 1
    return out


def weight_bytes(weights: dict[str, np.ndarray]) -> int:
    return sum(int(a.nbytes) for a in weights.values())


def save_tiny_lm(folder: str | os.PathLike, cfg: TinyLMConfig, model: onnx.ModelProto) -> Path:
    """Writes ``folder/model.onnx`` and ``folder/tiny_lm.json`` (the config);
    returns the model path. Models above ~1.8 GB go to external data."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MODEL_FILE
    if model.ByteSize() > 1_800_000_000:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=MODEL_FILE + ".data", size_threshold=1024)
    else:
        onnx.save_model(model, str(path))
    (folder / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
    return path


CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def save_tokenizer(folder: str | os.PathLike, cfg: TinyLMConfig) -> None:
    """A byte-level tokenizer (one token per byte, then bos/eos/pad) with a
    plain chat template, and a generation config naming its end token, so
    the folder is a servable model (needs transformers)."""
    from .hf_tiny import EOS, byte_tokenizer

    tok = byte_tokenizer()
    if cfg.vocab < len(tok):
        raise ValueError(f"vocab {cfg.vocab} < the byte tokenizer's {len(tok)} tokens")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(folder))
    (Path(folder) / "generation_config.json").write_text(json.dumps({"eos_token_id": EOS}) + "\n")


def load_tiny_lm(folder: str | os.PathLike) -> tuple[str, TinyLMConfig]:
    """``(model path, config)`` of a folder ``save_tiny_lm`` wrote."""
    folder = Path(folder)
    cfg = TinyLMConfig(**json.loads((folder / CONFIG_FILE).read_text()))
    return str(folder / MODEL_FILE), cfg


# ---------------------------------------------------------------- sessions


def make_session(model, ep: str = "HinaMoE", threads: int = 0, profile_prefix: str | None = None,
                 provider_options: dict | None = None):
    """An ``InferenceSession`` of ``model`` (ModelProto, bytes or path) on
    ``ep``: "HinaMoE" (HinaMoE first, ORT's CPU EP for the other nodes;
    ``provider_options`` e.g. ``{"isa": "avx2", "strict": "1"}``) or "CPU"
    (the CPU EP alone). threads: intra-op threads (0 = ORT's default)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    if ep in ("CPU", CPU_EP):
        providers = [CPU_EP]
    elif ep == "HinaMoE":
        import hinamoe

        hinamoe.register()
        providers = [(hinamoe.get_ep_name(), dict(provider_options or {})), CPU_EP]
    else:
        raise ValueError(f"unknown ep {ep!r}: 'HinaMoE' or 'CPU'")
    src = model.SerializeToString() if hasattr(model, "graph") else model
    if isinstance(src, Path):
        src = str(src)
    return ort.InferenceSession(src, so, providers=providers)


def profile_placement(path: str) -> dict[str, list[str]]:
    """``{op_type: [providers]}`` of the nodes that ran, from an ORT
    profiling JSON."""
    with open(path) as f:
        events = json.load(f)
    out: dict[str, set] = {}
    for ev in events:
        args = ev.get("args", {})
        if ev.get("cat") == "Node" and "provider" in args and "op_name" in args:
            out.setdefault(args["op_name"], set()).add(args["provider"])
    return {op: sorted(p) for op, p in sorted(out.items())}


def placement(model, cfg: TinyLMConfig, ep: str = "HinaMoE", threads: int = 0,
              prompt_len: int = 4, decode_steps: int = 1, provider_options: dict | None = None,
              profile_dir: str | None = None) -> dict[str, list[str]]:
    """Which EP ran each op type: a profiled session generates from a short
    prompt and its ORT profile is read (then deleted)."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=profile_dir) as tmp:
        sess = make_session(model, ep, threads, profile_prefix=os.path.join(tmp, "tiny_lm"),
                            provider_options=provider_options)
        gen = Generator(sess, cfg, capacity=prompt_len + decode_steps + 1)
        prompt = np.arange(prompt_len, dtype=np.int64)[None, :] % cfg.vocab
        gen.generate(prompt, decode_steps + 1)
        path = sess.end_profiling()
        try:
            return profile_placement(path)
        finally:
            for p in glob.glob(path):
                os.remove(p)


# ---------------------------------------------------------------- generation


@dataclass
class GenerationResult:
    tokens: np.ndarray            # [B, new_tokens] int64
    prompt_tokens: int            # B * S
    prefill_s: float              # the prompt call (gives the first new token)
    decode_s: float               # the new_tokens - 1 calls after it
    margins: np.ndarray           # [B, new_tokens]: top-1 minus top-2 logit of each pick
    logits: list = field(default_factory=list)  # [B, V] per new token (keep_logits=True)

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else float("inf")

    @property
    def decode_tok_s(self) -> float:
        steps = self.tokens.shape[0] * (self.tokens.shape[1] - 1)
        return steps / self.decode_s if self.decode_s > 0 else float("nan")


class Generator:
    """Greedy generation with the KV cache shared between past and present
    (onnxruntime-genai's past_present_share_buffer): one ``[B, Nkv,
    capacity, d]`` buffer per layer and K/V, bound once as both
    ``past_key_values.{i}.*`` and ``present.{i}.*``; each call binds only
    ``input_ids``, ``attention_mask`` and ``logits``.

    ``forward(ids)`` appends ``ids [B, S]`` to the sequence and returns the
    logits ``[B, S, V]``; ``reset()`` starts a new sequence. A call with
    S > 1 after the first needs B = 1 (ORT's GroupQueryAttention)."""

    def __init__(self, sess, cfg: TinyLMConfig, batch: int = 1, capacity: int | None = None,
                 fill: float = 0.0):
        capacity = cfg.max_length if capacity is None else int(capacity)
        if capacity > cfg.max_length:
            raise ValueError(f"capacity {capacity} > max_length {cfg.max_length} (rotary cache rows)")
        self.sess, self.cfg, self.batch, self.capacity = sess, cfg, batch, capacity
        gcfg = cfg.gqa_config()
        self.caches = [KVCache.empty(gcfg, batch, capacity, fill=fill) for _ in range(cfg.layers)]
        self.io = sess.io_binding()
        self._keep = []
        for i, c in enumerate(self.caches):
            for kv, arr in (("key", c.key), ("value", c.value)):
                ov = ortvalue(arr)
                self._keep.append(ov)
                self.io.bind_ortvalue_input(f"past_key_values.{i}.{kv}", ov)
                self.io.bind_ortvalue_output(f"present.{i}.{kv}", ov)
        self.length = 0

    def reset(self) -> None:
        self.length = 0

    def forward(self, ids: np.ndarray) -> np.ndarray:
        ids = np.ascontiguousarray(np.asarray(ids, dtype=np.int64))
        if ids.ndim != 2 or ids.shape[0] != self.batch:
            raise ValueError(f"input_ids shape {ids.shape}, expected [{self.batch}, S]")
        s = ids.shape[1]
        total = self.length + s
        if total > self.capacity:
            raise ValueError(f"sequence of {total} tokens exceeds the cache capacity {self.capacity}")
        mask = np.ones((self.batch, total), dtype=np.int64)
        logits = np.empty((self.batch, s, self.cfg.vocab), dtype=np.float32)
        ovs = (ortvalue(ids), ortvalue(mask), ortvalue(logits))
        self.io.bind_ortvalue_input("input_ids", ovs[0])
        self.io.bind_ortvalue_input("attention_mask", ovs[1])
        self.io.bind_ortvalue_output("logits", ovs[2])
        self.sess.run_with_iobinding(self.io)
        self.length = total
        return logits

    def generate(self, prompt_ids: np.ndarray, new_tokens: int, keep_logits: bool = False) -> GenerationResult:
        """Greedy: the prompt ``[B, S]`` (or ``[S]``) then ``new_tokens``
        tokens, from a fresh sequence. Timed: the prompt call, the rest."""
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        if prompt.ndim == 1:
            prompt = prompt[None, :]
        if new_tokens < 1:
            raise ValueError("new_tokens must be >= 1")
        self.reset()
        toks = np.empty((self.batch, new_tokens), np.int64)
        margins = np.empty((self.batch, new_tokens))
        kept = []

        def pick(last: np.ndarray, j: int) -> np.ndarray:
            top2 = np.partition(last, -2, axis=-1)[:, -2:]
            margins[:, j] = top2[:, 1] - top2[:, 0]
            toks[:, j] = np.argmax(last, axis=-1)
            if keep_logits:
                kept.append(last.copy())
            return toks[:, j:j + 1]

        t0 = time.perf_counter()
        nxt = pick(self.forward(prompt)[:, -1], 0)
        t1 = time.perf_counter()
        for j in range(1, new_tokens):
            nxt = pick(self.forward(nxt)[:, -1], j)
        t2 = time.perf_counter()
        return GenerationResult(toks, prompt.size, t1 - t0, t2 - t1, margins, kept)


def generate(model, cfg: TinyLMConfig, prompt_ids: np.ndarray, new_tokens: int, ep: str = "HinaMoE",
             threads: int = 0, provider_options: dict | None = None) -> GenerationResult:
    """One-shot helper: a session on ``ep``, a ``Generator`` and one greedy
    generation (untimed warm-up not included)."""
    sess = make_session(model, ep, threads, provider_options=provider_options)
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    batch = 1 if prompt.ndim == 1 else prompt.shape[0]
    gen = Generator(sess, cfg, batch=batch, capacity=prompt.shape[-1] + new_tokens)
    return gen.generate(prompt, new_tokens)


def random_prompt(cfg: TinyLMConfig, length: int, rng: np.random.Generator, batch: int = 1) -> np.ndarray:
    return rng.integers(0, cfg.vocab, size=(batch, length), dtype=np.int64)


# ---------------------------------------------------------------- CLI


def add_config_arguments(ap: argparse.ArgumentParser) -> None:
    d = TinyLMConfig()
    ap.add_argument("--layers", type=int, default=d.layers, help=f"decoder layers (default {d.layers})")
    ap.add_argument("--hidden", type=int, default=d.hidden, help=f"hidden size (default {d.hidden})")
    ap.add_argument("--heads", type=int, default=d.heads, help=f"query heads (default {d.heads}; head dim = hidden / heads)")
    ap.add_argument("--kv-heads", type=int, default=d.kv_heads, help=f"KV heads (default {d.kv_heads})")
    ap.add_argument("--experts", type=int, default=d.experts, help=f"experts per layer (default {d.experts})")
    ap.add_argument("--k", type=int, default=d.k, help=f"experts per token (default {d.k})")
    ap.add_argument("--inter", type=int, default=d.inter, help=f"expert intermediate size (default {d.inter})")
    ap.add_argument("--vocab", type=int, default=d.vocab, help=f"vocabulary size (default {d.vocab})")
    ap.add_argument("--max-length", type=int, default=d.max_length,
                    help=f"longest sequence (rotary cache rows, default {d.max_length})")


def config_from_args(args) -> TinyLMConfig:
    return TinyLMConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads,
                        experts=args.experts, k=args.k, inter=args.inter, vocab=args.vocab,
                        max_length=args.max_length)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hinamoe.models.tiny_lm",
                                 description="Write a small random MoE language model folder "
                                             f"({MODEL_FILE} + {CONFIG_FILE}), offline.")
    ap.add_argument("out", help="output folder")
    add_config_arguments(ap)
    ap.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    ap.add_argument("--tokenizer", action="store_true",
                    help="also write a byte-level tokenizer with a chat template (for hina-serve)")
    args = ap.parse_args(argv)
    cfg = config_from_args(args)
    model, weights = build_tiny_lm(cfg, seed=args.seed)
    path = save_tiny_lm(args.out, cfg, model)
    if args.tokenizer:
        save_tokenizer(args.out, cfg)
    print(f"{path}: {cfg.describe()}, {len(model.graph.node)} nodes, "
          f"{weight_bytes(weights) / 2 ** 20:.1f} MiB of weights")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
