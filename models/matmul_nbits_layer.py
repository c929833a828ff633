"""Build single ``com.microsoft::MatMulNBits`` nodes: random 4- or 8-bit codes
(the padding of a partial last block random too, so a kernel that reads it
is caught), scales, optional zero points and bias, in ORT's layout.

    cfg = MatMulNBitsConfig(K=2048, N=4096, bits=4, block_size=32)
    model, parts = build_matmul_nbits_model(cfg, rng)
    y = sess.run(None, {"A": a})[0]          # a: [batch, seq, K] in cfg.dtype

``parts`` holds what the node encodes, unpacked (codes ``[N, K]``, scales
``[N, nb]`` as stored, zero points ``[N, nb]``, bias), for references.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from .moe_layer import MS_DOMAIN, _tensor_from_array, np_dtype, onnx_dtype


@dataclass
class MatMulNBitsConfig:
    K: int
    N: int
    bits: int = 4
    block_size: int = 32
    dtype: str = "float32"
    zero_points: bool = False
    bias: bool = False
    accuracy_level: int | None = None  # None: attribute absent
    input_rank: int = 3                 # A [batch, seq, K] (3) or [M, K] (2)

    @property
    def blocks(self) -> int:
        return -(-self.K // self.block_size)

    def weight_bytes(self) -> int:
        return self.N * self.blocks * self.block_size * self.bits // 8

    def describe(self) -> str:
        extra = "".join([", zero points" if self.zero_points else "", ", bias" if self.bias else "",
                         f", accuracy_level={self.accuracy_level}" if self.accuracy_level is not None else ""])
        return f"K={self.K} N={self.N} int{self.bits} block {self.block_size} {self.dtype}{extra}"


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """[..., L] ints in [0, 2**bits) -> bytes, element j at bit (j % pack)*bits
    of byte j // pack (4-bit: even element in the low nibble)."""
    pack = 8 // bits
    c = codes.astype(np.uint8).reshape(*codes.shape[:-1], -1, pack)
    out = np.zeros(c.shape[:-1], np.uint8)
    for i in range(pack):
        out |= c[..., i] << (i * bits)
    return out


def build_matmul_nbits_model(cfg: MatMulNBitsConfig, rng: np.random.Generator, name: str = "mmnb"):
    """(ModelProto, parts): one MatMulNBits node, A a graph input, every
    weight an initializer."""
    dt = np_dtype(cfg.dtype)
    K, N, bits, bs, nb = cfg.K, cfg.N, cfg.bits, cfg.block_size, cfg.blocks
    codes = rng.integers(0, 2 ** bits, size=(N, nb * bs))  # the padding past K included
    scales = (rng.uniform(0.5, 1.5, size=(N, nb)) / (np.sqrt(K) * 2 ** (bits - 1))).astype(dt)
    zp = rng.integers(0, 2 ** bits, size=(N, nb)) if cfg.zero_points else None
    bias = (rng.standard_normal(N) * 0.5).astype(dt) if cfg.bias else None

    b = pack_codes(codes, bits).reshape(N, nb, bs * bits // 8)
    inits = [_tensor_from_array(f"{name}.B", b, TensorProto.UINT8),
             _tensor_from_array(f"{name}.scales", scales.reshape(-1), onnx_dtype(cfg.dtype))]
    inputs = ["A", f"{name}.B", f"{name}.scales"]
    if zp is not None:
        pad = (-nb) % (8 // bits)
        zp_packed = pack_codes(np.pad(zp, [(0, 0), (0, pad)]), bits).reshape(-1)
        inits.append(_tensor_from_array(f"{name}.zero_points", zp_packed, TensorProto.UINT8))
        inputs.append(f"{name}.zero_points")
    if bias is not None:
        inputs += [""] * (5 - len(inputs)) + [f"{name}.bias"]
        inits.append(_tensor_from_array(f"{name}.bias", bias, onnx_dtype(cfg.dtype)))
    attrs = {"K": K, "N": N, "bits": bits, "block_size": bs}
    if cfg.accuracy_level is not None:
        attrs["accuracy_level"] = cfg.accuracy_level
    node = helper.make_node("MatMulNBits", inputs, ["Y"], name=name, domain=MS_DOMAIN, **attrs)
    lead = ["batch", "seq"] if cfg.input_rank == 3 else ["M"]
    graph = helper.make_graph(
        [node], name,
        [helper.make_tensor_value_info("A", onnx_dtype(cfg.dtype), lead + [K])],
        [helper.make_tensor_value_info("Y", onnx_dtype(cfg.dtype), lead + [N])],
        initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)])
    model.ir_version = 10
    return model, {"codes": codes[:, :K], "scales": scales, "zero_points": zp, "bias": bias,
                   "block_size": bs, "bits": bits}
