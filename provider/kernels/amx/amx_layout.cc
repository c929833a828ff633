// Layout transforms (see amx_layout.h). Written so the inner loops walk the
// source contiguously; the strided side is the small token operand.
#include "amx_layout.h"

#include <cstring>

namespace hinamoe {
namespace amx {

void gather_vnni(const void* x, DType dtype, int64_t K, const int32_t* rows, int64_t M, uint16_t* xv) {
  const int64_t Kp = round_up32(K), ld = 2 * M;
  for (int64_t m = 0; m < M; ++m) {
    const int64_t r = rows[m];
    uint16_t* col = xv + 2 * m;
    if (dtype == DType::BF16) {
      const uint16_t* src = static_cast<const uint16_t*>(x) + r * K;
      for (int64_t k = 0; k < K; ++k) col[(k >> 1) * ld + (k & 1)] = src[k];
    } else if (dtype == DType::F32) {
      const float* src = static_cast<const float*>(x) + r * K;
      for (int64_t k = 0; k < K; ++k) col[(k >> 1) * ld + (k & 1)] = f32_to_bf16(src[k]);
    } else {
      const uint16_t* src = static_cast<const uint16_t*>(x) + r * K;
      for (int64_t k = 0; k < K; ++k) col[(k >> 1) * ld + (k & 1)] = f32_to_bf16(f16_to_f32(src[k]));
    }
    for (int64_t k = K; k < Kp; ++k) col[(k >> 1) * ld + (k & 1)] = 0;
  }
}

void vnni_zero_tail(int64_t K, int64_t M, uint16_t* v) {
  const int64_t Kp = round_up32(K);
  int64_t k = K;
  if (k & 1) {  // the odd half of the last pair row
    for (int64_t m = 0; m < M; ++m) v[vnni_index(k, m, M)] = 0;
    ++k;
  }
  if (Kp > k) std::memset(v + (k / 2) * 2 * M, 0, size_t((Kp - k) / 2) * size_t(2 * M) * 2);
}

void store_vnni_block(const float* src, int64_t ld, int64_t rows, int64_t cols, int64_t k0, int64_t m0,
                      int64_t M, uint16_t* v) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t k = k0 + r;
    uint16_t* dst = v + (k / 2) * (2 * M) + 2 * m0 + (k & 1);
    const float* s = src + r * ld;
    for (int64_t c = 0; c < cols; ++c) dst[2 * c] = f32_to_bf16(s[c]);
  }
}

void store_transposed(const float* acc, int64_t ld, int64_t rows, int64_t cols, const float* bias,
                      const float* w, int64_t h0, int64_t m0, bool accumulate, float* y, int64_t ldy) {
  for (int64_t c = 0; c < cols; ++c) {
    const float s = w ? w[m0 + c] : 1.0f;
    float* out = y + (m0 + c) * ldy + h0;
    for (int64_t r = 0; r < rows; ++r) {
      const float v = s * (acc[r * ld + c] + (bias ? bias[r] : 0.0f));
      out[r] = accumulate ? out[r] + v : v;
    }
  }
}

}  // namespace amx
}  // namespace hinamoe
