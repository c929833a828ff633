"""bfloat16 GroupQueryAttention on HinaMoE (ORT's CPU EP has no bfloat16 GQA
kernel, so HinaMoE is the only way such a model runs): every supported
feature, random configurations, prefill then decode through the shared
past/present buffer, separate past/present, against the float64 reference
fed the same bf16-rounded inputs. Sessions disable the CPU EP fallback, so
every result comes from HinaMoE."""

from __future__ import annotations

import pytest

from hinamoe.models import GQAConfig, build_gqa_model

from support.gqa_cases import FEATURES, random_config, run_groups_and_head_dims, run_separate, run_sequence
from support.runtime import require_isa
from support.sessions import hina_session

# amx-emu: the AMX tile kernel on the emulator; avx2 widens bf16 K/V on load.
ISAS = ["ref", "avx2", "amx-emu"]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("feature", list(FEATURES))
def test_feature(feature, isa, rng, seed):
    require_isa(isa)
    cfg = GQAConfig(num_heads=8, kv_num_heads=2, head_dim=64, dtype="bfloat16", **FEATURES[feature])
    hs = hina_session(build_gqa_model(cfg), isa=isa, threads=2)
    what = f"HinaMoE bf16 isa={isa} seed {seed} [{cfg.describe()}]"
    run_sequence(hs, cfg, rng, [13, 6, 10], decode_steps=3, capacity=41, what=what)
    run_separate(hs, cfg, rng, [9, 3, 14], 1, past_capacity=20, what=what + " separate")


@pytest.mark.parametrize("isa", ISAS)
def test_long_decode(isa, rng, seed):
    """Decode over a few hundred cached keys (key ranges split over threads)."""
    require_isa(isa)
    cfg = GQAConfig(num_heads=8, kv_num_heads=2, head_dim=128, dtype="bfloat16", do_rotary=True)
    hs = hina_session(build_gqa_model(cfg), isa=isa, threads=2)
    run_sequence(hs, cfg, rng, [700, 333], decode_steps=2, capacity=720,
                 what=f"bf16 isa={isa} seed {seed} long", prefill="random")


@pytest.mark.parametrize("isa", ISAS)
def test_groups_and_head_dims(isa, rng, seed):
    """Every G and d, decode on a ragged batch with odd lengths."""
    require_isa(isa)
    run_groups_and_head_dims(lambda m: hina_session(m, isa=isa, threads=2), rng,
                             f"bf16 isa={isa} seed {seed}", dtype="bfloat16")


@pytest.mark.parametrize("isa", ISAS)
def test_random_configs(isa, rng, seed):
    """Random feature mixes: a ragged prompt then decode, and one call with
    separate past/present."""
    require_isa(isa)
    for _ in range(3):
        cfg = random_config(rng, dtype="bfloat16")
        hs = hina_session(build_gqa_model(cfg), isa=isa, threads=2)
        what = f"bf16 isa={isa} seed {seed} [{cfg.describe()}]"
        lens = [int(x) for x in rng.integers(1, 60, size=int(rng.integers(1, 4)))]
        run_sequence(hs, cfg, rng, lens, decode_steps=3, capacity=max(lens) + 5, what=what)
        past = [int(x) for x in rng.integers(1, 300, size=int(rng.integers(1, 4)))]
        run_separate(hs, cfg, rng, past, 1, past_capacity=max(past) + 7, what=what + " separate")
