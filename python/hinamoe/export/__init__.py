"""hina-export: HuggingFace MoE checkpoints to ONNX models HinaMoE runs fast.

Uses optimum's ONNX exporter (with OnnxConfigs and model patchers of ours,
``configs.py`` / ``patchers.py``), then ``hinamoe.graph_passes``. Needs the
``export`` extra (torch, transformers, optimum, optimum-onnx).
"""

from .checkpoint import SUPPORTED, ExportError, check_checkpoint
from .export import export, export_unfused, fuse, save_model
from .ort_model import load_causal_lm, make_session

__all__ = ["SUPPORTED", "ExportError", "check_checkpoint", "export", "export_unfused", "fuse",
           "save_model", "load_causal_lm", "make_session"]
