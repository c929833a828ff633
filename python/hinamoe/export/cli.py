"""hina-export: command line of hinamoe.export (also `optimum-cli export hina`)."""

from __future__ import annotations

import argparse
import sys
import warnings

DESCRIPTION = """\
Export a HuggingFace MoE checkpoint to an ONNX model for HinaMoE.

Stages: optimum's ONNX export (task text-generation-with-past: one decoder
with KV-cache inputs; every MoE block unrolled over all its experts), the
graph passes of hinamoe.graph_passes (MoE and attention fusion into
com.microsoft::MoE / GroupQueryAttention, expert weight dtype; with --dtype
int4/int8 the experts become com.microsoft::QMoE and the other MatMuls
MatMulNBits), then OUTPUT_DIR gets model.onnx (+ model.onnx_data for large weights), the HF
config, generation config and tokenizer files, and fusion_report.json. The
fusion table is printed at the end.

Load the result with hinamoe.export.load_causal_lm(OUTPUT_DIR) for
model.generate(...), or with onnxruntime directly (providers=["HinaMoE"])."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from .checkpoint import supported_list
    from .export import DTYPES

    p.add_argument("model_dir", metavar="MODEL_DIR",
                   help=f"local HF checkpoint folder (config.json + weights); supported: {supported_list()}")
    p.add_argument("output_dir", metavar="OUTPUT_DIR", help="folder to write (created if missing)")
    p.add_argument("--dtype", choices=DTYPES, default="fp32",
                   help="fp16/bf16: storage type of the MoE expert weights, the rest stays fp32;"
                        " int4/int8: the model 4/8-bit end to end (experts as QMoE, attention,"
                        " shared experts and lm_head as MatMulNBits; routers stay fp32), weights"
                        " quantised symmetrically per block along K (default fp32)")
    p.add_argument("--block-size", type=int, default=None, metavar="N",
                   help="int4/int8: quantisation block along K, a power of two >= 16 that divides"
                        " the experts' hidden and intermediate sizes (default 32)")
    p.add_argument("--accuracy-level", type=int, default=None, choices=range(5), metavar="L",
                   help="int4/int8: the accuracy_level of every QMoE and MatMulNBits node (ORT's"
                        " lowest precision allowed for the activations). Default 4: int8 tokens per"
                        " block, the arithmetic of llama.cpp's Q4_0/Q8_0 and onnxruntime-genai's"
                        " default for CPU, 1.2-1.3x faster decode; 0: float tokens")
    p.add_argument("--no-fuse", action="store_true",
                   help="write optimum's export as is (no graph passes): the reference graph")
    p.add_argument("--opset", type=int, default=None,
                   help="ONNX opset of the export (default: optimum's choice for the architecture)")
    p.add_argument("--keep-unfused", action="store_true",
                   help="also keep the unfused export in OUTPUT_DIR/unfused/")
    p.add_argument("--validate", action="store_true",
                   help="let optimum compare the unfused export with PyTorch (slow)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--verbose", action="store_true",
                   help="show the tracer's warnings (hidden by default: they are about code"
                        " paths the export handles, e.g. the all-experts loop)")


def accuracy_level(args) -> int | None:
    """--accuracy-level, or 4 for int4/int8 when not given (0 stays 0: float tokens)."""
    if args.accuracy_level is not None:
        return args.accuracy_level
    return 4 if args.dtype in ("int4", "int8") else None


def run(args) -> int:
    from .checkpoint import ExportError
    from .export import REPORT_FILE, export

    if not args.verbose:
        warnings.simplefilter("ignore")
    try:
        path, report = export(args.model_dir, args.output_dir, dtype=args.dtype,
                              fuse_graph=not args.no_fuse, opset=args.opset, validate=args.validate,
                              progress=not args.quiet, keep_unfused=args.keep_unfused,
                              block_size=args.block_size, accuracy_level=accuracy_level(args))
    except ExportError as e:
        print(f"hina-export: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    if report is not None:
        print(f"fusion report: {path.parent / REPORT_FILE}")
        print(report.format_table())
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="hina-export", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
