"""Tiny random HuggingFace MoE checkpoints, built offline.

Each recipe makes a transformers config with small but non-trivial shapes
(E >= 4 experts, top-k >= 2, grouped-query attention with more q heads than
kv heads, 2 layers, sizes that are not powers of two), initialises the model
randomly from a seed and saves it with ``save_pretrained`` next to a
byte-level tokenizer, so the directory looks like a real checkpoint to
``hina-export`` and optimum. The same seed gives the same weights.

    python -m hinamoe.models.hf_tiny OUT_ROOT [--arch mixtral ...] [--seed 0]

writes ``OUT_ROOT/<arch>/``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

# Larger than transformers' default 0.02 so that router probabilities and the
# next-token logits are well separated: greedy decoding and top-k routing of a
# random model then do not hinge on near-ties that float rounding could flip.
INIT_STD = 0.1
VOCAB = 300  # 256 bytes + a few specials; not a power of two
BOS, EOS, PAD = 256, 257, 258


def plain_rope(theta: float) -> dict:
    """Config fields for plain (unscaled) rotary with base `theta`, spelt for
    the installed transformers: 4.x reads rope_theta/rope_scaling, 5.x a
    rope_parameters dict (and would give gpt-oss YaRN scaling by default)."""
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:
        return dict(rope_parameters={"rope_type": "default", "rope_theta": theta})
    return dict(rope_theta=theta, rope_scaling=None)


def _common(**overrides) -> dict:
    base = dict(
        vocab_size=VOCAB,
        num_hidden_layers=2,
        max_position_embeddings=256,
        initializer_range=INIT_STD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
    )
    base.update(overrides)
    return base


def mixtral_config():
    from transformers import MixtralConfig

    # 6 q heads / 2 kv heads of 16; 6 experts, top-2, renormalised.
    return MixtralConfig(**_common(
        hidden_size=96, intermediate_size=80, num_attention_heads=6, num_key_value_heads=2,
        head_dim=16, num_local_experts=6, num_experts_per_tok=2, sliding_window=None,
        **plain_rope(10000.0)))


def qwen2_moe_config():
    from transformers import Qwen2MoeConfig

    # Shared expert with its sigmoid gate; routing weights NOT renormalised.
    return Qwen2MoeConfig(**_common(
        hidden_size=96, intermediate_size=112, moe_intermediate_size=40,
        shared_expert_intermediate_size=72, num_attention_heads=6, num_key_value_heads=2,
        num_experts=6, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[], use_sliding_window=False, **plain_rope(10000.0)))


def qwen3_moe_config():
    from transformers import Qwen3MoeConfig

    # head_dim * q heads (128) != hidden (80), as Qwen3 allows; renormalised.
    return Qwen3MoeConfig(**_common(
        hidden_size=80, intermediate_size=112, moe_intermediate_size=48,
        num_attention_heads=8, num_key_value_heads=2, head_dim=16, num_experts=8,
        num_experts_per_tok=3, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        use_sliding_window=False, **plain_rope(10000.0)))


def gpt_oss_config():
    from transformers import GptOssConfig

    return GptOssConfig(**_common(
        hidden_size=64, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], **plain_rope(10000.0)))


def gpt_oss_yarn_config():
    """gpt-oss as released, which onnxruntime-genai's builder requires:
    YaRN-scaled RoPE (factor 4 over 256 positions here; the builder wants its
    NTK ramp inside the 8 frequency pairs), expert sizes that are multiples
    of MXFP4's 32-value blocks."""
    cfg = gpt_oss_config()
    cfg.max_position_embeddings = 1024
    cfg.intermediate_size = 64
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256,
            "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}
    if hasattr(cfg, "rope_parameters"):  # transformers 5
        cfg.rope_parameters = yarn
    else:
        cfg.rope_scaling = {k: v for k, v in yarn.items() if k != "rope_theta"}
    return cfg


def lfm2_moe_config():
    """LFM2-MoE (transformers 5 only): short-convolution layers around one
    attention layer, a dense first layer, sigmoid routing with expert bias."""
    from transformers import Lfm2MoeConfig

    cfg = Lfm2MoeConfig(**_common(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=48, num_hidden_layers=3,
        num_dense_layers=1, num_attention_heads=4, num_key_value_heads=2, num_experts=4,
        num_experts_per_tok=2, layer_types=["conv", "full_attention", "conv"], norm_eps=1e-5,
        **plain_rope(10000.0)))
    cfg.architectures = ["Lfm2MoeForCausalLM"]
    return cfg


def qwen3_5_moe_config():
    """Qwen3.5-MoE (transformers 5 only) as onnxruntime-genai's builder takes
    it: the vision-language class (the builder knows no text-only one), with
    a one-block vision tower the text path never runs. A Gated-DeltaNet
    (linear attention) layer, then a full-attention one with its output gate
    and q/k norms; interleaved partial MRoPE (8 of 16 dims, sections 2/1/1);
    routed experts (renormalised top-2 of 4) beside a sigmoid-gated shared
    expert. Ids 259..262 are the (unused) image/video tokens."""
    from transformers import Qwen3_5MoeConfig

    text = _common(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, moe_intermediate_size=48,
        shared_expert_intermediate_size=80, num_experts=4, num_experts_per_tok=2,
        layer_types=["linear_attention", "full_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True})
    vision = dict(depth=1, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=4,
                  spatial_merge_size=2, temporal_patch_size=2, out_hidden_size=64,
                  num_position_embeddings=16, initializer_range=INIT_STD)
    cfg = Qwen3_5MoeConfig(text_config=text, vision_config=vision, image_token_id=259, video_token_id=260,
                           vision_start_token_id=261, vision_end_token_id=262, tie_word_embeddings=False)
    cfg.architectures = ["Qwen3_5MoeForConditionalGeneration"]
    return cfg


# Checkpoints for onnxruntime-genai's model builder (transformers 5), by the
# names its tests use.
GENAI_RECIPES: dict[str, Callable] = {
    "gpt_oss": gpt_oss_yarn_config,
    "lfm2_moe": lfm2_moe_config,
    "qwen3_5_moe": qwen3_5_moe_config,
}


# arch -> config factory. Keys are HF `model_type`s.
RECIPES: dict[str, Callable] = {
    "mixtral": mixtral_config,
    "qwen2_moe": qwen2_moe_config,
    "qwen3_moe": qwen3_moe_config,
    "gpt_oss": gpt_oss_config,
}


def byte_level_chars() -> dict[int, str]:
    """The printable character GPT-2's ByteLevel pre-tokenizer maps each byte
    to. Written out here because transformers moved its own copy between
    releases (4.x: tokenization_gpt2.bytes_to_unicode; 5.x: elsewhere)."""
    printable = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:  # the bytes that are not printable go, in order, to 256, 257, ...
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer():
    """A byte-level tokenizer over the 256 byte values plus bos/eos/pad, built
    without downloads (no merges: one token per byte)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in byte_level_chars().items()}
    assert set(vocab) == set(pre_tokenizers.ByteLevel.alphabet())
    vocab.update({"<s>": BOS, "</s>": EOS, "<pad>": PAD})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", padding_side="left",
                                   model_input_names=["input_ids", "attention_mask"])


def build(arch: str, out_dir: str | Path, seed: int = 0, config=None) -> Path:
    """Builds the tiny `arch` checkpoint (or one from `config`) into `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, GenerationConfig

    if config is None:
        if arch not in RECIPES:
            raise ValueError(f"no tiny recipe for {arch!r}; have: {', '.join(RECIPES)}")
        config = RECIPES[arch]()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    # A vision-language config (Qwen3.5-MoE's) saves its *ForConditionalGeneration
    # weights, the names its checkpoints and genai's builder use.
    auto = AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM
    model = auto.from_config(config, dtype=torch.float32).eval()
    model.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=EOS,
                                               pad_token_id=PAD, do_sample=False)
    model.save_pretrained(out)
    byte_tokenizer().save_pretrained(out)
    return out


FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # e2m1 magnitudes, codes 0..7 (bit 3: sign)


def mxfp4_quantize(w):
    """MXFP4 of w [..., N, K] (K a multiple of 32) as gpt-oss ships it:
    (blocks uint8 [..., N, K/32, 16], two codes per byte, even index in the
    low nibble; scales uint8 [..., N, K/32], exponent + 127; dequantised
    float32 [..., N, K])."""
    import numpy as np

    w = np.asarray(w, dtype=np.float64)
    blocks = w.reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = np.abs(blocks).max(axis=-1)
    exp = np.where(amax > 0, np.ceil(np.log2(np.where(amax > 0, amax, 1.0) / 6.0)), 0.0).clip(-127, 127)
    scaled = blocks / np.exp2(exp)[..., None]
    mags = np.asarray(FP4_VALUES)
    idx = np.abs(np.abs(scaled)[..., None] - mags).argmin(axis=-1).astype(np.uint8)
    codes = idx | np.where(scaled < 0, 8, 0).astype(np.uint8)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    deq = np.where(codes & 8, -1.0, 1.0) * mags[idx] * np.exp2(exp)[..., None]
    return packed, (exp + 127).astype(np.uint8), deq.reshape(w.shape).astype(np.float32)


def add_mxfp4_experts(ckpt_dir: str | Path) -> Path:
    """Gives a gpt-oss checkpoint the MXFP4 expert tensors of the released
    model (``*_blocks``/``*_scales``, which genai's builder quantises from
    for int4/int8) and replaces its float experts by their dequantised
    values, so every precision the builder makes is the same model."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    path = Path(ckpt_dir) / "model.safetensors"
    tensors = load_file(path)
    for name in [n for n in tensors if n.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj"))]:
        # HF keeps [E, in, out]; MXFP4 rows are output features: [E, out, in].
        # One expert at a time: real-shape experts are GBs in float64.
        parts = [mxfp4_quantize(w.T) for w in tensors[name]]
        tensors[name] = np.stack([np.ascontiguousarray(deq.T) for _, _, deq in parts])
        tensors[name + "_blocks"] = np.stack([b for b, _, _ in parts])
        tensors[name + "_scales"] = np.stack([sc for _, sc, _ in parts])
    save_file(tensors, path, metadata={"format": "pt"})
    return Path(ckpt_dir)


def build_all(root: str | Path, archs=None, seed: int = 0) -> dict[str, Path]:
    return {a: build(a, Path(root) / a, seed) for a in (archs or RECIPES)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m hinamoe.models.hf_tiny",
        description="Build tiny random HF MoE checkpoints (offline) into OUT_ROOT/<arch>/.")
    p.add_argument("out_root", help="folder that receives one checkpoint folder per architecture")
    p.add_argument("--arch", action="append", choices=sorted(RECIPES),
                   help="architecture to build (repeatable; default: all)")
    p.add_argument("--seed", type=int, default=0, help="weights seed (same seed, same weights)")
    args = p.parse_args(argv)
    for arch, path in build_all(args.out_root, args.arch, args.seed).items():
        print(f"{arch}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
