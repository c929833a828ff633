"""Random MoE configurations and the EP-vs-reference check used by the tests."""

from __future__ import annotations

import numpy as np

from hinamoe.models import MoEConfig, build_moe_model, random_input, random_logits, run_moe, weight_feeds

from support.moe_reference import check_close, reference_for, weights_f64
from support.runtime import ORT_HAS_LIMIT_AFTER_ACTIVATION
from support.sessions import hina_session

# (activation, swiglu_fusion) pairs the EP must run
ACT_FUSIONS = [("relu", 0), ("gelu", 0), ("silu", 0), ("identity", 0), ("relu2", 0),
               ("swiglu", 0), ("swiglu", 1), ("swiglu", 2), ("geglu", 1), ("geglu", 2)]
ACT_FUSION_IDS = [f"{a}-f{f}" if a in ("swiglu", "geglu") else a for a, f in ACT_FUSIONS]
DTYPES = ["float32", "float16", "bfloat16"]

HIDDEN = [3, 17, 37, 64, 72, 100, 130, 200, 257]
INTER = [1, 5, 24, 33, 72, 100, 150]
EXPERTS = [1, 2, 3, 8, 16, 33, 64]


def random_config(rng: np.random.Generator, activation: str, fusion: int, dtype: str,
                  **overrides) -> MoEConfig:
    e = int(rng.choice(EXPERTS))
    cfg = MoEConfig(
        hidden=int(rng.choice(HIDDEN)),
        inter=int(rng.choice(INTER)),
        experts=e,
        k=int(rng.integers(1, min(8, e) + 1)),
        activation=activation,
        swiglu_fusion=fusion,
        dtype=dtype,
        fc1_bias=bool(rng.integers(2)),
        fc2_bias=bool(rng.integers(2)),
        fc3_bias=bool(rng.integers(2)),
        normalize_routing_weights=int(rng.integers(2)),
        input_rank=int(rng.choice([2, 3])),
        weights_as_inputs=bool(rng.integers(3) == 0),
    )
    if activation == "swiglu":
        r = int(rng.integers(4))
        if r >= 1:  # gpt-oss style parameters
            cfg.activation_alpha = float(rng.choice([1.0, 1.702, 0.5]))
            cfg.activation_beta = float(rng.choice([0.0, 1.0, -0.5]))
        if r >= 2:
            cfg.swiglu_limit = float(rng.choice([0.25, 1.0, 7.0]))
        if r == 3 and ORT_HAS_LIMIT_AFTER_ACTIVATION:
            cfg.swiglu_limit_after_activation = 1
    for key, val in overrides.items():
        setattr(cfg, key, val)
    return cfg


def check_ep_against_reference(cfg: MoEConfig, isa: str, rng: np.random.Generator,
                               tokens: list[int], threads: int = 1, what: str = "",
                               factor: float = 1.0, weights=None,
                               extra_options: dict | None = None) -> list[float]:
    """Build ``cfg``, run it on HinaMoE (CPU fallback disabled; provider
    options ``isa`` plus ``extra_options``) for each token count and compare
    to the float64 reference. Returns the error ratios."""
    model, w = build_moe_model(cfg, rng=rng, weights=weights)
    sess = hina_session(model, isa=isa, threads=threads, extra_options=extra_options)
    assert sess.get_providers()[0] == "HinaMoE", sess.get_providers()
    feeds = weight_feeds(cfg, w) if cfg.weights_as_inputs else None
    w64 = weights_f64(w)
    ratios = []
    for t in tokens:
        batch = 2 if (cfg.input_rank == 3 and t % 2 == 0) else 1
        x = random_input(cfg, t, rng, batch=batch)
        lg = random_logits(cfg, t, rng)
        out = run_moe(sess, x, lg, feeds)
        assert out.dtype == x.dtype and out.shape == x.shape
        ref = reference_for(cfg, x, lg, w64)
        ratios.append(check_close(
            out, ref, cfg.dtype,
            f"{what} isa={isa} threads={threads} T={t} [{cfg.describe()}]", factor))
    return ratios
