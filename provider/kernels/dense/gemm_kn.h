// The gemm_kn kernels of each ISA (tier.h's GemmKnFn), for the tier tables.
#pragma once

#include "../tier.h"

namespace hinamoe {

PerDType<GemmKnFn> gemm_kn_ref_kernels();
PerDType<GemmKnFn> gemm_kn_avx2_kernels();
PerDType<GemmKnFn> gemm_kn_avx512_kernels();
// nullptr where the CPU lacks AVX512-BF16.
GemmKnBf16Fn gemm_kn_bf16_avx512();

}  // namespace hinamoe
