// The reference tier: plain scalar loops that state what gemm_rows computes.
// Slow but obviously right; the other tiers are tested against the same math.
#include "gemm_rows.h"

namespace hinamoe {
namespace {

template <DType DT>
void gemm_rows_strided_ref(const void* W, int64_t ldw, int64_t K, int64_t n0, int64_t n1, const float* X,
                           int64_t ldx, int64_t M, float* Y, int64_t ldy) {
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += load_as_f32(W, n * ldw + k, DT) * X[m * ldx + k];
      Y[m * ldy + (n - n0)] = acc;
    }
  }
}

template <DType DT>
void gemm_rows_ref(const void* W, int64_t K, int64_t n0, int64_t n1, const float* X, int64_t ldx,
                   int64_t M, float* Y, int64_t ldy) {
  gemm_rows_strided_ref<DT>(W, K, K, n0, n1, X, ldx, M, Y, ldy);
}

}  // namespace

GemmRowsKernels gemm_rows_ref_kernels() {
  return {{gemm_rows_ref<DType::F32>, gemm_rows_ref<DType::F16>, gemm_rows_ref<DType::BF16>},
          {gemm_rows_strided_ref<DType::F32>, gemm_rows_strided_ref<DType::F16>, gemm_rows_strided_ref<DType::BF16>}};
}

}  // namespace hinamoe
