// The gemm_kn kernels of each ISA (tier.h's GemmKnFn), for the tier tables.
#pragma once

#include "../tier.h"

namespace hinamoe {

void fill_gemm_kn_ref(GemmKnFn (&out)[kNumDTypes]);
void fill_gemm_kn_avx2(GemmKnFn (&out)[kNumDTypes]);
void fill_gemm_kn_avx512(GemmKnFn (&out)[kNumDTypes]);
// nullptr where the CPU lacks AVX512-BF16.
GemmKnBf16Fn gemm_kn_bf16_avx512();

}  // namespace hinamoe
