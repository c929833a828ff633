"""onnxruntime-genai models (e.g. the genai model builder's output) on HinaMoE.

    import hinamoe.genai, onnxruntime_genai as og
    model = hinamoe.genai.model("gpt-oss-genai/", isa="auto")
    tokenizer = og.Tokenizer(model)   # then og.GeneratorParams / og.Generator as usual

``config()`` gives the ``og.Config`` instead, to change more before
``og.Model(config)``. HinaMoE is the only provider appended; nodes it does
not run (everything but MoE and GroupQueryAttention) go to ONNX Runtime's
CPU EP, as with any plugin EP. With ``strict=True`` (the default here) a MoE
or GroupQueryAttention node HinaMoE would leave to the CPU EP fails model
creation instead, naming the node and the reason, so a model never runs
those ops elsewhere unnoticed.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

from . import get_ep_name, get_library_path

# Provider options HinaMoE reads (README, "Options"); strict is the keyword.
OPTIONS = ("isa", "numa")

_lock = threading.Lock()
_registered = False


def register() -> None:
    """Registers the HinaMoE library with onnxruntime-genai (once per process;
    genai keeps its own ONNX Runtime environment, so ``hinamoe.register()``
    does not cover it)."""
    import onnxruntime_genai as og

    global _registered
    with _lock:
        if _registered:
            return
        try:
            og.register_execution_provider_library(get_ep_name(), get_library_path())
        except RuntimeError as e:
            if "already registered" not in str(e):
                raise
        _registered = True


def config(model_dir: str | Path, *, strict: bool = True, profile_prefix: str | None = None,
           **options: str):
    """An ``og.Config`` for the genai model folder ``model_dir`` with HinaMoE
    as its provider and ``options`` (isa, numa) as provider options.
    ``profile_prefix``: turn on ONNX Runtime profiling; the JSON file starts
    with that prefix (written when the model is released)."""
    import onnxruntime_genai as og

    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown HinaMoE option(s) {unknown}; HinaMoE reads {list(OPTIONS)}")
    model_dir = Path(model_dir)
    if not (model_dir / "genai_config.json").is_file():
        raise FileNotFoundError(f"{model_dir} has no genai_config.json: not an onnxruntime-genai model folder")
    register()
    cfg = og.Config(str(model_dir))
    cfg.clear_providers()
    cfg.append_provider(get_ep_name())
    for key, value in {**options, "strict": "1" if strict else "0"}.items():
        cfg.set_provider_option(get_ep_name(), key, str(value))
    if profile_prefix is not None:
        cfg.overlay(json.dumps({"model": {"decoder": {"session_options": {"enable_profiling": str(profile_prefix)}}}}))
    return cfg


def model(model_dir: str | Path, *, strict: bool = True, profile_prefix: str | None = None, **options: str):
    """``og.Model`` of ``model_dir`` on HinaMoE (see ``config``)."""
    import onnxruntime_genai as og

    cfg = config(model_dir, strict=strict, profile_prefix=profile_prefix, **options)
    try:
        return og.Model(cfg)
    except RuntimeError as e:
        raise RuntimeError(f"onnxruntime-genai could not create {model_dir} on HinaMoE: {e}") from e


def profile_providers(path: str | Path) -> dict[str, tuple[str, str]]:
    """``{node name: (op type, provider)}`` of the nodes that ran, from an
    ONNX Runtime profiling JSON (e.g. the one ``profile_prefix`` gives)."""
    with open(path) as f:
        events = json.load(f)
    out: dict[str, tuple[str, str]] = {}
    for ev in events:
        args = ev.get("args", {})
        if ev.get("cat") == "Node" and "provider" in args and "op_name" in args:
            name = ev["name"].removesuffix("_kernel_time").removesuffix("_fence_before").removesuffix("_fence_after")
            out[name] = (args["op_name"], args["provider"])
    return out
