"""Few-layer random HF checkpoints at the shapes of real MoE models, for
benchmarks of the exported (and fused) graph.

Expert dimensions (H, I, top-k) come from ``shapes.SHAPES``; attention
dimensions from the real configs. The number of experts defaults to the
benchmark's ``bench_experts`` (fewer than the real E, so the model fits in
memory while its experts still stream from DRAM), the depth to 1 layer and
the vocabulary to 4096 (a real vocabulary would make the embedding and the
LM head dwarf one layer). Weights are random, so the text is meaningless;
the shapes and the per-token work are the real ones.

    python -m hinamoe.models.hf_real_shape qwen3-30b-a3b OUT_DIR [--layers 2] [--experts 32]
    hina-export OUT_DIR OUT_DIR-onnx --dtype bf16
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .hf_tiny import BOS, EOS, INIT_STD, PAD, add_mxfp4_experts, build, plain_rope
from .shapes import get_shape

# shape name -> (HF model_type, config fields besides the expert shape)
REAL_MODELS: dict[str, tuple[str, dict]] = {
    "qwen3-30b-a3b": ("qwen3_moe", dict(num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                                        norm_topk_prob=True, rope_theta=1e6)),
    "qwen3-235b-a22b": ("qwen3_moe", dict(num_attention_heads=64, num_key_value_heads=4, head_dim=128,
                                          norm_topk_prob=True, rope_theta=1e6)),
    "qwen2-57b-a14b": ("qwen2_moe", dict(num_attention_heads=28, num_key_value_heads=4,
                                         shared_expert_intermediate_size=20480,
                                         norm_topk_prob=False, rope_theta=1e6)),
    "mixtral-8x7b": ("mixtral", dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                                     rope_theta=1e6)),
    "mixtral-8x22b": ("mixtral", dict(num_attention_heads=48, num_key_value_heads=8, head_dim=128,
                                      rope_theta=1e6)),
    "gpt-oss-20b": ("gpt_oss", dict(num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                                    sliding_window=128, rope_theta=150000.0)),
}


# gpt-oss's released RoPE (YaRN), which onnxruntime-genai's builder requires.
GPT_OSS_YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}


def real_shape_config(name: str, layers: int = 1, experts: int | None = None, vocab: int = 4096,
                      genai: bool = False):
    """transformers config of `name` (a shapes.SHAPES name or alias) with
    `layers` layers and `experts` routed experts (default: bench_experts).
    genai: gpt-oss with its released YaRN RoPE (transformers 5), for
    onnxruntime-genai's builder."""
    from transformers import AutoConfig

    shape = get_shape(name)
    if shape.name not in REAL_MODELS:
        raise ValueError(f"no HF recipe for {shape.name!r}; have: {', '.join(REAL_MODELS)}")
    model_type, fields = REAL_MODELS[shape.name]
    fields = dict(fields)
    fields.update(plain_rope(fields.pop("rope_theta")))  # real gpt-oss uses YaRN; the shapes are what count here
    experts = experts or shape.default_bench_experts
    if not shape.k <= experts:
        raise ValueError(f"{shape.name}: top-k {shape.k} needs at least {shape.k} experts, got {experts}")
    common = dict(vocab_size=vocab, hidden_size=shape.hidden, num_hidden_layers=layers,
                  num_experts_per_tok=shape.k, max_position_embeddings=4096,
                  initializer_range=INIT_STD / 5, bos_token_id=BOS, eos_token_id=EOS,
                  pad_token_id=PAD, tie_word_embeddings=False, **fields)
    if model_type == "mixtral":
        extra = dict(intermediate_size=shape.inter, num_local_experts=experts, sliding_window=None)
    elif model_type == "gpt_oss":
        extra = dict(intermediate_size=shape.inter, num_local_experts=experts,
                     layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                                  for i in range(layers)])
    else:  # qwen2_moe, qwen3_moe
        extra = dict(moe_intermediate_size=shape.inter, num_experts=experts, decoder_sparse_step=1,
                     mlp_only_layers=[], use_sliding_window=False)
    config = AutoConfig.for_model(model_type, **common, **extra)
    if genai and model_type == "gpt_oss":
        if not hasattr(config, "rope_parameters"):
            raise ValueError("genai=True (onnxruntime-genai's builder) needs transformers 5")
        config.rope_parameters = dict(GPT_OSS_YARN)
        config.max_position_embeddings = 131072
    return config


def build_real_shape(name: str, out_dir: str | Path, layers: int = 1, experts: int | None = None,
                     vocab: int = 4096, seed: int = 0, genai: bool = False) -> Path:
    """genai: gpt-oss gets its released YaRN RoPE and MXFP4 expert tensors
    (the builder quantises int4/int8 from those)."""
    config = real_shape_config(name, layers, experts, vocab, genai=genai)
    out = build(config.model_type, out_dir, seed=seed, config=config)
    if genai and config.model_type == "gpt_oss":
        add_mxfp4_experts(out)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m hinamoe.models.hf_real_shape",
        description="Build a few-layer random HF checkpoint at a real MoE model's shape.")
    p.add_argument("name", choices=sorted(REAL_MODELS), help="real model whose shape to use")
    p.add_argument("out_dir", help="checkpoint folder to write")
    p.add_argument("--layers", type=int, default=1, help="decoder layers (default 1)")
    p.add_argument("--experts", type=int, default=None,
                   help="routed experts (default: the benchmark's bench_experts for this shape)")
    p.add_argument("--vocab", type=int, default=4096, help="vocabulary size (default 4096)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--genai", action="store_true",
                   help="for onnxruntime-genai's builder (transformers 5): gpt-oss with YaRN RoPE and MXFP4 experts")
    args = p.parse_args(argv)
    print(build_real_shape(args.name, args.out_dir, args.layers, args.experts, args.vocab, args.seed, args.genai))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
