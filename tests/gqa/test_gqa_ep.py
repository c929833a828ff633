"""GroupQueryAttention on HinaMoE against the float64 reference and ORT's
CPU EP: every supported feature, random configurations (G in 1/2/4/8,
d in 64/80/128, ragged batch rows), prefill then decode with the KV cache
shared between past and present (as onnxruntime-genai runs it), separate
past/present, packed QKV, no past, no present outputs. Sessions disable the
CPU EP fallback, so every result comes from HinaMoE. float32 and float16."""

from __future__ import annotations

import pytest

from hinamoe.models import GQAConfig, build_gqa_model, prompt_step, run_gqa

from support.gqa_cases import FEATURES, check_close, random_config, run_groups_and_head_dims, run_separate, run_sequence
from support.gqa_reference import gqa_reference
from support.runtime import available_isas, require_isa
from support.sessions import cpu_session, hina_session

ISAS = ["ref", "avx2"]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("feature", list(FEATURES))
def test_feature(feature, isa, rng, seed):
    require_isa(isa)
    cfg = GQAConfig(num_heads=8, kv_num_heads=2, head_dim=64, **FEATURES[feature])
    model = build_gqa_model(cfg)
    hs, cs = hina_session(model, isa=isa, threads=2), cpu_session(model)
    what = f"HinaMoE isa={isa} seed {seed} [{cfg.describe()}]"
    run_sequence(hs, cfg, rng, [13, 6, 10], decode_steps=3, capacity=41, what=what, other=cs)
    run_separate(hs, cfg, rng, [9, 3, 14], 1, past_capacity=20, what=what + " separate", other=cs)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("feature", ["plain", "packed", "rotary_interleaved", "position_ids",
                                     "bias_and_softcap", "head_sink", "local_window"])
def test_float16(feature, isa, rng, seed):
    """float16 tensors (K/V read in place) against the reference and the CPU EP's float16 GQA."""
    require_isa(isa)
    cfg = GQAConfig(num_heads=8, kv_num_heads=2, head_dim=64, dtype="float16", **FEATURES[feature])
    model = build_gqa_model(cfg)
    hs, cs = hina_session(model, isa=isa, threads=2), cpu_session(model)
    what = f"HinaMoE f16 isa={isa} seed {seed} [{cfg.describe()}]"
    run_sequence(hs, cfg, rng, [13, 6, 10], decode_steps=3, capacity=41, what=what, other=cs)
    run_sequence(hs, cfg, rng, [700, 333], decode_steps=2, capacity=720, what=what + " long",
                 other=cs, prefill="random")
    run_separate(hs, cfg, rng, [9, 3, 14], 1, past_capacity=20, what=what + " separate", other=cs)


@pytest.mark.parametrize("isa", available_isas())
def test_every_isa_name(isa, rng, seed):
    """Every tier name the isa option accepts selects a GQA tier too (AMX
    names run the best non-AMX GQA kernels for now)."""
    cfg = GQAConfig(num_heads=8, kv_num_heads=2, head_dim=64, do_rotary=True)
    hs = hina_session(build_gqa_model(cfg), isa=isa, threads=2)
    run_sequence(hs, cfg, rng, [9, 30], decode_steps=2, capacity=40,
                 what=f"isa={isa} seed {seed}")


@pytest.mark.parametrize("isa", ISAS)
def test_groups_and_head_dims(isa, rng, seed):
    """Every G and d, decode on a ragged batch with odd lengths."""
    require_isa(isa)
    run_groups_and_head_dims(lambda m: hina_session(m, isa=isa, threads=2), rng,
                             f"isa={isa} seed {seed}")


@pytest.mark.parametrize("isa", ISAS)
def test_random_configs(isa, rng, seed):
    """Random feature mixes: a ragged prompt then decode, and one call with
    separate past/present; also against the CPU EP."""
    require_isa(isa)
    for _ in range(3):
        cfg = random_config(rng)
        model = build_gqa_model(cfg)
        hs, cs = hina_session(model, isa=isa, threads=2), cpu_session(model)
        what = f"isa={isa} seed {seed} [{cfg.describe()}]"
        lens = [int(x) for x in rng.integers(1, 60, size=int(rng.integers(1, 4)))]
        run_sequence(hs, cfg, rng, lens, decode_steps=3, capacity=max(lens) + 5, what=what, other=cs)
        past = [int(x) for x in rng.integers(1, 300, size=int(rng.integers(1, 4)))]
        run_separate(hs, cfg, rng, past, 1, past_capacity=max(past) + 7, what=what + " separate",
                     other=cs)


def test_continued_prompt(rng, seed):
    """S > 1 after a past (batch 1): ORT's interactive prompt."""
    cfg = GQAConfig(num_heads=8, kv_num_heads=4, head_dim=64, do_rotary=True)
    model = build_gqa_model(cfg)
    hs, cs = hina_session(model, threads=2), cpu_session(model)
    # ORT's rule: total == past capacity + S (a growing cache) or total <=
    # past capacity (a fixed-size one)
    for past_len, s, cap in ((37, 5, 37), (1, 16, 1), (100, 3, 110)):
        run_separate(hs, cfg, rng, [past_len], s, past_capacity=cap,
                     what=f"seed {seed} past {past_len} S {s} capacity {cap}", other=cs)


def test_no_past(rng, seed):
    """No past inputs: a ragged first prompt; present has total_sequence_length rows."""
    cfg = GQAConfig(num_heads=4, kv_num_heads=2, head_dim=80, with_past=False, do_rotary=True)
    model = build_gqa_model(cfg)
    hs, cs = hina_session(model), cpu_session(model)
    step = prompt_step(cfg, rng, [7, 12, 1])
    out, pk, pv = run_gqa(hs, cfg, step)
    want, wk, wv, valid = gqa_reference(cfg, step)
    assert pk.shape == (3, 2, 12, 80)
    check_close(out, want, f"seed {seed} no past output", valid)
    check_close(pk, wk, "no past present_key")
    check_close(pv, wv, "no past present_value")
    check_close(out, run_gqa(cs, cfg, step)[0], "no past vs CPU EP", valid)


def test_no_present_outputs(rng, seed):
    """A node without present outputs still attends over past + new tokens."""
    cfg = GQAConfig(num_heads=8, kv_num_heads=2, head_dim=64, with_present=False)
    hs = hina_session(build_gqa_model(cfg))
    run_separate(hs, cfg, rng, [20, 5], 1, past_capacity=24, what=f"seed {seed} no present")


@pytest.mark.slow
@pytest.mark.parametrize("isa", ISAS)
def test_long_context_sweep(isa, rng, seed):
    """Contexts up to ~3000 with odd lengths, random configs, decode steps,
    against the reference and the CPU EP."""
    require_isa(isa)
    for i in range(6):
        cfg = random_config(rng, dtype="float16" if i % 3 == 2 else "float32")
        model = build_gqa_model(cfg)
        hs, cs = hina_session(model, isa=isa, threads=2), cpu_session(model)
        lens = [int(x) | 1 for x in rng.integers(1, 3000, size=int(rng.integers(1, 4)))]
        run_sequence(hs, cfg, rng, lens, decode_steps=2, capacity=max(lens) + 9,
                     what=f"isa={isa} seed {seed} [{cfg.describe()}]", other=cs, prefill="random")
