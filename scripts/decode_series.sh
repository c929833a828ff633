#!/usr/bin/env bash
# The whole-model decode series: real-shape random-weight models (full
# width: all experts; LAYERS decoder layers; vocabulary 4096) built offline,
# then `hina-bench decode` on each, HinaMoE against the CPU EP, and a table.
#
#   gpt-oss-20b    hf_real_shape --genai -> genai's model builder -p fp32 / -p int4,
#                  and the fp32 folder with bf16 experts (hinamoe.export.convert)
#   qwen3-30b-a3b  hf_real_shape -> hina-export fp32 / int4, and the fp32 folder
#                  with bf16 experts
#   bf16 copies run on HinaMoE against their fp32 original on the CPU EP
#   (which has no bf16 MoE).
#
# Existing outputs are reused (REBUILD=1 builds again). One model at a time:
# fp32 gpt-oss-20b is ~3.3 GB per layer, and building its checkpoint peaks
# at ~2x the model (13.4 GB for 2 layers).
#
#   scripts/decode_series.sh                      # LAYERS=2 ROUNDS=5 MODELS=/work/models
#   LAYERS=1 ROUNDS=3 ONLY="gpt-oss-20b-fp32" scripts/decode_series.sh
#   scripts/decode_series.sh table                # the table of what is measured
set -euo pipefail
cd "$(dirname "$0")/.."

MODELS=${MODELS:-/work/models}
GENAI_PY=${GENAI_PY:-build/venv-genai/bin/python}  # onnxruntime-genai + transformers 5 (.ci/run builds it)
EXPORT_PY=${EXPORT_PY:-python3}                     # hinamoe with the export extra (transformers 4.57)
LAYERS=${LAYERS:-2}
ROUNDS=${ROUNDS:-5}
PROMPT=${PROMPT:-128}
NEW_TOKENS=${NEW_TOKENS:-64}
THREADS=${THREADS:-2}
REBUILD=${REBUILD:-0}
ONLY=${ONLY:-}  # space-separated run names (below); empty: all

L=$LAYERS
CKPT=$MODELS/ckpt
GENAI=$MODELS/genai
EXPORT=$MODELS/export
RESULTS=$MODELS/results
LOGS=$MODELS/logs
mkdir -p "$CKPT" "$GENAI" "$EXPORT" "$RESULTS" "$LOGS"

# build OUT CMD...: runs CMD (which writes OUT) unless OUT exists; a failed
# build leaves no OUT behind.
build() {
  local out=$1; shift
  if [ -e "$out" ] && [ "$REBUILD" != 1 ]; then echo "== have $out"; return; fi
  rm -rf "$out"
  echo "== build $out"
  local log
  log="$LOGS/build-$(basename "$out").log"
  if ! /usr/bin/time -v "$@" >"$log" 2>&1; then
    rm -rf "$out"
    echo "build of $out failed; see $log" >&2
    tail -n 20 "$log" >&2
    return 1
  fi
  grep -E "Elapsed|Maximum resident" "$log" | sed 's/^\s*/   /'
}

wanted() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }

# measure NAME PY MODEL [extra hina-bench options]
measure() {
  local name=$1 py=$2 model=$3; shift 3
  wanted "$name" || return 0
  echo "== hina-bench decode $name"
  local plot=()  # a plot where that Python has matplotlib (the CI genai venv does not)
  if "$py" -c "import matplotlib" 2>/dev/null; then plot=(--plot "$RESULTS/$name.png"); fi
  "$py" -m hinamoe.bench decode "$model" --prompt "$PROMPT" --new-tokens "$NEW_TOKENS" --rounds "$ROUNDS" \
    --threads "$THREADS" --json "$RESULTS/$name.json" "${plot[@]}" "$@" \
    2>"$LOGS/decode-$name.err" | tee "$LOGS/decode-$name.log"
  grep -h "^warning" "$LOGS/decode-$name.err" || true
}

table() {
  "$EXPORT_PY" - "$RESULTS" "$L" <<'EOF'
import json, re, sys
from pathlib import Path

import onnx

from hinamoe.bench.decode import ms_per_token_at_depth

results, layers = Path(sys.argv[1]), int(sys.argv[2])
DEPTH = {"gpt-oss-20b": 24, "qwen3-30b-a3b": 48}  # the released models' layers
# onnx data type -> bytes per element (4-bit weights are stored as uint8 codes)
SIZE = {1: 4, 2: 1, 3: 1, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 16: 2}
LAYER = re.compile(r"layers[./_](\d+)[./_]")


def layer_bytes(model_dir):
    """Initializer bytes of decoder layer 0, and of everything outside the layers."""
    path = Path(model_dir) if Path(model_dir).is_absolute() else results.parent / model_dir
    m = onnx.load(str(path / "model.onnx"), load_external_data=False)
    inside, outside = {}, 0
    for t in m.graph.initializer:
        n = SIZE.get(t.data_type, 4)
        for d in t.dims:
            n *= d
        hit = LAYER.search(t.name)
        if hit:
            inside[int(hit.group(1))] = inside.get(int(hit.group(1)), 0) + n
        else:
            outside += n
    return inside.get(0, 0), outside


rows = []
for f in sorted(results.glob(f"*-L{layers}-*.json")):
    r = json.loads(f.read_text())
    shape, prec = re.match(rf"(.*)-L{layers}-(.*)\.json", f.name).groups()
    h, c = r["eps"]["HinaMoE"], r["eps"]["CPU"]
    per_layer, rest = layer_bytes(r["meta"]["model"])
    full = {ep: ms_per_token_at_depth(r["eps"][ep], DEPTH.get(shape, layers)) for ep in ("HinaMoE", "CPU")}
    ops = lambda e: " ".join(f"{g.split('/')[0]} {v:.1f}" for g, v in sorted(e["ops"]["decode_ms_per_token"].items(),
                                                                      key=lambda kv: -kv[1]))
    others = max((x.get("other_cores") or 0) for ep in ("HinaMoE", "CPU") for x in r["eps"][ep]["rounds"])
    rows.append((shape, prec, r["meta"]["client"], str(layers), f"{h['summary']['decode_tokens_per_s']:.1f}",
                 f"{c['summary']['decode_tokens_per_s']:.1f}", f"{r['decode_speedup']:.2f}",
                 f"{r['prefill_speedup']:.2f}", str(r["same_tokens"]), f"{per_layer / 1e9:.3f}", f"{rest / 1e9:.3f}",
                 f"{full['CPU'] / full['HinaMoE']:.2f} ({DEPTH.get(shape, layers)} L)" if full["CPU"] else "-",
                 f"{others:.2f}", ops(h), ops(c)))
head = ("model", "precision", "client", "layers", "HinaMoE tok/s", "CPU tok/s", "decode x", "prefill x", "same tokens",
        "GB/layer", "GB rest", "est. full depth x", "max other cores", "HinaMoE ms/token by op", "CPU ms/token by op")
print("| " + " | ".join(head) + " |")
print("|" + "---|" * len(head))
for row in rows:
    print("| " + " | ".join(row) + " |")
EOF
}

if [ "${1:-}" = table ]; then table; exit 0; fi

# --- gpt-oss-20b through genai's model builder
G=gpt-oss-20b-L$L
if wanted "$G-fp32" || wanted "$G-int4" || wanted "$G-bf16"; then
  build "$CKPT/$G" "$GENAI_PY" -m hinamoe.models.hf_real_shape gpt-oss-20b "$CKPT/$G" --layers "$L" --experts 32 --genai
  for p in fp32 int4; do
    build "$GENAI/$G-$p" "$GENAI_PY" -m onnxruntime_genai.models.builder -i "$CKPT/$G" -o "$GENAI/$G-$p" \
      -e cpu -p "$p" -c "$MODELS/cache/$G"
  done
  build "$GENAI/$G-bf16" "$GENAI_PY" -m hinamoe.export.convert "$GENAI/$G-fp32" "$GENAI/$G-bf16" --dtype bf16 --quiet
fi
measure "$G-fp32" "$GENAI_PY" "$GENAI/$G-fp32"
measure "$G-int4" "$GENAI_PY" "$GENAI/$G-int4"
measure "$G-bf16" "$GENAI_PY" "$GENAI/$G-bf16" --cpu-model "$GENAI/$G-fp32"

# --- qwen3-30b-a3b through hina-export (load_causal_lm + generate)
Q=qwen3-30b-a3b-L$L
if wanted "$Q-fp32" || wanted "$Q-int4" || wanted "$Q-bf16"; then
  build "$CKPT/$Q" "$EXPORT_PY" -m hinamoe.models.hf_real_shape qwen3-30b-a3b "$CKPT/$Q" --layers "$L" --experts 128
  build "$EXPORT/$Q-fp32" "$EXPORT_PY" -m hinamoe.export.cli "$CKPT/$Q" "$EXPORT/$Q-fp32" --quiet
  build "$EXPORT/$Q-int4" "$EXPORT_PY" -m hinamoe.export.cli "$CKPT/$Q" "$EXPORT/$Q-int4" --dtype int4 --quiet
  build "$EXPORT/$Q-bf16" "$EXPORT_PY" -m hinamoe.export.convert "$EXPORT/$Q-fp32" "$EXPORT/$Q-bf16" --dtype bf16 --quiet
fi
measure "$Q-fp32" "$EXPORT_PY" "$EXPORT/$Q-fp32"
measure "$Q-int4" "$EXPORT_PY" "$EXPORT/$Q-int4"
measure "$Q-bf16" "$EXPORT_PY" "$EXPORT/$Q-bf16" --cpu-model "$EXPORT/$Q-fp32"

table
