"""The fastest a benchmark point can run: the lower of the read bandwidth and
the compute rate (FMA or AMX tiles) per byte streamed."""

from __future__ import annotations

def on_tiles(tier: str | None, dtype: str, tokens_per_expert: int) -> bool:
    """Whether a `hina-bench ffn` point runs on the amx tier's bf16 tiles: bf16
    MoE weights always (the HiNa micro-kernel), QMoE from 16 tokens per
    expert for int4 and 32 for int8 (64 and 128 with int8 tokens, the -al4
    rows; ops.md)."""
    if tier != "amx":
        return False
    if dtype == "bf16":
        return True
    if dtype.startswith("int"):
        least = (64 if dtype.endswith("-al4") else 16) * (2 if dtype.startswith("int8") else 1)
        return tokens_per_expert >= least
    return False


def fma_bits_for_tier(tier: str | None) -> int:
    """The FMA width of a HinaMoE tier's float kernels: 512 on avx512 (and
    amx, whose f32/f16 MoE and QMoE run those), else 256."""
    return 512 if tier in ("avx512", "amx") else 256


def roofline_gbs(bandwidth_gbs: float | None, fma_per_s: float | None, bytes_per_elem: int,
                 fmas_per_elem: int) -> float | None:
    """The fastest a stream can run (GB/s) when each element read takes
    `fmas_per_elem` FMAs (a weight at n tokens per expert: n; a K/V element
    in GQA decode: G): the lower of the read bandwidth and FMA rate x bytes
    per element / FMAs per element."""
    if not bandwidth_gbs:
        return None
    if not fma_per_s:
        return bandwidth_gbs
    return min(bandwidth_gbs, fma_per_s * bytes_per_elem / fmas_per_elem / 1e9)
