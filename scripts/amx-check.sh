#!/usr/bin/env bash
# Runs HinaMoE's AMX checks on a machine that has AMX (lscpu shows amx_tile):
# builds the package and the C++ kernel tests, runs them on silicon (real
# TDPBF16PS vs the emulator), the MoE tests with isa=amx, and
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

echo "== C++ kernel tests on silicon (they include real AMX vs the tile emulator)"
cmake -S provider/kernels -B build/amx-check -DCMAKE_BUILD_TYPE=Release > "$out/kernel-build.log"
cmake --build build/amx-check -j "$(nproc)" --target hinamoe_kernel_tests hinamoe_kernel_bench >> "$out/kernel-build.log"
./build/amx-check/hinamoe_kernel_tests 2>&1 | tee "$out/kernel-tests.log"
./build/amx-check/hinamoe_kernel_bench --tier amx --shape both --dtype bf16 --m 1,2,4,8,16 \
  --threads "$(nproc)" 2>&1 | tee "$out/kernel-bench.log"

echo "== MoE tests through the EP (the isa=amx cases run only here)"
python3 -m pytest -q tests/test_ep_correctness.py tests/test_numa_ep.py 2>&1 | tee "$out/pytest-amx.log"

echo "== hina-bench ffn --isa amx"
hina-bench ffn --isa amx --tokens 1,2,4,8,16 --dtypes bf16 --threads "$(nproc)" --out "$out/bench" 2>&1 | tee "$out/bench.log"

echo "== done: $out"
