"""What this onnxruntime and this CPU run: schema features of the installed
onnxruntime, the kernel tiers this CPU has, and when the bf16 tile kernel
is in effect."""

from __future__ import annotations

import pytest

import hinamoe

# The bf16 tile kernel (QMoE / MatMulNBits groups of >= 16 tokens on the amx
# tiers) is off in the tests (conftest.py sets HINAMOE_BF16_TILES); the tile
# tests turn it on by provider option.
TILES_ON = {"bf16_tiles": "auto"}


def _ms_schema(op: str):
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    for schema in C.get_all_operator_schema():
        if schema.name == op and schema.domain == "com.microsoft":
            return schema
    return None


# swiglu_limit_after_activation entered the MoE schema in onnxruntime 1.32.
ORT_HAS_LIMIT_AFTER_ACTIVATION = "swiglu_limit_after_activation" in set(_ms_schema("MoE").attributes)
# Inputs of this onnxruntime's GroupQueryAttention (query_seqlens is 1.32+).
ORT_GQA_INPUTS = {i.name for i in _ms_schema("GroupQueryAttention").inputs}


def _ort_version() -> tuple[int, int]:
    import onnxruntime as ort

    major, minor = ort.__version__.split(".")[:2]
    return int(major), int(minor)


# Before 1.32 the CPU EP's float16 MoE returns zeros for some rows (seen on
# 1.30 and 1.31 with T=1): no reference to compare against there.
CPU_EP_F16_MOE_OK = _ort_version() >= (1, 32)



def available_isas() -> list[str]:
    """Kernel tiers this CPU runs (amx-emu always: it is the emulator)."""
    return [isa for isa in ("ref", "avx2", "avx512", "amx", "amx-emu") if not hinamoe.tier_unavailable_reason(isa)]


def tiles_in_effect(isa: str, tokens: int, accuracy_level: int | None = None, bits: int = 4) -> bool:
    """Whether QMoE / MatMulNBits run a group of `tokens` tokens on the bf16
    tile kernel (weights and tokens rounded to bf16): the amx tiers, from
    16 tokens for 4-bit weights and 32 for 8-bit (64 and 128 at
    accuracy_level 4, where the int8-token kernels run below), where
    accuracy_level allows bf16 (absent, 0, 3, 4)."""
    tier = hinamoe.best_tier() if isa == "auto" else isa
    level = accuracy_level or 0
    least = (64 if level == 4 else 16) * (2 if bits == 8 else 1)
    return tier in ("amx", "amx-emu") and tokens >= least and level not in (1, 2)


def require_isa(isa: str) -> None:
    if isa not in available_isas():
        pytest.skip(f"isa {isa} not available on this CPU: {hinamoe.tier_unavailable_reason(isa)}")
