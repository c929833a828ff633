"""Expert shapes of real MoE models (DESIGN.md section 8).

Only the routed-expert FFN matters here: hidden size ``H``, expert intermediate
size ``I``, number of routed experts ``E`` and experts per token ``k``. Shared
experts are not part of the ``com.microsoft::MoE`` node and are left out.

``bench_experts`` is how many experts the benchmark instantiates by default:
fewer than the real ``E`` so the layer fits in memory, but enough that the
expert bytes are several times the last-level cache so that rotating the
active experts between repetitions streams weights from DRAM.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class MoEShape:
    name: str
    hidden: int  # H
    inter: int  # I (per expert)
    experts: int  # E (real model)
    k: int  # top-k
    activation: str = "swiglu"
    bench_experts: int = 0  # experts instantiated by the benchmark (0 = real E)
    hf_name: str = ""
    note: str = ""

    @property
    def params_per_expert(self) -> int:
        """Weights of one gated expert: gate + up (2*I*H) and down (H*I)."""
        mult = 3 if self.activation in ("swiglu", "geglu") else 2
        return mult * self.hidden * self.inter

    def expert_bytes(self, itemsize: int) -> int:
        return self.params_per_expert * itemsize

    def with_experts(self, experts: int) -> "MoEShape":
        return replace(self, bench_experts=experts)

    @property
    def default_bench_experts(self) -> int:
        return self.bench_experts or self.experts


# Real shapes. bench_experts: qwen3-30b 32 x 18.9 MB (f32) = 604 MB;
# mixtral 4 x 704 MB = 2.8 GB f32; deepseek 16 x 176 MB = 2.8 GB f32.
SHAPES: dict[str, MoEShape] = {
    s.name: s
    for s in [
        MoEShape("qwen3-30b-a3b", 2048, 768, 128, 8, bench_experts=32,
                 hf_name="Qwen/Qwen3-30B-A3B"),
        MoEShape("qwen3-235b-a22b", 4096, 1536, 128, 8, bench_experts=16,
                 hf_name="Qwen/Qwen3-235B-A22B"),
        MoEShape("qwen2-57b-a14b", 3584, 2560, 64, 8, bench_experts=16,
                 hf_name="Qwen/Qwen2-57B-A14B", note="+ shared expert 20480 (not in the node)"),
        MoEShape("mixtral-8x7b", 4096, 14336, 8, 2, bench_experts=4,
                 hf_name="mistralai/Mixtral-8x7B-v0.1"),
        MoEShape("mixtral-8x22b", 6144, 16384, 8, 2, bench_experts=4,
                 hf_name="mistralai/Mixtral-8x22B-v0.1"),
        MoEShape("deepseek-v3", 7168, 2048, 256, 8, bench_experts=16,
                 hf_name="deepseek-ai/DeepSeek-V3", note="+1 shared expert (not in the node)"),
        MoEShape("gpt-oss-20b", 2880, 2880, 32, 4, bench_experts=8,
                 hf_name="openai/gpt-oss-20b", note="swiglu alpha=1.702, limit=7, beta=1"),
    ]
}

ALIASES = {
    "qwen3-30b": "qwen3-30b-a3b",
    "qwen3-235b": "qwen3-235b-a22b",
    "qwen2-57b": "qwen2-57b-a14b",
    "mixtral": "mixtral-8x7b",
    "deepseek": "deepseek-v3",
    "gpt-oss": "gpt-oss-20b",
}

DEFAULT_BENCH_MODELS = ("qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3")


def get_shape(name: str) -> MoEShape:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in SHAPES:
        raise KeyError(f"unknown model shape {name!r}; known: {', '.join(SHAPES)}")
    return SHAPES[key]


def list_shapes() -> list[MoEShape]:
    return list(SHAPES.values())
