// The gemm_rows kernels of each ISA (tier.h's GemmRowsFn and
// GemmRowsStridedFn, every element type), for the tier tables (tiers.cc).
#pragma once

#include "../tier.h"

namespace hinamoe {

struct GemmRowsKernels {
  PerDType<GemmRowsFn> rows;
  PerDType<GemmRowsStridedFn> strided;
};

GemmRowsKernels gemm_rows_ref_kernels();
GemmRowsKernels gemm_rows_avx2_kernels();
GemmRowsKernels gemm_rows_avx512_kernels();
// bf16 weights and bf16 tokens on vdpbf16ps; nullptr where the CPU lacks AVX512-BF16.
GemmRowsBf16Fn gemm_rows_bf16_avx512();

}  // namespace hinamoe
