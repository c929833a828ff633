"""Sessions on HinaMoE (CPU EP fallback off by default) or on the CPU EP,
the providers an ORT profile shows per node, and the text of an ORT error."""

from __future__ import annotations

import json


def session_options(threads: int = 1, no_fallback: bool = True, profile_prefix: str | None = None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if no_fallback:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


def hina_session(model, isa: str = "auto", threads: int = 1, no_fallback: bool = True,
                 profile_prefix: str | None = None, cpu_fallback_provider: bool = False,
                 extra_options: dict | None = None):
    """A session on HinaMoE (``model``: ModelProto, bytes or path); provider
    options ``isa`` plus ``extra_options``."""
    import onnxruntime as ort

    from hinamoe.models import model_source

    src = model_source(model) if hasattr(model, "graph") else model
    providers = [("HinaMoE", {"isa": isa, **(extra_options or {})})]
    if cpu_fallback_provider:
        providers.append("CPUExecutionProvider")
    so = session_options(threads, no_fallback, profile_prefix)
    sess = ort.InferenceSession(src, so, providers=providers)
    return sess


def cpu_session(model, threads: int = 1, profile_prefix: str | None = None):
    import onnxruntime as ort

    from hinamoe.models import model_source

    src = model_source(model) if hasattr(model, "graph") else model
    so = session_options(threads, no_fallback=False, profile_prefix=profile_prefix)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def profile_node_providers(path: str) -> dict[str, str]:
    """``{op_name: provider}`` from an ORT profiling JSON (kernel events)."""
    with open(path) as f:
        events = json.load(f)
    out: dict[str, str] = {}
    for ev in events:
        if ev.get("cat") != "Node":
            continue
        args = ev.get("args", {})
        if "provider" in args and "op_name" in args:
            out[args["op_name"]] = args["provider"]
    return out


def error_text(exc: BaseException) -> str:
    """The message of ``exc`` and of its causes. onnxruntime's Python wrapper
    retries a failed session creation on the CPU EP and raises the retry's
    error *from* the original one, so the EP's message is in ``__cause__``."""
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(parts)
