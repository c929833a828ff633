"""ONNX Runtime sessions of every benchmark, on HinaMoE or on the CPU EP."""

from __future__ import annotations

def session_options(threads: int, profile_prefix: str | None = None):
    """ORT session options of every benchmark: `threads` intra-op threads,
    one inter-op, errors only; profiling to `profile_prefix` when given."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


def make_session(model, ep: str, threads: int, hina_options: dict):
    """A session on HinaMoE (CPU EP fallback disabled, so every node must be
    ours) or on the CPU EP alone; `model` is a path or serialized bytes."""
    import onnxruntime as ort

    so = session_options(threads)
    if ep == "HinaMoE":
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        providers = [("HinaMoE", hina_options)]
    else:
        providers = ["CPUExecutionProvider"]
    sess = ort.InferenceSession(model, so, providers=providers)
    if ep == "HinaMoE" and sess.get_providers()[0] != "HinaMoE":
        raise RuntimeError(f"HinaMoE not used: {sess.get_providers()}")
    return sess
