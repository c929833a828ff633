"""Tiny and real-shape HF checkpoints under whichever transformers line is
installed (4.57 for the export stack, 5.x in the genai environment): the
recipes build, load back, rotate with plain RoPE and tokenize byte by byte."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hinamoe.models import hf_tiny  # noqa: E402
from hinamoe.models.hf_real_shape import real_shape_config  # noqa: E402


def _rotary_of(model):
    for mod in model.modules():
        if hasattr(mod, "inv_freq") and hasattr(mod, "attention_scaling"):
            return mod
    raise AssertionError(f"{type(model).__name__} has no rotary embedding module")


@pytest.mark.parametrize("arch", sorted(hf_tiny.RECIPES))
def test_tiny_checkpoint_loads_with_plain_rope(arch, tmp_path, seed):
    from transformers import AutoModelForCausalLM

    out = hf_tiny.build(arch, tmp_path / arch, seed=seed)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    cfg = model.config
    assert cfg.model_type == arch and cfg.num_hidden_layers == 2 and cfg.vocab_size == hf_tiny.VOCAB
    # Unscaled RoPE with base 1e4 (transformers 5 would give gpt-oss YaRN unless told otherwise).
    rot = _rotary_of(model)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    want = 10000.0 ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    np.testing.assert_allclose(rot.inv_freq.double().numpy(), want, rtol=1e-6)
    assert float(rot.attention_scaling) == 1.0
    # The saved weights are the ones the seed gives.
    again = AutoModelForCausalLM.from_pretrained(hf_tiny.build(arch, tmp_path / "again", seed=seed))
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


def test_byte_tokenizer_maps_bytes_to_ids(tmp_path, rng):
    from transformers import AutoTokenizer

    hf_tiny.byte_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    raw = bytes(rng.integers(0, 256, size=64, dtype=np.uint8))
    text = raw.decode("latin-1")  # one char per byte; UTF-8 encoding then gives the byte sequence below
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (hf_tiny.BOS, hf_tiny.EOS, hf_tiny.PAD)


def test_byte_level_chars_match_the_tokenizers_alphabet():
    from tokenizers import pre_tokenizers

    chars = hf_tiny.byte_level_chars()
    assert sorted(chars) == list(range(256)) and len(set(chars.values())) == 256
    assert set(chars.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    for b in b"azAZ09!~":
        assert chars[b] == chr(b)  # printable ASCII maps to itself
    assert chars[ord(" ")] == "\u0120"  # GPT-2's visible space


def test_real_shape_gpt_oss_has_plain_rope():
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    cfg = real_shape_config("gpt-oss-20b", layers=2, experts=4)
    rot = GptOssRotaryEmbedding(config=cfg)  # the rotary alone: the full model is GBs
    want = 150000.0 ** (-np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
    np.testing.assert_allclose(rot.inv_freq.double().numpy(), want, rtol=1e-6)
    assert float(rot.attention_scaling) == 1.0


def test_mxfp4_quantize_decodes_to_its_dequantised_values(rng):
    w = rng.standard_normal((3, 5, 64)) * np.exp2(rng.integers(-4, 4, size=(3, 5, 1)))
    w[0, 0, :32] = 0.0  # an all-zero block
    blocks, scales, deq = hf_tiny.mxfp4_quantize(w)
    assert blocks.shape == (3, 5, 2, 16) and scales.shape == (3, 5, 2) and blocks.dtype == np.uint8
    # Decode independently: low nibble first, e2m1 magnitude, sign bit 3, scale 2^(s - 127).
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(3, 5, 2, 32)
    mags = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])[codes & 7] * np.where(codes & 8, -1, 1)
    decoded = (mags * np.exp2(scales.astype(np.float64) - 127)[..., None]).reshape(w.shape)
    np.testing.assert_array_equal(decoded.astype(np.float32), deq)
    # Within half of the widest e2m1 gap (2, between 4 and 6) of each block's scale.
    step = np.repeat(np.exp2(scales.astype(np.float64) - 127), 32, axis=-1)
    assert np.all(np.abs(deq - w) <= step + 1e-12)
    assert np.all(deq[0, 0, :32] == 0)


def test_real_shape_gpt_oss_for_genai():
    """--genai: the released YaRN RoPE (transformers 5 only), shapes unchanged."""
    if int(transformers.__version__.split(".")[0]) < 5:
        with pytest.raises(ValueError, match="transformers 5"):
            real_shape_config("gpt-oss-20b", layers=2, experts=4, genai=True)
        return
    cfg = real_shape_config("gpt-oss-20b", layers=2, experts=4, genai=True)
    assert cfg.rope_parameters["rope_type"] == "yarn" and cfg.rope_parameters["factor"] == 32.0
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_local_experts) == (2880, 2880, 4)


@pytest.mark.parametrize("arch", sorted(hf_tiny.GENAI_RECIPES))
def test_genai_recipe_builds_and_loads(arch, tmp_path, seed):
    """The checkpoints for onnxruntime-genai's builder (tests/genai/test_genai.py)
    build and load back; LFM2-MoE and Qwen3.5-MoE exist in transformers 5 only."""
    try:
        cfg = hf_tiny.GENAI_RECIPES[arch]()
    except ImportError as e:
        pytest.skip(f"transformers {transformers.__version__} lacks {arch} (transformers 5 only): {e}")
    out = hf_tiny.build(arch, tmp_path / arch, seed=seed, config=cfg)
    if arch == "qwen3_5_moe":
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(out).eval()
        assert type(model).__name__ == "Qwen3_5MoeForConditionalGeneration"  # the class genai's builder takes
        text = model.config.text_config
        assert text.layer_types == ["linear_attention", "full_attention"] and text.vocab_size == hf_tiny.VOCAB
        rope = text.rope_parameters
        assert rope["mrope_section"] == [2, 1, 1]  # covers the rotary half of head_dim, in frequency pairs
        assert sum(rope["mrope_section"]) * 2 == text.head_dim * rope["partial_rotary_factor"]
        assert model.config.vision_config.depth == 1
        ids = torch.tensor([[hf_tiny.BOS, 72, 105, 33]])  # text only: the vision tower does not run
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        assert logits.shape == (1, 4, hf_tiny.VOCAB) and torch.isfinite(logits).all()
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.architectures == (cfg.architectures or [type(model).__name__])
