"""Tiny checkpoints and their exports, made once per test session.

``conftest.tiny_export`` hands out one ``TinyExports``; ``tiny_export(arch)``
builds the tiny random checkpoint of `arch` (weights seeded from the run's
seed) and its unfused optimum export on first use, then reuses them;
``tiny_export.fused(arch, dtype)`` does the same for a full hina-export.
Export is the slow part (~10 s per model), so tests share these.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss")
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

    def checkpoint(self, arch: str) -> Path:
        from hinamoe.models.hf_tiny import build

        if arch not in self._checkpoints:
            seed = (self.seed ^ zlib.crc32(arch.encode())) & 0xFFFFFFFF
            self._checkpoints[arch] = build(arch, self.root / "hf" / arch, seed=seed)
        return self._checkpoints[arch]

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
            ckpt = self.checkpoint(arch)
            model, _ = export(ckpt, self.root / f"fused-{dtype}" / arch, dtype=dtype, progress=False)
            self._exports[key] = TinyExport(arch, ckpt, model)
        return self._exports[key]
