"""``hina-bench ffn``'s ggml column: llama.cpp's MoE FFN on ggml's CPU
backend, on the same weights, inputs and routing as the HinaMoE node, timed
in turn with it.

The graph is the one llama.cpp's ``build_moe_ffn`` makes for a softmax-gated
SwiGLU MoE (Qwen3-MoE, Mixtral): softmax over the router logits, top-k
(``ggml_argsort_top_k``), the routing weights gathered (``ggml_get_rows``,
renormalised when the node normalises), then ``ggml_mul_mat_id`` for up,
gate and down on ``[in, out, expert]`` tensors, ``ggml_swiglu_split``, the
product with the routing weights and the sum over the k slots (``ggml_add``
of k views). Hidden states are float32 as in llama.cpp; ggml converts them
to the weights' dot-product type itself.

The weights are the HinaMoE model's own values, rewritten once into the
layout of a GGUF file (gate, up and down as separate ``[E, out, in]``
arrays; fc1's interleaved gate/up rows split) and memory-mapped read-only,
as llama.cpp maps a model by default, so both sides read file-backed pages.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from . import cpu_mask
from .quiet import rewarm, wait_until_quiet
from .ggml_lib import HOW_TO_GET, STATUS_SUCCESS, TYPE_F32, TYPES, Ggml, GgmlUnavailable, InitParams, load

_ALIGN = 4096
# Largest |ggml - HinaMoE| / max |HinaMoE| expected from rounding alone: ggml
# rounds the activations to the weights' type before each dot product
# (HinaMoE keeps them in float32) and HinaMoE rounds its output to that type.
DIFF_LIMIT = {"f32": 1e-4, "f16": 1e-2, "bf16": 5e-2}


def open_ggml(args) -> tuple[Ggml | None, str]:
    """(the loaded ggml, a line saying where it is from), or (None, why not
    and how to get it); --no-ggml gives (None, '')."""
    if getattr(args, "no_ggml", False):
        return None, ""
    try:
        g = load(getattr(args, "ggml_lib", None))
    except GgmlUnavailable as exc:
        return None, f"ggml column: not run: {exc}.\n  To get it, {HOW_TO_GET}"
    if cpu_mask.active() == "avx2" and any(f.startswith("avx512") for f in g.cpu_features):
        # Compiled for AVX-512 (GGML_NATIVE=ON): the mask cannot take it away.
        return None, (f"ggml column: not run: --cpu-as avx2, but {g.describe()}.\n"
                      "  Give --ggml-lib a build made with -DGGML_NATIVE=OFF -DGGML_AVX2=ON "
                      "-DGGML_AVX512=OFF, or a build with -DGGML_CPU_ALL_VARIANTS=ON.")
    return g, f"ggml: {g.describe()}"


# ----------------------------------------------------------------- weights


def _external_weights(model_path: str | Path) -> tuple[Path, dict[str, tuple[int, int]]]:
    """The external-data file of a model written by build_moe_model and,
    per initializer, (offset, length) in it."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    where: dict[str, tuple[int, int]] = {}
    location = None
    for init in model.graph.initializer:
        info = {e.key: e.value for e in init.external_data}
        if "location" not in info:
            raise ValueError(f"{model_path}: initializer {init.name} is not external data")
        location = info["location"]
        where[init.name] = (int(info.get("offset", 0)), int(info["length"]))
    if location is None:
        raise ValueError(f"{model_path}: no external initializers")
    return Path(model_path).parent / location, where


def write_ggml_weights(model_path: str | Path, cfg, out_path: str | Path) -> dict[str, int]:
    """Writes the expert weights of a one-node MoE model (build_moe_model with
    external_dir, no biases, a gated activation) as ggml lays out
    ffn_gate_exps / ffn_up_exps / ffn_down_exps: three [E, out, in] arrays of
    the model's dtype, each page-aligned. Returns their byte offsets."""
    from ..models import np_dtype

    if not cfg.gated or cfg.fc1_bias or cfg.fc2_bias or cfg.fc3_bias:
        raise ValueError("the ggml column takes gated activations without biases")
    data, where = _external_weights(model_path)
    src = np.memmap(data, mode="r", dtype=np.uint8)
    es = np_dtype(cfg.dtype).itemsize
    e, h, i = cfg.experts, cfg.hidden, cfg.inter

    def expert_rows(name, rows, cols):
        off, length = where[name]
        assert length == e * rows * cols * es, (name, length)
        return src[off:off + length].reshape(e, rows, cols * es)

    fc1 = expert_rows("fc1_experts_weights", cfg.fc1_rows, h)
    fc2 = expert_rows("fc2_experts_weights", h, i)
    fc3 = expert_rows("fc3_experts_weights", i, h) if cfg.has_fc3 else None
    if cfg.has_fc3:
        gate, up = (lambda x: fc1[x]), (lambda x: fc3[x])
    elif cfg.swiglu_fusion == 1:  # rows 2j (gate), 2j+1 (up)
        gate, up = (lambda x: fc1[x, 0::2]), (lambda x: fc1[x, 1::2])
    else:  # [gate | up]
        gate, up = (lambda x: fc1[x, :i]), (lambda x: fc1[x, i:])
    offsets = {}
    with open(out_path, "wb") as f:
        for name, part in (("gate", gate), ("up", up), ("down", lambda x: fc2[x])):
            f.write(b"\0" * ((-f.tell()) % _ALIGN))
            offsets[name] = f.tell()
            for x in range(e):
                f.write(np.ascontiguousarray(part(x)).tobytes())
    del src
    return offsets


# ----------------------------------------------------------------- graph


class GgmlMoE:
    """One MoE layer on ggml's CPU backend: the weights mapped from a file
    written by write_ggml_weights, and a backend with `threads` threads.
    step(x, logits) builds the graph of one batch (freed by free_steps());
    close() frees it all."""

    def __init__(self, g: Ggml, cfg, weights_path: str | Path, offsets: dict[str, int], threads: int):
        from ..models import short_dtype

        self.g, self.cfg = g, cfg
        fn = g.fn
        d = short_dtype(cfg.dtype)
        if d not in TYPES:
            raise ValueError(f"ggml column: no ggml type for {d}")
        self.type = TYPES[d]
        self._map = np.memmap(weights_path, mode="r", dtype=np.uint8)
        base = self._map.ctypes.data
        self._wbuf = fn.ggml_backend_cpu_buffer_from_ptr(base, self._map.nbytes)
        self._wctx = fn.ggml_init(InitParams(4 * fn.ggml_tensor_overhead(), None, True))
        h, i, e = cfg.hidden, cfg.inter, cfg.experts
        self.tensors = {}
        for name, ne in (("gate", (h, i, e)), ("up", (h, i, e)), ("down", (i, h, e))):
            t = fn.ggml_new_tensor_3d(self._wctx, self.type, *ne)
            if fn.ggml_backend_tensor_alloc(self._wbuf, t, base + offsets[name]) != STATUS_SUCCESS:
                raise RuntimeError(f"ggml_backend_tensor_alloc failed for {name}")
            self.tensors[name] = t
        self.backend = fn.ggml_backend_cpu_init()
        if not self.backend:
            raise RuntimeError("ggml_backend_cpu_init failed")
        self.set_threads(threads)
        self._steps: list[GgmlStep] = []

    def set_threads(self, threads: int) -> None:
        self.threads = threads
        self.g.fn.ggml_backend_cpu_set_n_threads(self.backend, threads)

    def step(self, x: np.ndarray, logits: np.ndarray) -> "GgmlStep":
        s = GgmlStep(self, np.asarray(x, dtype=np.float32), np.asarray(logits, dtype=np.float32))
        self._steps.append(s)
        return s

    def free_steps(self) -> None:
        for s in self._steps:
            s.free()
        self._steps.clear()

    def close(self) -> None:
        fn = self.g.fn
        self.free_steps()
        if self.backend:
            fn.ggml_backend_free(self.backend)
            self.backend = None
        if self._wctx:
            fn.ggml_free(self._wctx)
            self._wctx = None
        if self._wbuf:
            fn.ggml_backend_buffer_free(self._wbuf)
            self._wbuf = None
        self._map = None


class GgmlStep:
    """The graph of one batch (x [T, H], router logits [T, E], float32) with
    its own buffers; run() computes it, output() returns [T, H] float32."""

    def __init__(self, layer: GgmlMoE, x: np.ndarray, logits: np.ndarray):
        g, fn, cfg = layer.g, layer.g.fn, layer.cfg
        self.layer = layer
        t, h = x.shape
        e, k = cfg.experts, cfg.k
        if logits.shape != (t, e):
            raise ValueError(f"logits {logits.shape}, expected {(t, e)}")
        nodes = 64 + 4 * k
        mem = (nodes + 16) * fn.ggml_tensor_overhead() + fn.ggml_graph_overhead_custom(nodes, False)
        self.ctx = fn.ggml_init(InitParams(mem, None, True))
        c = self.ctx
        self.x = fn.ggml_new_tensor_2d(c, TYPE_F32, h, t)
        self.logits = fn.ggml_new_tensor_2d(c, TYPE_F32, e, t)
        for inp in (self.x, self.logits):
            fn.ggml_set_input(inp)
        gf = fn.ggml_new_graph_custom(c, nodes, False)
        # routing, as build_moe_ffn with LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX
        probs = fn.ggml_soft_max(c, self.logits)  # [E, T]
        top_k = fn.ggml_argsort_top_k if g.has("ggml_argsort_top_k") else fn.ggml_top_k
        selected = top_k(c, probs, k)  # [k, T] int32
        weights = fn.ggml_get_rows(c, fn.ggml_reshape_3d(c, probs, 1, e, t), selected)  # [1, k, T]
        if cfg.normalize_routing_weights:
            w2 = fn.ggml_reshape_2d(c, weights, k, t)
            total = fn.ggml_clamp(c, fn.ggml_sum_rows(c, w2), 6.103515625e-5, float("inf"))
            weights = fn.ggml_reshape_3d(c, fn.ggml_div(c, w2, total), 1, k, t)
        fn.ggml_build_forward_expand(gf, weights)
        cur = fn.ggml_reshape_3d(c, self.x, h, 1, t)
        w = layer.tensors
        up = fn.ggml_mul_mat_id(c, w["up"], cur, selected)  # [I, k, T]
        gate = fn.ggml_mul_mat_id(c, w["gate"], cur, selected)
        if g.has("ggml_swiglu_split"):
            act = fn.ggml_swiglu_split(c, gate, up)
        else:
            act = fn.ggml_mul(c, fn.ggml_silu(c, gate), up)
        experts = fn.ggml_mul_mat_id(c, w["down"], act, selected)  # [H, k, T]
        experts = fn.ggml_mul(c, experts, weights)
        fn.ggml_build_forward_expand(gf, experts)
        row = h * 4  # experts is contiguous float32: nb1 = H*4, nb2 = k*H*4
        views = [fn.ggml_view_2d(c, experts, h, t, k * row, s * row) for s in range(k)]
        for v in views:
            fn.ggml_build_forward_expand(gf, v)
        out = views[0]
        for v in views[1:]:
            out = fn.ggml_add(c, out, v)
            fn.ggml_build_forward_expand(gf, out)
        if k == 1:
            out = fn.ggml_cont(c, out)
        fn.ggml_set_output(out)
        fn.ggml_build_forward_expand(gf, out)
        self.graph, self.out, self.shape = gf, out, (t, h)
        # every tensor of the graph its own memory, so the inputs stay valid across runs
        self.buf = fn.ggml_backend_alloc_ctx_tensors_from_buft(c, fn.ggml_backend_cpu_buffer_type())
        if not self.buf:
            raise RuntimeError("ggml: allocating the graph's tensors failed")
        self._x, self._logits = np.ascontiguousarray(x), np.ascontiguousarray(logits)
        fn.ggml_backend_tensor_set(self.x, self._x.ctypes.data, 0, self._x.nbytes)
        fn.ggml_backend_tensor_set(self.logits, self._logits.ctypes.data, 0, self._logits.nbytes)

    def run(self) -> None:
        status = self.layer.g.fn.ggml_backend_graph_compute(self.layer.backend, self.graph)
        if status != STATUS_SUCCESS:
            raise RuntimeError(f"ggml_backend_graph_compute: status {status}")

    def fill_output(self, value: float) -> None:
        """Overwrites the output tensor (tests poison it before a run)."""
        y = np.full(self.shape, value, dtype=np.float32)
        self.layer.g.fn.ggml_backend_tensor_set(self.out, y.ctypes.data, 0, y.nbytes)

    def output(self) -> np.ndarray:
        y = np.empty(self.shape, dtype=np.float32)
        self.layer.g.fn.ggml_backend_tensor_get(self.out, y.ctypes.data, 0, y.nbytes)
        return y

    def free(self) -> None:
        fn = self.layer.g.fn
        if self.buf:
            fn.ggml_backend_buffer_free(self.buf)
            self.buf = None
        if self.ctx:
            fn.ggml_free(self.ctx)
            self.ctx = None


# ----------------------------------------------------------------- timing


def time_alternating(hina_steps, ggml_steps, repeats: int, warmup: int, between_hina=None,
                     between_ggml=None) -> tuple[list[float], list[float]]:
    """Times (ms) of `repeats` runs of each side, taken in turn: repetition r
    times step r of one side, then of the other (the order flips every
    repetition). Each timed run follows an untimed rotation of its own side's
    steps ending with the step before it (quiet.rewarm, >= 5 ms), after this
    process went quiet (the other side's pool threads stopped spinning), so
    each side finds the caches and its threads as back-to-back runs of its own
    leave them, with the timed step's experts cold. between_* (a read-probe
    pass, or None) runs after each timed run of that side."""
    n = len(hina_steps)
    if len(ggml_steps) != n or n == 0:
        raise ValueError("both sides need the same, non-empty rotation of steps")
    for i in range(warmup):
        hina_steps[i % n]()
        ggml_steps[i % n]()
    sides = [(hina_steps, between_hina, []), (ggml_steps, between_ggml, [])]
    for r in range(repeats):
        for steps, between, times in (sides if r % 2 == 0 else sides[::-1]):
            wait_until_quiet()
            rewarm([steps[(r + j) % n] for j in range(n)])  # ends with step r-1
            t0 = time.perf_counter()
            steps[r % n]()
            times.append((time.perf_counter() - t0) * 1e3)
            if between is not None:
                between()
    return sides[0][2], sides[1][2]


def max_rel_diff(a: np.ndarray, ref: np.ndarray) -> float:
    a64, r64 = np.asarray(a, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.abs(a64 - r64).max() / max(np.abs(r64).max(), 1e-30))


def time_point(sess, cfg, plan, xs, repeats: int, warmup: int, between_hina, between_ggml,
               layer: GgmlMoE):
    """One point of hina-bench ffn with the ggml column: HinaMoE's session
    and ggml's layer run the same rotation of steps (inputs xs[step % 2],
    router logits plan.logits(step)), timed in turn (time_alternating).
    Returns (HinaMoE times, its output of step 0, ggml times, ggml's output
    of step 0)."""
    from ..models import MoERunner

    runners, steps = [], []
    try:
        for s in range(plan.period):
            x, logits = xs[s % len(xs)], plan.logits(s)
            r = MoERunner(sess, cfg)
            r.set_inputs(x, logits)
            runners.append(r)
            steps.append(layer.step(x, logits))
        times, gtimes = time_alternating([r.run for r in runners], [s.run for s in steps], repeats,
                                         warmup, between_hina, between_ggml)
        runners[0].run()
        steps[0].run()
        return times, np.array(runners[0].output, copy=True), gtimes, steps[0].output()
    finally:
        layer.free_steps()
