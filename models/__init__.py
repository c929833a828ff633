"""Model recipes for HinaMoE: single ``com.microsoft::MoE`` layers at real or
random shapes, crafted routing, and the expert shapes of real models.

Installed as ``hinamoe.models``; only relative imports inside.
"""

from .gqa_layer import (  # noqa: F401
    ATTENTION_SHAPES,
    AttentionShape,
    GQA_INPUTS,
    GQAConfig,
    GQAStep,
    KVCache,
    build_gqa_model,
    prompt_step,
    random_step,
    rotary_caches,
    run_gqa,
    run_gqa_shared,
)
from .moe_layer import (  # noqa: F401
    ACTIVATIONS,
    GATED,
    MoEConfig,
    MoERunner,
    build_moe_model,
    canon_dtype,
    model_path,
    model_source,
    np_dtype,
    onnx_dtype,
    random_input,
    random_logits,
    random_weights,
    round_to,
    run_moe,
    save_moe_model,
    short_dtype,
    weight_feeds,
)
from .routing import (  # noqa: F401
    RoutingPlan,
    crafted_logits,
    expert_token_counts,
    rotating_active_sets,
    tokens_for,
)
from .shapes import DEFAULT_BENCH_MODELS, SHAPES, MoEShape, get_shape, list_shapes  # noqa: F401

__all__ = [
    "ATTENTION_SHAPES", "AttentionShape", "GQA_INPUTS", "GQAConfig", "GQAStep", "KVCache", "build_gqa_model", "prompt_step",
    "random_step", "rotary_caches", "run_gqa", "run_gqa_shared",
    "ACTIVATIONS", "GATED", "MoEConfig", "MoERunner", "build_moe_model", "canon_dtype",
    "model_path", "model_source", "np_dtype", "onnx_dtype", "random_input", "random_logits",
    "random_weights", "round_to", "run_moe", "save_moe_model", "short_dtype", "weight_feeds",
    "RoutingPlan", "crafted_logits", "expert_token_counts", "rotating_active_sets", "tokens_for",
    "DEFAULT_BENCH_MODELS", "SHAPES", "MoEShape", "get_shape", "list_shapes",
]
from .qmoe_layer import (  # noqa: F401,E402
    QMOE_INPUTS,
    QMoEConfig,
    build_qmoe_model,
    pack_zero_points,
    qmoe_feeds,
)
from .matmul_nbits_layer import MatMulNBitsConfig, build_matmul_nbits_model, pack_codes  # noqa: F401,E402
from .matmul_layer import build_matmul_model  # noqa: F401,E402
