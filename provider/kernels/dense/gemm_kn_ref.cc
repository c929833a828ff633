// gemm_kn, the reference: the sum as tier.h states it, in float32, k in order.
#include "../dtype.h"
#include "gemm_kn.h"

namespace hinamoe {
namespace {

template <DType DT>
void gemm_kn_ref(const void* W, int64_t ldw, int64_t K, int64_t n0, int64_t n1, const float* X, int64_t ldx,
                 int64_t M, float* Y, int64_t ldy) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      float s = 0.0f;
      for (int64_t k = 0; k < K; ++k) s += X[m * ldx + k] * load_as_f32(W, k * ldw + n, DT);
      Y[m * ldy + (n - n0)] = s;
    }
}

}  // namespace

PerDType<GemmKnFn> gemm_kn_ref_kernels() {
  return {gemm_kn_ref<DType::F32>, gemm_kn_ref<DType::F16>, gemm_kn_ref<DType::BF16>};
}

}  // namespace hinamoe
