"""HF checkpoint -> optimum ONNX export -> graph passes -> output folder.

The stages, each with its own function so tests and other tools can call them:
``export_unfused`` (optimum's main_export with our configs registered),
``fuse`` (hinamoe.graph_passes.run_passes), ``save_model`` (external data for
large weights), ``copy_configs`` and, for a fused graph,
``write_genai_config`` (the folder is then an onnxruntime-genai folder too).
``export`` runs them all.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from .checkpoint import ExportError, check_checkpoint
from .genai_config import write_genai_config

TASK = "text-generation-with-past"
MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx_data"
REPORT_FILE = "fusion_report.json"
DTYPES = ("fp32", "fp16", "bf16", "int4", "int8")
INT_DTYPES = ("int4", "int8")
# Initializers at least this large go to model.onnx_data (protobuf caps at 2 GB).
EXTERNAL_DATA_THRESHOLD = 1024
# What the output folder gets from the checkpoint / optimum's export besides the graph.
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt",
              "chat_template.jinja")


def export_unfused(model_dir: str | Path, out_dir: str | Path, *, opset: int | None = None,
                   validate: bool = False) -> Path:
    """optimum's ONNX export of `model_dir` (one decoder with KV-cache inputs)
    into `out_dir`; returns the model.onnx path. The experts are unrolled over
    all experts by our patcher; nothing is fused."""
    from .configs import register

    check_checkpoint(model_dir)
    register()
    from optimum.exporters.onnx import main_export

    main_export(str(model_dir), str(out_dir), task=TASK, opset=opset, device="cpu",
                do_validation=validate, local_files_only=True, library_name="transformers")
    model_path = Path(out_dir) / MODEL_FILE
    if not model_path.is_file():
        raise ExportError(f"optimum wrote no {MODEL_FILE} into {out_dir}")
    return model_path


def fuse(model_path: str | Path, *, dtype: str = "fp32", block_size: int | None = None,
         accuracy_level: int | None = None, progress: bool = False, **options):
    """Runs the graph passes on the exported model; returns (ir.Model, FusionReport).
    int4/int8 quantise it (block_size along K, default 32)."""
    import onnx_ir as ir

    from hinamoe.graph_passes import run_passes
    from hinamoe.graph_passes.quantize import QuantizeError

    model = ir.load(str(model_path))
    try:
        return run_passes(model, dtype=dtype, block_size=block_size, accuracy_level=accuracy_level,
                          progress=progress, **options)
    except QuantizeError as e:
        raise ExportError(str(e)) from None


def rotary_positions(config: dict) -> int | None:
    """Positions the RotaryEmbedding caches cover: the checkpoint's
    max_position_embeddings (None keeps the elementwise rotary)."""
    value = config.get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else None


def check_quant_options(ckpt, dtype: str, block_size: int | None, fuse_graph: bool) -> None:
    """--dtype int4/int8 and --block-size, checked before the (long) export:
    the block must be a power of two >= 16 dividing the experts' sizes."""
    from hinamoe.graph_passes.quantize import (DEFAULT_BLOCK_SIZE, QuantizeError, check_block_size,
                                               check_expert_dims)

    if dtype not in INT_DTYPES:
        if block_size is not None:
            raise ExportError(f"--block-size is the quantisation block of --dtype int4/int8; "
                              f"it does not apply to --dtype {dtype}")
        return
    if not fuse_graph:
        raise ExportError(f"--dtype {dtype} quantises the fused MoE nodes (QMoE); it needs fusion"
                          " (drop --no-fuse)")
    block = DEFAULT_BLOCK_SIZE if block_size is None else block_size
    try:
        check_block_size(block)
    except QuantizeError as e:
        raise ExportError(f"--block-size: {e}") from None
    if ckpt.expert_sizes is not None:
        try:
            check_expert_dims(block, *ckpt.expert_sizes, f"{ckpt.display_name} checkpoint {ckpt.path}")
        except QuantizeError as e:
            raise ExportError(str(e)) from None


def inline_attribute_tensors(model) -> int:
    """Reads node attribute tensors (Constant values) that the loaded model
    keeps in its external-data file into the graph; returns how many. ir.save
    writes only initializers to the new data file, so such an attribute would
    keep the old file's name and offset and point past the end of the new one
    (optimum's export of a model over 2 GB has them)."""
    import onnx_ir as ir

    count = 0
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for name, attr in list(node.attributes.items()):
            if attr.type == ir.AttributeType.TENSOR and isinstance(attr.value, ir.ExternalTensor):
                node.attributes[name] = ir.AttrTensor(name, ir.tensor(attr.value.numpy(), name=attr.value.name))
                count += 1
            elif attr.type == ir.AttributeType.TENSORS and any(isinstance(t, ir.ExternalTensor) for t in attr.value):
                node.attributes[name] = ir.AttrTensors(
                    name, [ir.tensor(t.numpy(), name=t.name) if isinstance(t, ir.ExternalTensor) else t
                           for t in attr.value])
                count += 1
    return count


def save_model(model, out_dir: str | Path, *, threshold: int = EXTERNAL_DATA_THRESHOLD,
               progress: bool = False) -> Path:
    """Writes `model` (onnx_ir.Model) as out_dir/model.onnx with initializers of
    `threshold` bytes or more in out_dir/model.onnx_data (a bar per tensor
    written when `progress`: large models spend minutes here). Attribute
    tensors the source kept externally go into the graph first."""
    import onnx_ir as ir
    from tqdm.auto import tqdm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / MODEL_FILE
    inline_attribute_tensors(model)
    for stale in (path, out / DATA_FILE):
        stale.unlink(missing_ok=True)
    with tqdm(desc="writing weights", unit="tensor", disable=not progress, leave=False) as bar:
        def advance(tensor, info) -> None:
            bar.total = info.total
            bar.update()

        ir.save(model, path, external_data=DATA_FILE, size_threshold_bytes=threshold,
                callback=advance)
    return path


def copy_configs(sources: list[Path], out_dir: str | Path) -> list[str]:
    """Copies config, generation config and tokenizer files found in `sources`
    (first one that has a file wins) into `out_dir`; returns the names copied."""
    copied = []
    for name in SIDE_FILES:
        for src in sources:
            if (src / name).is_file():
                if (src / name).resolve() != (Path(out_dir) / name).resolve():
                    shutil.copy2(src / name, Path(out_dir) / name)
                copied.append(name)
                break
    return copied


def export(model_dir: str | Path, out_dir: str | Path, *, dtype: str = "fp32", fuse_graph: bool = True,
           opset: int | None = None, validate: bool = False, progress: bool = True,
           keep_unfused: bool = False, threshold: int = EXTERNAL_DATA_THRESHOLD,
           block_size: int | None = None, accuracy_level: int | None = None):
    """The whole hina-export: returns (model path, FusionReport or None when unfused)."""
    from tqdm.auto import tqdm

    ckpt = check_checkpoint(model_dir)
    if dtype not in DTYPES:
        raise ExportError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    check_quant_options(ckpt, dtype, block_size, fuse_graph)
    if accuracy_level is not None and dtype not in INT_DTYPES:
        raise ExportError("--accuracy-level sets the arithmetic of the 4/8-bit nodes: it needs --dtype int4 or int8")
    if not fuse_graph and dtype != "fp32":
        raise ExportError("--dtype fp16/bf16 converts the fused MoE nodes' weights; it needs fusion"
                          " (drop --no-fuse)")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stages = ["export"] + (["passes", "save"] if fuse_graph else []) + ["configs"]
    bar = tqdm(total=len(stages), desc=f"hina-export {ckpt.display_name}", unit="stage",
               disable=not progress)
    report = None
    with tempfile.TemporaryDirectory(prefix="hina-export-", dir=out) as tmp:
        unfused_dir = (out / "unfused") if keep_unfused else Path(tmp)
        bar.set_postfix_str("optimum export (tracing)")
        unfused = export_unfused(ckpt.path, out if not fuse_graph else unfused_dir, opset=opset,
                                 validate=validate)
        bar.update()
        if fuse_graph:
            bar.set_postfix_str("graph passes" + (f", quantising to {dtype}" if dtype in INT_DTYPES else ""))
            model, report = fuse(unfused, dtype=dtype, block_size=block_size, accuracy_level=accuracy_level,
                                 progress=progress, rotary_positions=rotary_positions(ckpt.config))
            bar.update()
            bar.set_postfix_str("saving")
            model_path = save_model(model, out, threshold=threshold, progress=progress)
            del model
            bar.update()
            report.to_json(out / REPORT_FILE)
        else:
            model_path = unfused
        bar.set_postfix_str("configs")
        copy_configs([ckpt.path, unfused.parent], out)
        if fuse_graph:
            write_genai_config(out)
        bar.update()
    bar.close()
    logging.getLogger(__name__).info("wrote %s", model_path)
    return model_path, report
