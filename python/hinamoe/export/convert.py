"""The dtype pass on a model folder that already exists: a copy whose MoE
expert weights and dense linears (MatMuls with a constant weight, routers
excepted) are bf16 (or fp16), the rest of the graph and every other file
as they were.

Works on onnxruntime-genai folders (the genai model builder's output:
genai_config.json names the model file) and on hina-export outputs (its
fp32 export, converted afterwards instead of exported again):

    python -m hinamoe.export.convert gptoss-genai gptoss-genai-bf16 --dtype bf16

Needs no export extra (onnx_ir only). The copy's weights go to
model.onnx_data; fusion_report.json, when written, is this conversion's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from .checkpoint import ExportError
from .export import DATA_FILE, MODEL_FILE, REPORT_FILE, save_model

DTYPES = ("bf16", "fp16")


def model_file(folder: Path) -> Path:
    """The folder's ONNX decoder: the one genai_config.json names, else model.onnx."""
    genai = folder / "genai_config.json"
    name = MODEL_FILE
    if genai.is_file():
        name = json.loads(genai.read_text())["model"]["decoder"].get("filename", MODEL_FILE)
    path = folder / name
    if not path.is_file():
        raise ExportError(f"{folder}: no {name} (expected a genai or hina-export model folder)")
    if name != MODEL_FILE:
        raise ExportError(f"{folder}: the decoder is {name}; only folders whose decoder is {MODEL_FILE} are handled")
    return path


def _external_files(model) -> set[str]:
    """Names of the external-data files the model's initializers point to."""
    import onnx_ir as ir

    names = set()
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if isinstance(tensor, ir.ExternalTensor):
            names.add(Path(tensor.location).name)
    return names


def convert(src: str | Path, dst: str | Path, dtype: str = "bf16", *, progress: bool = False):
    """Writes `dst`: `src` with the dtype pass applied. Returns the pass's report."""
    import onnx_ir as ir

    from hinamoe.graph_passes import run_passes

    src, dst = Path(src), Path(dst)
    if dtype not in DTYPES:
        raise ExportError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if dst.exists() and dst.resolve() == src.resolve():
        raise ExportError("the output folder must not be the input folder")
    path = model_file(src)
    model = ir.load(str(path))  # external weights stay on disk until read
    skip = {path.name, REPORT_FILE, DATA_FILE} | _external_files(model)
    model, report = run_passes(model, only=["dtype"], dtype=dtype)
    [dtype_report] = report.passes
    if not dtype_report.fused:
        why = "; ".join(f"{s['where']}: {s['reason']}" for s in dtype_report.skipped) or "no MoE node or dense MatMul"
        raise ExportError(f"{path}: nothing converted ({why})")
    dst.mkdir(parents=True, exist_ok=True)
    save_model(model, dst, progress=progress)
    del model
    for f in sorted(src.iterdir()):
        if f.is_file() and f.name not in skip:
            shutil.copy2(f, dst / f.name)
    report.to_json(dst / REPORT_FILE)
    return dtype_report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m hinamoe.export.convert",
                                description="Copy a genai or hina-export model folder with its MoE expert"
                                            " weights and dense linears stored as bf16 or fp16"
                                            " (hinamoe.graph_passes.dtype).")
    p.add_argument("src", help="model folder (genai_config.json, or hina-export's model.onnx + config.json)")
    p.add_argument("dst", help="folder to write")
    p.add_argument("--dtype", choices=DTYPES, default="bf16", help="weight type (default bf16)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    try:
        rep = convert(args.src, args.dst, args.dtype, progress=not args.quiet)
    except ExportError as e:
        print(f"convert: error: {e}", file=sys.stderr)
        return 2
    for op, what in (("MoE", "expert weights"), ("MatMul", "dense weights")):
        sites = [s for s in rep.fused if s.get("op") == op]
        if sites:
            before = sum(s["weight_bytes_before"] for s in sites)
            after = sum(s["weight_bytes_after"] for s in sites)
            print(f"{len(sites)} {op} node(s) to {args.dtype}: {what} {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB")
    print(f"wrote {Path(args.dst) / MODEL_FILE}")
    for s in rep.skipped:
        print(f"  left alone: {s['where']}: {s['reason']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
