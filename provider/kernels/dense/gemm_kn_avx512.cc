// gemm_kn on AVX-512 (16 lanes); built for baseline x86-64 with the target
// on each function (isa_target.h).
#include "../vec_avx512.h"
#include "gemm_kn.h"

#define KN_INLINE HINAMOE_AVX512_INLINE
#include "gemm_kn_impl.h"

namespace hinamoe {
namespace {

template <DType DT>
HINAMOE_AVX512_FN void gemm_kn_avx512(const void* W, int64_t ldw, int64_t K, int64_t n0, int64_t n1, const float* X,
                                      int64_t ldx, int64_t M, float* Y, int64_t ldy) {
  kn_impl::gemm_kn<avx512::Vec, DT>(W, ldw, K, n0, n1, X, ldx, M, Y, ldy);
}

}  // namespace

PerDType<GemmKnFn> gemm_kn_avx512_kernels() {
  return {gemm_kn_avx512<DType::F32>, gemm_kn_avx512<DType::F16>, gemm_kn_avx512<DType::BF16>};
}

}  // namespace hinamoe
