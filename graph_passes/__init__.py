"""Graph passes: ONNX rewrites that turn exported MoE models into the ops
HinaMoE runs (com.microsoft::MoE, com.microsoft::GroupQueryAttention,
com.microsoft::QMoE with MatMulNBits around it).

One pass per module. A pass is a function ``apply(model: onnx_ir.Model) ->
PassReport`` that rewrites the model in place and says what it matched and
what it left alone (and why). ``run_passes`` applies them in order.
"""

from .report import FusionReport, PassReport
from .pipeline import PASSES, run_passes

__all__ = ["FusionReport", "PassReport", "PASSES", "run_passes"]
