// gemm_kn on AVX2 (8 lanes, FMA, F16C); built for baseline x86-64 with the
// target on each function (isa_target.h).
#include "../vec_avx2.h"
#include "gemm_kn.h"

#define KN_INLINE HINAMOE_AVX2_INLINE
#include "gemm_kn_impl.h"

namespace hinamoe {
namespace {

template <DType DT>
HINAMOE_AVX2_FN void gemm_kn_avx2(const void* W, int64_t ldw, int64_t K, int64_t n0, int64_t n1, const float* X,
                                  int64_t ldx, int64_t M, float* Y, int64_t ldy) {
  kn_impl::gemm_kn<avx2::Vec, DT>(W, ldw, K, n0, n1, X, ldx, M, Y, ldy);
}

}  // namespace

PerDType<GemmKnFn> gemm_kn_avx2_kernels() {
  return {gemm_kn_avx2<DType::F32>, gemm_kn_avx2<DType::F16>, gemm_kn_avx2<DType::BF16>};
}

}  // namespace hinamoe
