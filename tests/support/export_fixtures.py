"""Tiny checkpoints and their exports, made once per test session.

``conftest.tiny_export`` hands out one ``TinyExports``; ``tiny_export(arch)``
builds the tiny random checkpoint of `arch` (weights seeded from the run's
seed) and its unfused optimum export on first use, then reuses them;
``tiny_export.fused(arch, dtype)`` does the same for a full hina-export
(int4/int8: of ``checkpoint(arch, quantisable=True)``, see QUANT_SIZES).
Export is the slow part (~10 s per model), so tests share these.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss")
# hf_tiny's expert sizes are not all multiples of 32, QMoE's default block;
# the int4/int8 exports use checkpoints with these sizes changed so that they
# are. Attention and shared experts keep sizes that are not (96 heads x 16,
# 72): MatMulNBits pads K there.
QUANT_SIZES = {"mixtral": {"intermediate_size": 96}, "qwen2_moe": {"moe_intermediate_size": 64},
               "qwen3_moe": {"hidden_size": 96, "moe_intermediate_size": 64}, "gpt_oss": {"intermediate_size": 64}}
INT_DTYPES = ("int4", "int8")
# Architectures whose MoE blocks go through hinamoe's all-experts patcher.
PATCHED_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")


@dataclass
class TinyExport:
    arch: str
    checkpoint: Path  # HF folder
    model: Path  # model.onnx

    def torch_model(self):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.checkpoint).eval()


class TinyExports:
    def __init__(self, root: Path, seed: int):
        self.root = Path(root)
        self.seed = seed
        self._checkpoints: dict[str, Path] = {}
        self._exports: dict[tuple, TinyExport] = {}

    def checkpoint(self, arch: str, quantisable: bool = False) -> Path:
        from hinamoe.models.hf_tiny import RECIPES, build

        key = arch + ("-q" if quantisable else "")
        if key not in self._checkpoints:
            seed = (self.seed ^ zlib.crc32(arch.encode())) & 0xFFFFFFFF
            config = None
            if quantisable:
                config = RECIPES[arch]()
                for name, value in QUANT_SIZES[arch].items():
                    setattr(config, name, value)
            self._checkpoints[key] = build(arch, self.root / "hf" / key, seed=seed, config=config)
        return self._checkpoints[key]

    def __call__(self, arch: str) -> TinyExport:
        """The unfused export (optimum + our patcher, no passes)."""
        from hinamoe.export import export_unfused

        key = (arch, "unfused")
        if key not in self._exports:
            ckpt = self.checkpoint(arch)
            model = export_unfused(ckpt, self.root / "unfused" / arch)
            self._exports[key] = TinyExport(arch, ckpt, model)
        return self._exports[key]

    def fused(self, arch: str, dtype: str = "fp32") -> TinyExport:
        """The full hina-export (passes run, report written)."""
        from hinamoe.export import export

        key = (arch, dtype)
        if key not in self._exports:
            ckpt = self.checkpoint(arch, quantisable=dtype in INT_DTYPES)
            model, _ = export(ckpt, self.root / f"fused-{dtype}" / arch, dtype=dtype, progress=False)
            self._exports[key] = TinyExport(arch, ckpt, model)
        return self._exports[key]
