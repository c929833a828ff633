// The reference quantised kernels: scalar loops that state the math.
// Float path: each weight dequantised, (q - zp) * scale, then a float dot.
// Int8 path: per block, the integer dot of codes and int8 tokens, scaled.
#include "qmoe_ffn.h"

namespace hinamoe {
namespace {

void qgemm_ref(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
               int64_t ldy) {
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.0f;
      for (int64_t k = 0; k < w.K; ++k) {
        const int64_t b = k / w.block;
        const float wv = float(w.code(n, k) - w.zero_point(n, b)) * w.scale(n, b);
        acc += wv * X[m * ldx + k];
      }
      Y[m * ldy + (n - n0)] = acc;
    }
  }
}

void qgemm_i8_ref(const QWeight& w, int64_t n0, int64_t n1, const QTokens& x, int64_t M, float* Y, int64_t ldy) {
  for (int64_t n = n0; n < n1; ++n) {
    for (int64_t m = 0; m < M; ++m) {
      float acc = 0.0f;
      for (int64_t b = 0; b < w.nb; ++b) {
        int32_t dot = 0;
        for (int64_t k = b * w.block; k < w.block_end(b); ++k) {
          dot += w.code(n, k) * int32_t(x.q[m * x.ld + token_pos(x.order, k, w.K)]);
        }
        dot -= w.zero_point(n, b) * x.sum[m * x.scale_stride() + b];
        acc += w.scale(n, b) * x.scale[m * x.scale_stride() + b] * float(dot);
      }
      Y[m * ldy + (n - n0)] = acc;
    }
  }
}

}  // namespace

const QuantKernels& quant_ref() {
  static const QuantKernels q = [] {
    QuantKernels t;
    t.name = "ref";
    t.gemm[0] = t.gemm[1] = qgemm_ref;
    t.gemm_i8[0] = t.gemm_i8[1] = qgemm_i8_ref;
    return t;
  }();
  return q;
}

}  // namespace hinamoe
