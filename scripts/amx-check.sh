#!/usr/bin/env bash
# Runs HinaMoE's AMX checks on a machine that has AMX (lscpu shows amx_tile):
# builds the package and the AMX tests, runs the tile tests on silicon
# (real TDPBF16PS vs the emulator), the MoE tests with isa=amx, and
# `hina-bench ffn --isa amx` on the paper's shapes, 1-16 tokens per expert.
#
#   scripts/amx-check.sh [OUT_DIR]      (default: amx-results-<host>-<date>)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! grep -qw amx_tile /proc/cpuinfo; then
  echo "amx-check: this CPU has no AMX (no 'amx_tile' in /proc/cpuinfo / lscpu flags)." >&2
  echo "amx-check: the AMX kernels can only be checked here through the emulator: isa=amx-emu." >&2
  exit 2
fi

out="${1:-amx-results-$(hostname)-$(date +%Y%m%d-%H%M)}"
mkdir -p "$out"
echo "== results go to $out"
{ lscpu; echo; uname -a; } > "$out/machine.txt"

echo "== pip install .[test]"
python3 -m pip install --quiet ".[test]"

echo "== AMX tile tests on silicon (emulator vs hardware)"
cmake -S provider/kernels/amx -B build/amx-check -DCMAKE_BUILD_TYPE=Release > "$out/amx-build.log"
cmake --build build/amx-check -j "$(nproc)" >> "$out/amx-build.log"
./build/amx-check/hinamoe_amx_tests 2>&1 | tee "$out/amx-tests.log"

echo "== MoE tests with isa=amx"
HINAMOE_ISA=amx python3 -m pytest -q tests/test_ep_correctness.py 2>&1 | tee "$out/pytest-amx.log"

echo "== hina-bench ffn --isa amx"
hina-bench ffn --isa amx --tokens 1,2,4,8,16 --dtypes bf16 --threads "$(nproc)" --out "$out/bench" 2>&1 | tee "$out/bench.log"

echo "== done: $out"
