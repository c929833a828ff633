"""QMoE test cases: random inputs for a QMoEConfig, a run on a session, and
the tolerance factor of the int8-token paths."""

from __future__ import annotations

from hinamoe.models import QMoEConfig, run_moe
from hinamoe.models.moe_layer import np_dtype


def qmoe_inputs(cfg: QMoEConfig, tokens: int, rng, batch: int = 1):
    dt = np_dtype(cfg.dtype)
    x = rng.standard_normal((tokens, cfg.hidden)).astype(dt)
    lg = (rng.standard_normal((tokens, cfg.experts)) * 2).astype(dt)
    rw = rng.uniform(0.01, 1.0, size=(tokens, cfg.experts)).astype(dt) if cfg.router_weights else None
    if cfg.input_rank == 3:
        x = x.reshape(batch, tokens // batch, cfg.hidden)
    return x, lg, rw


def run_qmoe(sess, cfg, x, lg, rw=None):
    out = run_moe(sess, x, lg, {"router_weights": rw} if cfg.router_weights else None)
    assert out.shape == x.shape
    return out


def cpu_uses_int8(cfg: QMoEConfig) -> bool:
    """The CPU EP runs block-wise 8-bit experts, and block-wise 4-bit ones at
    accuracy_level 4, with int8 activations (MLAS QNBit)."""
    return cfg.block_size > 0 and (cfg.bits == 8 or cfg.accuracy_level == 4)


def int8_factor(cfg: QMoEConfig, hina: bool) -> float:
    """int8 tokens: ~2% of the output scale, more with larger blocks (one
    scale per block's max |x|) and with zero points."""
    uses = (cfg.block_size > 0 and cfg.accuracy_level == 4) if hina else cpu_uses_int8(cfg)
    if not uses:
        return 1.0
    return 1000.0 * max(1.0, cfg.block_size / 32) * (2.0 if cfg.zero_points else 1.0)
