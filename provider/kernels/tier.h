// A kernel tier: every op's ISA-specific kernels for one ISA level, as one
// table of function pointers filled once (tiers.cc, tinyBLAS style). The
// drivers (moe/, qmoe/, dense/, gqa/) are tier-agnostic.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "dtype.h"

namespace hinamoe {

// Small GEMM against weight rows in place:
//   Y[m*ldy + (n - n0)] = sum_{k<K} W[n*K + k] * X[m*ldx + k]
// for n in [n0, n1), m in [0, M). W has the tier's element type (row-major
// [N, K], never repacked); X and Y are float. All M tokens share one pass
// over the W rows.
using GemmRowsFn = void (*)(const void* W, int64_t K, int64_t n0, int64_t n1,
                            const float* X, int64_t ldx, int64_t M, float* Y, int64_t ldy);

// The same over a K slice of rows `ldw` elements apart:
//   Y[m*ldy + (n - n0)] = sum_{k<K} W[n*ldw + k] * X[m*ldx + k]
// (gemm_rows is this with ldw == K). The NUMA-partitioned driver calls it on
// a node's local segments: W and X already point at the segment's first
// column, K is its length, ldw the distance between rows that share it.
using GemmRowsStridedFn = void (*)(const void* W, int64_t ldw, int64_t K, int64_t n0, int64_t n1,
                                   const float* X, int64_t ldx, int64_t M, float* Y, int64_t ldy);

// Small GEMM against a [K, N] weight (ONNX MatMul's B) in place:
//   Y[m*ldy + (n - n0)] = sum_{k<K} X[m*ldx + k] * W[k*ldw + n]
// for n in [n0, n1), m in [0, M). W has the tier's element type; X and Y
// are float. Rows of W are read whole, a band of rows at a time, for all M
// tokens at once (dense/gemm_kn_impl.h).
using GemmKnFn = void (*)(const void* W, int64_t ldw, int64_t K, int64_t n0, int64_t n1,
                          const float* X, int64_t ldx, int64_t M, float* Y, int64_t ldy);

// gemm_rows for bfloat16 W and bfloat16 tokens X (rows ldx apart), on
// vdpbf16ps: the same sums in float32, each product exact.
using GemmRowsBf16Fn = void (*)(const uint16_t* W, int64_t K, int64_t n0, int64_t n1, const uint16_t* X,
                                int64_t ldx, int64_t M, float* Y, int64_t ldy);

// gemm_kn for bfloat16 W and bfloat16 tokens A [M, lda], on instructions
// that multiply pairs of bfloat16 (AVX512-BF16's vdpbf16ps): the same sum
// in float32, each product exact, without widening A to float first.
using GemmKnBf16Fn = void (*)(const uint16_t* W, int64_t ldw, int64_t K, int64_t n0, int64_t n1,
                              const uint16_t* A, int64_t lda, int64_t M, float* Y, int64_t ldy);

// One kernel per element type, indexed by int(DType).
template <class Fn>
using PerDType = std::array<Fn, kNumDTypes>;

struct MoEAttrs;
struct QuantKernels;
struct GqaTier;
namespace numa {
struct SegmentTable;
}  // namespace numa

// Token-transforming expert kernels (the AMX tiers, paper §4): weights stay
// in place as the A operand; the tokens of an expert are gathered once into
// a VNNI bf16 buffer, gate/up blocks write the activations straight into the
// VNNI layout the down projection reads, down blocks write float rows
// y[m*ldy + h] for h in [h0, h1). Weight pointers are per expert, bf16.
struct ExpertBlockKernels {
  int64_t (*vnni_elems)(int64_t K, int64_t M);
  void (*gather)(const void* x, DType dtype, int64_t H, const int32_t* rows, int64_t M, uint16_t* xv);
  void (*gate_up)(const MoEAttrs& attrs, int64_t H, int64_t I, const uint16_t* fc1_w, const void* fc1_b,
                  const uint16_t* fc3_w, const void* fc3_b, DType bias_dtype, const uint16_t* xv, int64_t M,
                  int64_t j0, int64_t j1, uint16_t* actv);
  void (*down)(int64_t H, int64_t I, const uint16_t* fc2_w, const void* fc2_b, DType bias_dtype,
               const uint16_t* actv, int64_t M, int64_t h0, int64_t h1, const float* route_weight,
               bool accumulate, float* y, int64_t ldy);
  int64_t row_block;  // blocks of j and h are multiples of this (tile rows)
  // NUMA-partitioned execution (more than one node): one node's partial
  // sums P[(r - r0)*ldp + m] of rows [r0, r1) of W [*, K] over the node's
  // local segments of `table` (tokens tok: VNNI, K x M); then, on the
  // node-order sums laid out as rows [row][M], the epilogues of gate_up
  // (h: fc1 rows, Separate fc3 rows at I + j) and of down (acc: rows [H][M]).
  void (*node_partial)(const numa::SegmentTable& table, int node, const uint16_t* W, int64_t K, int64_t r0,
                       int64_t r1, const uint16_t* tok, int64_t M, float* P, int64_t ldp);
  void (*gate_up_finish)(const MoEAttrs& attrs, int64_t I, const void* fc1_b, const void* fc3_b, DType bias_dtype,
                         const float* h, int64_t M, int64_t j0, int64_t j1, uint16_t* actv);
  void (*down_finish)(const void* fc2_b, DType bias_dtype, const float* acc, int64_t M, int64_t h0, int64_t h1,
                      const float* route_weight, bool accumulate, float* y, int64_t ldy);
};

struct KernelTier {
  const char* name = "";
  PerDType<GemmRowsFn> gemm_rows{};                // MoE experts: [N, K] weight rows
  PerDType<GemmRowsStridedFn> gemm_rows_strided{};  // same math, any row stride (NUMA)
  PerDType<GemmKnFn> gemm_kn{};                    // the dense MatMul's [K, N] weights
  // Where the CPU multiplies bfloat16 pairs (AVX512-BF16): the bf16 MoE
  // experts with several tokens each, and the bf16 dense MatMul.
  GemmRowsBf16Fn gemm_rows_bf16 = nullptr;
  GemmKnBf16Fn gemm_kn_bf16 = nullptr;
  // When set, bf16 weights go through these instead of gemm_rows.
  const ExpertBlockKernels* bf16_blocks = nullptr;
  const QuantKernels* quant = nullptr;  // QMoE and MatMulNBits (qmoe/qmoe_ffn.h)
  const GqaTier* gqa = nullptr;         // GroupQueryAttention (gqa/gqa.h)
  const GqaTier* gqa_tiles = nullptr;   // amx only: the tile GQA kernel, run where asked for by name
};

// Tiers compiled into this build.
const KernelTier& ref_tier();
const KernelTier& avx2_tier();     // only where tier_unavailable_reason("avx2") is ""
const KernelTier& avx512_tier();   // only where tier_unavailable_reason("avx512") is ""
const KernelTier& amx_tier();      // only where tier_unavailable_reason("amx") is ""
const KernelTier& amx_emu_tier();  // the AMX kernels on the software tile emulator (slow; tests)

// Tier names, best first, that this CPU can run ("amx", "avx512", "avx2",
// "ref", "amx-emu"; the emulator is always listed last: it is for tests).
std::vector<std::string> supported_tiers();
// Why a tier cannot run here ("" if it can). Unknown names say so.
std::string tier_unavailable_reason(const std::string& name);
// Why the avx2 tier cannot use AVX-VNNI (vpdpbusd on ymm; its int8-token
// QMoE kernels, qmoe/qgemm_avx2_vnni.cc) here ("" if it can).
std::string avx_vnni_unavailable_reason();
// Why the avx512 tier cannot use AVX512-VNNI (vpdpbusd on zmm; its int8-token
// QMoE kernels, qmoe/qgemm_avx512.cc) here ("" if it can).
std::string avx512_vnni_unavailable_reason();
// "" where the avx512 tier runs and the CPU has AVX512-BF16.
std::string avx512_bf16_unavailable_reason();
// Resolves "auto" or a tier name to a tier. On failure returns nullptr and
// sets *error (unknown name, or the CPU lacks the instructions).
const KernelTier* select_tier(const std::string& name, std::string* error);
// Names accepted by select_tier, for messages and --help.
const char* tier_names();

}  // namespace hinamoe
