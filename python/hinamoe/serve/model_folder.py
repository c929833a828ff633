"""What the server needs to know of a model folder: its ONNX file, how its
graph keeps the KV cache, its context length, end-of-sequence tokens and
tokenizer.

Three kinds of folder are read:

* onnxruntime-genai (``genai_config.json``: the builder's output, or any
  folder genai runs): GroupQueryAttention fed from the attention mask, so
  the ``"front"`` KV layout.
* hina-export / optimum (``model.onnx`` + ``config.json``): keys appended by
  concatenation and rotary from ``position_ids``, the ``"back"`` layout. A
  fused hina-export folder also has a genai_config.json (so genai runs it);
  its fusion_report.json says it is read as hina-export's.
* ``hinamoe.models.tiny_lm`` (``tiny_lm.json``): genai's graph form.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_CONTEXT = 4096  # when the folder names none, or a longer one than asked


class ModelFolderError(ValueError):
    pass


@dataclass
class ModelFolder:
    path: Path
    model_file: Path
    kind: str                 # "genai", "export" or "tiny_lm"
    layout: str               # KVBatch layout: "front" or "back"
    context_length: int
    eos_token_ids: set[int] = field(default_factory=set)
    kv_shape: tuple[int, int] | None = None   # (KV heads, head size) where the folder's config says
    rings: dict[str, int] = field(default_factory=dict)   # ring-buffer past inputs -> capacity
    vocab: int = 0                                        # the logits' last dimension (0: symbolic)
    share_buffer: bool = False  # caches may be bound as past and present at once (spare columns)

    @property
    def name(self) -> str:
        return self.path.resolve().name

    def tokenizer(self):
        """The folder's Hugging Face tokenizer (``transformers.AutoTokenizer``)."""
        try:
            from transformers import AutoTokenizer
        except ImportError as e:
            raise ModelFolderError("hina-serve needs transformers for the tokenizer: "
                                   "pip install 'hinamoe[serve]'") from e
        try:
            return AutoTokenizer.from_pretrained(str(self.path))
        except (OSError, ValueError) as e:
            raise ModelFolderError(f"{self.path}: no tokenizer could be loaded ({e})") from e


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ModelFolderError(f"{path}: {e}") from e


def _ids(value) -> set[int]:
    if value is None:
        return set()
    return {int(v) for v in (value if isinstance(value, list) else [value])}


def _graph_facts(model_file: Path, slack: int = 0) -> tuple[dict[str, int], int, bool]:
    """From the graph (no weights loaded): the past inputs kept as
    sliding-window rings (GroupQueryAttention ``sliding_window_cache=1``,
    genai's gpt-oss) with their capacity, the window plus genai's
    ``cache_slack``; the vocabulary (the logits' last dimension); and whether
    its metadata allows past and present to share buffers (hina-export)."""
    import onnx

    from ..graph_passes.gqa_fusion import SHARE_BUFFER_KEY

    model = onnx.load(str(model_file), load_external_data=False)
    graph = model.graph
    marked = any(p.key == SHARE_BUFFER_KEY and p.value == "1" for p in model.metadata_props)
    rings = {}
    for n in graph.node:
        attrs = {a.name: a.i for a in n.attribute}
        if n.op_type == "GroupQueryAttention" and attrs.get("sliding_window_cache"):
            window = attrs.get("local_window_size", -1)
            if window <= 0:
                raise ModelFolderError(f"{model_file}: GroupQueryAttention {n.name!r} keeps a ring cache "
                                       "without a local_window_size")
            for past in n.input[3:5]:
                rings[past] = window + slack
    logits = next((o for o in graph.output if o.name == "logits"), None)
    dims = logits.type.tensor_type.shape.dim if logits is not None else []
    return rings, int(dims[-1].dim_value) if dims else 0, marked


def is_export_folder(path: str | Path) -> bool:
    """A hina-export (or optimum) folder, whether or not it also has a
    genai_config.json: model.onnx and config.json, and where genai_config.json
    exists hina-export's fusion_report.json beside it (genai's builder writes
    no config.json; a converted builder folder gets a report but no config)."""
    path = Path(path)
    if not ((path / "model.onnx").is_file() and (path / "config.json").is_file()):
        return False
    return not (path / "genai_config.json").is_file() or (path / "fusion_report.json").is_file()


def read_model_folder(path: str | Path, context_length: int = 0) -> ModelFolder:
    """Reads ``path`` (see the module doc). ``context_length``: the longest
    sequence to serve (0: the model's own, at most ``DEFAULT_CONTEXT``)."""
    path = Path(path)
    if not path.is_dir():
        raise ModelFolderError(f"{path} is not a folder")
    eos: set[int] = set()
    slack = 0
    if (path / "genai_config.json").is_file() and not is_export_folder(path):
        genai = _json(path / "genai_config.json")
        cfg = genai.get("model", {})
        kind, layout = "genai", "front"
        model_file = path / cfg.get("decoder", {}).get("filename", "model.onnx")
        own = int(cfg.get("context_length", 0))
        eos |= _ids(cfg.get("eos_token_id"))
        dec = cfg.get("decoder", {})
        kv_shape = (dec["num_key_value_heads"], dec["head_size"]) if {"num_key_value_heads", "head_size"} <= set(dec) \
            else None
        slack = int(dec.get("sliding_window", {}).get("cache_slack", 0))
        # genai's own loop shares them where its config says so: the graph
        # then reads every length from the attention mask.
        share = bool(genai.get("search", {}).get("past_present_share_buffer", False))
    elif (path / "tiny_lm.json").is_file():
        kind, layout = "tiny_lm", "front"
        model_file = path / "model.onnx"
        own = int(_json(path / "tiny_lm.json").get("max_length", 0))
        kv_shape = None  # its graph names them
        share = False
    elif is_export_folder(path):
        kind, layout = "export", "back"
        model_file = path / "model.onnx"
        cfg = _json(path / "config.json")
        own = int(cfg.get("max_position_embeddings", 0))
        eos |= _ids(cfg.get("eos_token_id"))
        heads = cfg.get("num_attention_heads")
        head_dim = cfg.get("head_dim") or (cfg["hidden_size"] // heads if heads and "hidden_size" in cfg else None)
        kv_shape = (cfg.get("num_key_value_heads", heads), head_dim) if heads and head_dim else None
        share = False  # unless the graph's metadata says so (below)
    else:
        raise ModelFolderError(f"{path}: not a model folder (expected genai_config.json, "
                               "model.onnx + config.json from hina-export, or tiny_lm.json)")
    if not model_file.is_file():
        raise ModelFolderError(f"{path}: {model_file.name} is missing")
    rings, vocab, marked = _graph_facts(model_file, slack)
    share = share or marked
    if (path / "generation_config.json").is_file():
        eos |= _ids(_json(path / "generation_config.json").get("eos_token_id"))
    if context_length < 0:
        raise ModelFolderError(f"context length {context_length} must be >= 0")
    ctx = context_length or min(own or DEFAULT_CONTEXT, DEFAULT_CONTEXT)
    if own and ctx > own:
        raise ModelFolderError(f"context length {ctx} exceeds the model's {own}")
    return ModelFolder(path, model_file, kind, layout, ctx, eos, kv_shape, rings, vocab, share)
