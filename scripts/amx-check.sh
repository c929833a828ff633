#!/usr/bin/env bash
# HinaMoE's AMX checks, for a machine that has AMX (lscpu shows amx_tile):
# the C++ kernel tests on silicon (real TDPBF16PS and TDPB[SU][SU]D against the
# tile emulator, the bf16 and the AMX-INT8 QMoE kernels against their
# emulated runs), the pytest cases that select isa=amx / amx-emu, the kernel
# micro-benchmarks (bf16: amx and avx2 tiers; AMX-INT8 QMoE block kernel),
# and hina-bench ffn / gqa with isa=amx and isa=avx2.
#
#   scripts/amx-check.sh [OUT_DIR]             build here with pip, then check
#   scripts/amx-check.sh --prepare DIR         on any x86-64 machine: build the
#                                              package and the test binaries into DIR
#   scripts/amx-check.sh --prebuilt DIR [OUT]  check with what --prepare built
#                                              (no network, no compiler needed;
#                                              python3 with onnxruntime, numpy,
#                                              onnx, onnx-ir, ml_dtypes, pytest)
#
# Every step has a time limit, so a slow step cannot eat the others' time.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

build_into() {  # build_into DIR: the package (pip --target) and the C++ kernel binaries
  local dir
  dir=$(realpath -m "$1")
  python3 -m pip install --quiet --no-deps --target "$dir/site" . || return 1
  cmake -S provider/kernels -B "$dir/kernels" -DCMAKE_BUILD_TYPE=Release > "$dir/kernel-build.log" || return 1
  cmake --build "$dir/kernels" -j "$(nproc)" \
    --target hinamoe_kernel_tests hinamoe_kernel_bench hinamoe_gqa_bench hinamoe_qmoe_i8_bench >> "$dir/kernel-build.log" || return 1
}

if [[ "${1:-}" == "--prepare" ]]; then
  [[ $# -eq 2 ]] || { echo "usage: $0 --prepare DIR" >&2; exit 2; }
  build_into "$2" && echo "amx-check: built into $2; on the AMX machine: $0 --prebuilt $2"
  exit
fi

prebuilt=""
if [[ "${1:-}" == "--prebuilt" ]]; then
  [[ $# -ge 2 ]] || { echo "usage: $0 --prebuilt DIR [OUT_DIR]" >&2; exit 2; }
  prebuilt=$(realpath "$2")
  shift 2
fi

if ! grep -qw amx_tile /proc/cpuinfo; then
  echo "amx-check: this CPU has no AMX (no 'amx_tile' in /proc/cpuinfo / lscpu flags)." >&2
  echo "amx-check: the AMX kernels can only be checked here through the emulator: isa=amx-emu." >&2
  exit 2
fi

out=$(realpath -m "${1:-amx-results-$(hostname)-$(date +%Y%m%d-%H%M)}")
mkdir -p "$out"
exec > >(tee -a "$out/log.txt") 2>&1
start=$(date +%s)
step() { echo "[t+$(($(date +%s) - start))s] == $*"; }

step "machine"
lscpu > "$out/machine.txt"
grep -E "Model name|Socket|Core|NUMA node\(|L3" "$out/machine.txt"
echo "flags: $(grep -o -w -E 'amx_[a-z0-9]+|avx512_bf16|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')"

if [[ -z "$prebuilt" ]]; then
  step "build"
  prebuilt="$root/build/amx-check"
  build_into "$prebuilt" || { echo "amx-check: build failed (see $prebuilt/kernel-build.log)"; exit 1; }
fi
export PYTHONPATH="$prebuilt/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
bin="$prebuilt/kernels"
threads=2; [[ $(nproc) -gt 2 ]] && threads="2,$(nproc)"  # the issue's 2 threads, and all cores
timeout 30 python3 -m hinamoe

step "C++ kernel tests (real AMX against the emulator included)"
timeout 300 "$bin/hinamoe_kernel_tests" > "$out/kernel-tests.txt" 2>&1
echo "rc=$?"; grep -E "tiers here|FAIL|passed" "$out/kernel-tests.txt"
echo "AMX-INT8 (real tiles against the emulator; 'skipped' means the CPU lacks AMX-INT8):"
grep -E -B1 "^real_amx_(int8|qmoe_i8)" "$out/kernel-tests.txt" | grep -E "skipped|^real_amx"
grep -E "FAIL \[real_amx_(int8|qmoe_i8)" "$out/kernel-tests.txt" | head -5

step "pytest: the isa=amx and amx-emu cases"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/moe/test_ep_correctness.py tests/ep/test_numa_ep.py \
  tests/test_gqa_bf16.py -k amx 2>&1 | tail -5

step "kernel micro-benchmark, bf16, amx and avx2"
for tier in amx avx2; do
  for t in ${threads//,/ }; do
    timeout 90 "$bin/hinamoe_kernel_bench" --tier $tier --shape both --dtype bf16 --m 1,2,4,8,16 --threads "$t"
  done
done

step "AMX-INT8 QMoE block kernel micro-benchmark, int4 and int8, block 32"
for t in ${threads//,/ }; do
  timeout 120 "$bin/hinamoe_qmoe_i8_bench" --tier amx --shape both --bits 4,8 --block 32 --m 1,2,4,8,16 \
    --threads "$t" | tee -a "$out/qmoe-i8-bench.txt"
done

step "hina-bench ffn, bf16, isa=amx and avx2 (no CPU EP column: its f32 models take minutes to build)"
for tier in amx avx2; do
  timeout 240 python3 -m hinamoe.bench ffn --models qwen3-30b-a3b,deepseek-v3 --tokens 1,2,4,8,16 \
    --dtypes bf16 --threads "$threads" --isa $tier --no-cpu-ep --no-progress --out "$out/ffn-$tier"
done

step "hina-bench gqa, bf16, isa=amx and avx2"
for tier in amx avx2; do
  timeout 240 python3 -m hinamoe.bench gqa --shapes qwen3-30b-a3b,gpt-oss-20b --contexts 2048,32768 \
    --batches 1,4 --threads 2 --dtypes bf16 --isa $tier --no-cpu-ep --no-progress --out "$out/gqa-$tier"
done
step "done: $out"
