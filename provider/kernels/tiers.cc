// Every tier's table, filled once on first use: for one ISA level, the
// kernels of every op (MoE expert rows, dense MatMul, QMoE / MatMulNBits,
// GroupQueryAttention). Which CPU features a tier needs is cpu_features.cc;
// what each kernel family holds is its folder's header.
#include "amx/amx_detect.h"
#include "amx/expert_block_kernels.h"
#include "dense/gemm_kn.h"
#include "gqa/gqa.h"
#include "gqa/gqa_amx.h"
#include "moe/gemm_rows.h"
#include "qmoe/qmoe_ffn.h"
#include "tier.h"

namespace hinamoe {
namespace {

KernelTier with_rows(const char* name, const GemmRowsKernels& k) {
  KernelTier t;
  t.name = name;
  t.gemm_rows = k.rows;
  t.gemm_rows_strided = k.strided;
  return t;
}

// The AMX tiers: bf16 expert weights on the HiNa micro-kernel (`blocks`);
// f32/f16 expert weights, which AMX BF16 cannot take in place, on the best
// row-streaming kernels this CPU has; the dense MatMul on the avx512 tier's
// kernels (every AMX CPU has AVX-512); GQA on the avx2 kernels.
KernelTier amx_table(const char* name, const ExpertBlockKernels& blocks) {
  const bool zmm = tier_unavailable_reason("avx512").empty();
  KernelTier t = with_rows(name, tier_unavailable_reason("avx2").empty() ? gemm_rows_avx2_kernels()
                                                                         : gemm_rows_ref_kernels());
  t.gemm_kn = zmm ? gemm_kn_avx512_kernels() : gemm_kn_ref_kernels();
  t.gemm_kn_bf16 = zmm ? gemm_kn_bf16_avx512() : nullptr;
  t.bf16_blocks = &blocks;
  t.gqa = tier_unavailable_reason("avx2").empty() ? &gqa_avx2_tier() : &gqa_ref_tier();
  return t;
}

}  // namespace

const KernelTier& ref_tier() {
  static const KernelTier tier = [] {
    KernelTier t = with_rows("ref", gemm_rows_ref_kernels());
    t.gemm_kn = gemm_kn_ref_kernels();
    t.quant = &quant_ref();
    t.gqa = &gqa_ref_tier();
    return t;
  }();
  return tier;
}

const KernelTier& avx2_tier() {
  static const KernelTier tier = [] {
    KernelTier t = with_rows("avx2", gemm_rows_avx2_kernels());
    t.gemm_kn = gemm_kn_avx2_kernels();
    t.quant = avx_vnni_unavailable_reason().empty() ? &quant_avx2_vnni() : &quant_avx2();
    t.gqa = &gqa_avx2_tier();
    return t;
  }();
  return tier;
}

const KernelTier& avx512_tier() {
  static const KernelTier tier = [] {
    KernelTier t = with_rows("avx512", gemm_rows_avx512_kernels());
    t.gemm_kn = gemm_kn_avx512_kernels();
    t.gemm_kn_bf16 = gemm_kn_bf16_avx512();
    t.gemm_rows_bf16 = gemm_rows_bf16_avx512();
    t.quant = &quant_avx512();
    t.gqa = &gqa_avx512_tier();
    return t;
  }();
  return tier;
}

// QMoE on amx runs the avx512 kernels, with bf16 tiles from tile_min_tokens
// on: the AMX-INT8 block kernel is slower than the zmm ones on silicon
// (docs/kernels.md, "Tuning knobs"), so quant_amx() runs only where called by
// name (tests, hinamoe_qmoe_i8_bench). GQA's tile kernel runs only where
// asked for by name too (select_gqa_tier).
const KernelTier& amx_tier() {
  static const KernelTier tier = [] {
    KernelTier t = amx_table("amx", amx_expert_blocks());
    t.quant = amx_unavailable_reason().empty() && avx512_bf16_unavailable_reason().empty() ? &quant_avx512_tiles()
                                                                                           : &quant_avx512();
    t.gqa_tiles = &gqa_amx_tier();
    return t;
  }();
  return tier;
}

// The AMX kernels on the software tile emulator (tests): AMX-INT8 for the
// int8-token QMoE path, the bf16 tile kernels, the tile GQA kernel.
const KernelTier& amx_emu_tier() {
  static const KernelTier tier = [] {
    KernelTier t = amx_table("amx-emu", amx_emu_expert_blocks());
    t.quant = &quant_amx_emu();
    t.gqa = &gqa_amx_emu_tier();
    return t;
  }();
  return tier;
}

}  // namespace hinamoe
