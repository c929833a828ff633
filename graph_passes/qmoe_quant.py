"""Weight quantisation in QMoE's layout (com.microsoft::QMoE, ORT >= 1.23).

A weight ``W [..., N, K]`` (PyTorch ``[out, in]``) becomes

* ``packed uint8 [..., N, K * bits / 8]``: row-major along K; value c of a
  row sits in byte ``c // (8 // bits)`` at bit ``(c % (8 // bits)) * bits``
  (4-bit: the even element in the low nibble);
* ``scales [..., N]`` (row-wise, ``block_size=0``) or
  ``[..., N, ceil(K / block_size)]`` (block-wise; when block_size does not
  divide K the last block holds the remaining ``K % block_size`` elements,
  as ORT's CPU QMoE reads it);

with ``w = (q - zp) * scale`` and zero point ``zp = 2**(bits-1)`` (8 / 128)
when the node has no zero-point input. ``quantize`` is symmetric (what
onnxruntime-genai's builder emits); ``dequantize`` also takes explicit
unpacked zero points, one per scale.

Used by the export's int4/int8 pass, the QMoE model builders and the tests'
float64 reference; no ONNX types here, numpy only.
"""

from __future__ import annotations

import numpy as np

BITS = (4, 8)


def _check(bits: int, k: int, block_size: int) -> None:
    if bits not in BITS:
        raise ValueError(f"bits={bits}: QMoE weights here are 4 or 8 bits")
    if k * bits % 8:
        raise ValueError(f"K={k} does not fill whole bytes at {bits} bits")
    if block_size:
        if block_size < 16 or block_size & (block_size - 1):
            raise ValueError(f"block_size={block_size}: expected a power of two >= 16 (or 0: row-wise)")


def _blocks(x: np.ndarray, bs: int) -> np.ndarray:
    """``x [..., K]`` -> ``[..., ceil(K/bs), bs]``, the partial last block zero-padded."""
    k = x.shape[-1]
    nb = -(-k // bs)
    if nb * bs != k:
        x = np.concatenate([x, np.zeros(x.shape[:-1] + (nb * bs - k,), x.dtype)], axis=-1)
    return x.reshape(*x.shape[:-1], nb, bs)


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned codes ``q [..., K]`` (0 <= q < 2**bits) -> bytes ``[..., K*bits/8]``."""
    q = np.asarray(q).astype(np.uint8)
    if bits == 8:
        return q
    lo, hi = q[..., 0::2], q[..., 1::2]
    return (lo & 0x0F) | ((hi & 0x0F) << 4)


def unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    """Bytes ``[..., K*bits/8]`` -> unsigned codes ``[..., K]`` (uint8)."""
    packed = np.asarray(packed, dtype=np.uint8)
    if bits == 8:
        return packed
    out = np.empty(packed.shape[:-1] + (packed.shape[-1] * 2,), np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


def quantize(w: np.ndarray, bits: int, block_size: int = 32,
             scale_dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric quantisation of ``w [..., N, K]``; returns (packed, scales
    in ``scale_dtype``).

    ``scale = max|w| / (2**(bits-1) - 1)`` per row (``block_size=0``) or per
    block of ``block_size`` along K, rounded to ``scale_dtype`` before the
    codes are taken against it; codes ``round(w / scale) + zp`` clipped to
    ``[0, 2**bits - 1]``. An all-zero block gets scale 1 (codes = zp).
    Arithmetic in float32 (float64 for float64 input): an export quantises
    every expert of the model here, 3x faster than in float64.
    """
    w = np.asarray(w)
    work = np.float64 if w.dtype == np.float64 else np.float32
    w = w.astype(work, copy=False)
    *lead, n, k = w.shape
    _check(bits, k, block_size)
    bs = block_size or k
    blocks = _blocks(w, bs)
    qmax = 2 ** (bits - 1) - 1
    scale = (np.abs(blocks).max(axis=-1) / qmax).astype(np.float32)
    scale[scale == 0] = 1.0
    scale = scale.astype(scale_dtype)
    q = np.rint(blocks / scale[..., None].astype(work))
    q += 2 ** (bits - 1)
    np.clip(q, 0, 2 ** bits - 1, out=q)
    scales = scale if block_size else scale[..., 0]
    return pack(q.reshape(*lead, n, -1)[..., :k], bits), scales


def dequantize(packed: np.ndarray, scales: np.ndarray, bits: int, block_size: int,
               zero_points: np.ndarray | None = None) -> np.ndarray:
    """float64 ``W [..., N, K]`` from QMoE's packed codes and scales.

    ``scales`` (any float dtype, ml_dtypes.bfloat16 included) is ``[..., N]``
    when ``block_size`` is 0, else ``[..., N, ceil(K / block_size)]``;
    ``zero_points`` (unpacked, same shape as ``scales``) defaults to 2**(bits-1).
    """
    q = unpack(packed, bits).astype(np.float64)
    *lead, n, k = q.shape
    _check(bits, k, block_size)
    s = np.asarray(scales).astype(np.float64)
    zp = (np.full(s.shape, 2.0 ** (bits - 1)) if zero_points is None
          else np.asarray(zero_points).astype(np.float64))
    if not block_size:
        s, zp = s[..., None], zp[..., None]
    bs = block_size or k
    if s.shape != tuple(lead) + (n, -(-k // bs)):
        raise ValueError(f"scales {np.shape(scales)} do not fit W {tuple(lead) + (n, k)} "
                         f"with block_size={block_size}")
    rows = _blocks(q, bs)
    return ((rows - zp[..., None]) * s[..., None]).reshape(*lead, n, -1)[..., :k]
