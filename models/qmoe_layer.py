"""Build single-node ``com.microsoft::QMoE`` ONNX models.

    cfg = QMoEConfig(hidden=64, inter=32, experts=4, k=2, bits=4, block_size=32)
    model, w = build_qmoe_model(cfg, rng=np.random.default_rng(0))
    out = sess.run(None, {"input": x, "router_probs": logits})[0]

Inputs (ORT's QMoE): 0 input, 1 router_probs, 2 fc1_experts_weights
``uint8 [E, N1, H*bits/8]``, 3 fc1_scales ``[E, N1]`` or ``[E, N1, ceil(H/block)]``,
4 fc1 bias, 5-7 the same for fc2 ``[E, H, I*bits/8]``, 8-10 for fc3, 11-13
zero points (packed as ORT reads them), 14 router_weights. Weights are
symmetric-quantised random matrices (``graph_passes.qmoe_quant``); with
``zero_points`` random zero points are added (asymmetric codes).
``w`` holds every tensor fed or stored, plus ``w["deq"]``: the float64
dequantised fc1/fc2/fc3 for a reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from ..graph_passes import qmoe_quant

from .moe_layer import GATED, MS_DOMAIN, canon_dtype, np_dtype, onnx_dtype

QMOE_INPUTS = ("input", "router_probs", "fc1_experts_weights", "fc1_scales", "fc1_experts_bias",
               "fc2_experts_weights", "fc2_scales", "fc2_experts_bias", "fc3_experts_weights",
               "fc3_scales", "fc3_experts_bias", "fc1_zero_points", "fc2_zero_points",
               "fc3_zero_points", "router_weights")


@dataclass
class QMoEConfig:
    hidden: int
    inter: int
    experts: int
    k: int
    bits: int = 4
    block_size: int = 32  # 0: row-wise scales
    activation: str = "swiglu"
    swiglu_fusion: int = 1
    dtype: str = "float32"
    scale_dtype: str | None = None  # T2 of the scales; None: dtype (ORT lets them differ)
    fc1_bias: bool = False
    fc2_bias: bool = False
    fc3_bias: bool = False
    zero_points: bool | tuple = False  # True: every weight; or the weights that get them, e.g. ("fc3",)
    router_weights: bool = False  # input 14 (a graph input)
    accuracy_level: int | None = None
    normalize_routing_weights: int = 0
    activation_alpha: float | None = None
    activation_beta: float | None = None
    swiglu_limit: float | None = None
    input_rank: int = 2
    scale_rank3_rowwise: bool = False  # row-wise scales as [E, N, 1]
    random_codes: bool = False  # benchmarks: uniform random codes, no float weights, no w["deq"]
    extra_attrs: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.dtype = canon_dtype(self.dtype)
        self.scale_dtype = canon_dtype(self.scale_dtype or self.dtype)

    def has_zero_points(self, key: str) -> bool:
        return self.zero_points is True or (isinstance(self.zero_points, tuple) and key in self.zero_points)

    @property
    def gated(self) -> bool:
        return self.activation in GATED

    @property
    def has_fc3(self) -> bool:
        return self.gated and self.swiglu_fusion == 0

    @property
    def fc1_rows(self) -> int:
        return 2 * self.inter if (self.gated and not self.has_fc3) else self.inter

    def attributes(self) -> dict:
        a = {"k": self.k, "activation_type": self.activation, "expert_weight_bits": self.bits,
             "normalize_routing_weights": self.normalize_routing_weights}
        if self.block_size:
            a["block_size"] = self.block_size
        if self.gated:
            a["swiglu_fusion"] = self.swiglu_fusion
        for key in ("activation_alpha", "activation_beta", "swiglu_limit", "accuracy_level"):
            if getattr(self, key) is not None:
                a[key] = getattr(self, key)
        a.update(self.extra_attrs)
        return a

    def packed_bytes(self) -> int:
        """Bytes of one expert's codes plus scales (what the kernels stream)."""
        item = np_dtype(self.scale_dtype).itemsize
        total = 0
        for rows, cols in self.matrices():
            nb = -(-cols // self.block_size) if self.block_size else 1
            total += rows * cols * self.bits // 8 + rows * nb * item
        return total

    def matrices(self) -> list[tuple[int, int]]:
        m = [(self.fc1_rows, self.hidden), (self.hidden, self.inter)]
        if self.has_fc3:
            m.append((self.inter, self.hidden))
        return m


def pack_zero_points(zp: np.ndarray, bits: int, blockwise: bool) -> np.ndarray:
    """Unpacked zero points ``[E, N, nb]`` -> ORT's packed layout: row-wise
    ``[E, ceil(N/pack)]`` (row n in byte n/pack), block-wise
    ``[E, N, ceil(nb/pack)]`` (block b in byte b/pack); low bits first."""
    pack = 8 // bits
    v = zp[..., 0] if not blockwise else zp
    pad = (-v.shape[-1]) % pack
    v = np.pad(v.astype(np.uint8), [(0, 0)] * (v.ndim - 1) + [(0, pad)])
    v = v.reshape(*v.shape[:-1], -1, pack)
    out = np.zeros(v.shape[:-1], np.uint8)
    for i in range(pack):
        out |= (v[..., i] & ((1 << bits) - 1)) << (i * bits)
    return out


def _quantised(cfg: QMoEConfig, rows: int, cols: int, rng: np.random.Generator, zero_points: bool):
    dt = np_dtype(cfg.scale_dtype)
    if cfg.random_codes:  # GB-sized layers: no float64 weights
        nb = -(-cols // cfg.block_size) if cfg.block_size else 1
        packed = rng.integers(0, 256, size=(cfg.experts, rows, cols * cfg.bits // 8), dtype=np.uint8)
        shape = (cfg.experts, rows, nb) if cfg.block_size else (cfg.experts, rows)
        scales = (rng.uniform(0.5, 1.5, size=shape) / (np.sqrt(cols) * 2 ** (cfg.bits - 1))).astype(dt)
        return packed, scales, None, None
    w = rng.uniform(-1, 1, size=(cfg.experts, rows, cols)) / np.sqrt(cols)
    packed, scales = qmoe_quant.quantize(w, cfg.bits, cfg.block_size)
    scales = scales.astype(dt)
    nb = -(-cols // cfg.block_size) if cfg.block_size else 1
    zp_unpacked = None
    zp_packed = None
    if zero_points:
        zp_unpacked = rng.integers(0, 2 ** cfg.bits, size=(cfg.experts, rows, nb))
        zp_packed = pack_zero_points(zp_unpacked, cfg.bits, nb > 1)
    s_full = scales if cfg.block_size else scales[..., None]
    deq = qmoe_quant.dequantize(packed, s_full if nb > 1 else s_full[..., 0], cfg.bits,
                                cfg.block_size if nb > 1 else 0,
                                None if zp_unpacked is None else (zp_unpacked if nb > 1 else zp_unpacked[..., 0]))
    if not cfg.block_size and cfg.scale_rank3_rowwise:
        scales = scales[..., None]
    return packed, scales, zp_packed, deq


def build_qmoe_model(cfg: QMoEConfig, rng: np.random.Generator, name: str = "qmoe"):
    dt = np_dtype(cfg.dtype)
    et = onnx_dtype(cfg.dtype)
    st = onnx_dtype(cfg.scale_dtype)
    w: dict = {"deq": {}}
    mats = {"fc1": (cfg.fc1_rows, cfg.hidden), "fc2": (cfg.hidden, cfg.inter)}
    if cfg.has_fc3:
        mats["fc3"] = (cfg.inter, cfg.hidden)
    for key, (rows, cols) in mats.items():
        packed, scales, zp, deq = _quantised(cfg, rows, cols, rng, cfg.has_zero_points(key))
        w[key], w[key + "_scales"], w["deq"][key] = packed, scales, deq
        if zp is not None:
            w[key + "_zp"] = zp
        if getattr(cfg, key + "_bias"):
            w[key + "_bias"] = (rng.uniform(-0.5, 0.5, size=(cfg.experts, rows))).astype(dt)
    by_input = {"fc1_experts_weights": "fc1", "fc1_scales": "fc1_scales", "fc1_experts_bias": "fc1_bias",
                "fc2_experts_weights": "fc2", "fc2_scales": "fc2_scales", "fc2_experts_bias": "fc2_bias",
                "fc3_experts_weights": "fc3", "fc3_scales": "fc3_scales", "fc3_experts_bias": "fc3_bias",
                "fc1_zero_points": "fc1_zp", "fc2_zero_points": "fc2_zp", "fc3_zero_points": "fc3_zp"}
    inits, node_inputs = [], []
    for iname in QMOE_INPUTS:
        key = by_input.get(iname)
        if key is not None and key in w:
            arr = w[key]
            elem = TensorProto.UINT8 if arr.dtype == np.uint8 else (st if iname.endswith("_scales") else et)
            inits.append(helper.make_tensor(iname, elem, list(arr.shape), vals=arr.tobytes(), raw=True))
            node_inputs.append(iname)
        elif iname in ("input", "router_probs") or (iname == "router_weights" and cfg.router_weights):
            node_inputs.append(iname)
        else:
            node_inputs.append("")
    while node_inputs and node_inputs[-1] == "":
        node_inputs.pop()
    x_shape = ["tokens", cfg.hidden] if cfg.input_rank == 2 else ["batch", "seq", cfg.hidden]
    inputs = [helper.make_tensor_value_info("input", et, x_shape),
              helper.make_tensor_value_info("router_probs", et, ["tokens", cfg.experts])]
    if cfg.router_weights:
        inputs.append(helper.make_tensor_value_info("router_weights", et, ["tokens", cfg.experts]))
    outputs = [helper.make_tensor_value_info("output", et, x_shape)]
    node = helper.make_node("QMoE", node_inputs, ["output"], name="qmoe_node", domain=MS_DOMAIN,
                            **cfg.attributes())
    graph = helper.make_graph([node], name, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS_DOMAIN, 1)],
                              producer_name="hinamoe.models")
    model.ir_version = 8
    return model, w


def qmoe_feeds(cfg: QMoEConfig, x: np.ndarray, logits: np.ndarray, router_weights=None) -> dict:
    feeds = {"input": x, "router_probs": logits}
    if cfg.router_weights:
        feeds["router_weights"] = router_weights
    return feeds
