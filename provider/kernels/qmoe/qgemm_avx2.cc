// The AVX2 quantised kernels: codes decoded in registers straight from the
// packed rows (never a dequantised copy), several rows at once so several
// weight streams are in flight, a software prefetch ahead on each.
//   float path: 8-bit, 8 codes -> 8 int32 -> float -> weights by one FMA
//     (q * s - zp * s) -> one FMA per token; 4-bit, 16 codes from one
//     zero-extending load on tokens in EvenOdd order (micro_f4); for
//     blocks of 32 without zero points (both widths) the scale applied per
//     block to sum q x, the zero point once per row (micro_fq_b32);
//   int8 path (accuracy_level 4, qgemm_i8_avx2.inc): 32 codes x 32 int8
//     tokens per vpmaddubsw + vpmaddwd (8-bit: codes - 128 via sign/abs, so
//     no int16 overflow); qgemm_avx2_vnni.cc runs the same body on vpdpbusd.
// Only the functions below carry target attributes (see gemm_rows_avx2.cc).
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "qgemm_avx2_common.h"
#include "qmoe_ffn.h"

#define HQ_FN __attribute__((target("avx2,fma,f16c")))

namespace hinamoe {
namespace {

using namespace qavx2;

// Rows [n, n+R) x tokens [0, T): Y[t*ldy + r] = dot over K. Each group of 8
// codes becomes weights with one FMA, q * s + (-zp * s), shared by the T
// tokens; no cancellation, no per-block epilogue.
template <int BITS, int R, int T, DType SDT, bool ZP>
HQ_FN void micro_f(const QWeight& w, int64_t n, const float* X, int64_t ldx, float* Y, int64_t ldy) {
  const int64_t rb = w.row_stride(), bs = w.block;
  const uint8_t* row[R];
  const int64_t pf = prefetch_ahead(rb, R);
  for (int r = 0; r < R; ++r) row[r] = w.codes + (n + r) * rb;
  __m256 tot[R][T];
  float extra[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      tot[r][t] = _mm256_setzero_ps();
      extra[r][t] = 0.0f;
    }
  for (int64_t b = 0; b < w.nb; ++b) {
    const int64_t k0 = b * bs, len = w.block_end(b) - k0, kv = len / 8 * 8;  // len < bs: the partial last block
    __m256 sv[R], zv[R];
    for (int r = 0; r < R; ++r) {
      if ((b & 15) == 0) prefetch_scales<SDT>(w, n + r + HINAMOE_QPF_TILES * R, b);
      const float s = scale_at<SDT>(w, n + r, b);
      sv[r] = _mm256_set1_ps(s);
      zv[r] = _mm256_set1_ps(-float(zero_at<BITS, ZP>(w, n + r, b)) * s);
    }
    for (int64_t k = k0; k < k0 + kv; k += 8) {
      if (((k * BITS / 8) & 63) == 0)
        for (int r = 0; r < R; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(row[r] + k * BITS / 8 + pf), HINAMOE_QPF_HINT);
      __m256 xv[T];
      for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_ps(X + t * ldx + k);
      for (int r = 0; r < R; ++r) {
        const __m256 wf = _mm256_fmadd_ps(_mm256_cvtepi32_ps(codes8<BITS>(row[r], k)), sv[r], zv[r]);
        for (int t = 0; t < T; ++t) tot[r][t] = _mm256_fmadd_ps(wf, xv[t], tot[r][t]);
      }
    }
    if (kv != len)  // a block (row-wise: K) not a multiple of 8
      for (int r = 0; r < R; ++r) {
        const float s = scale_at<SDT>(w, n + r, b), zp = float(zero_at<BITS, ZP>(w, n + r, b));
        for (int t = 0; t < T; ++t)
          for (int64_t k = k0 + kv; k < k0 + len; ++k) extra[r][t] += (float(w.code(n + r, k)) - zp) * s * X[t * ldx + k];
      }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) Y[t * ldy + r] = hsum(tot[r][t]) + extra[r][t];
}

// 4-bit rows on tokens in even_odd order (avx2_f_order): 16
// codes are 8 bytes zero-extended to 8 int32 in one load; the low nibbles
// (even elements) are one AND away, the high ones (odd elements) one shift,
// so a code costs a quarter of the old broadcast/shift/AND, and both halves
// meet 8 contiguous tokens. The weights are the same q * s + (-zp * s) as
// micro_f's; groups past the last whole 16 (tokens in k order) go through
// micro_f's 8-wide step and a scalar tail.
template <int R, int T, DType SDT, bool ZP>
HQ_FN void micro_f4(const QWeight& w, int64_t n, const float* X, int64_t ldx, float* Y, int64_t ldy) {
  const int64_t rb = w.row_stride(), bs = w.block;
  const uint8_t* row[R];
  const int64_t pf = prefetch_ahead(rb, R);
  for (int r = 0; r < R; ++r) row[r] = w.codes + (n + r) * rb;
  __m256 tot[R][T];
  float extra[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      tot[r][t] = _mm256_setzero_ps();
      extra[r][t] = 0.0f;
    }
  const __m256i low4 = _mm256_set1_epi32(0xF);
  for (int64_t b = 0; b < w.nb; ++b) {
    const int64_t k0 = b * bs, kend = w.block_end(b);
    __m256 sv[R], zv[R];
    for (int r = 0; r < R; ++r) {
      if ((b & 15) == 0) prefetch_scales<SDT>(w, n + r + HINAMOE_QPF_TILES * R, b);
      const float s = scale_at<SDT>(w, n + r, b);
      sv[r] = _mm256_set1_ps(s);
      zv[r] = _mm256_set1_ps(-float(zero_at<4, ZP>(w, n + r, b)) * s);
    }
    int64_t k = k0;
    for (; k + 16 <= kend; k += 16) {
      if ((k & 127) == 0)
        for (int r = 0; r < R; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(row[r] + k / 2 + pf), HINAMOE_QPF_HINT);
      __m256 xe[T], xo[T];
      for (int t = 0; t < T; ++t) {
        xe[t] = _mm256_loadu_ps(X + t * ldx + k);
        xo[t] = _mm256_loadu_ps(X + t * ldx + k + 8);
      }
      for (int r = 0; r < R; ++r) {
        const __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row[r] + k / 2)));
        const __m256 we = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(d, low4)), sv[r], zv[r]);
        const __m256 wo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(d, 4)), sv[r], zv[r]);
        for (int t = 0; t < T; ++t) tot[r][t] = _mm256_fmadd_ps(wo, xo[t], _mm256_fmadd_ps(we, xe[t], tot[r][t]));
      }
    }
    for (; k + 8 <= kend; k += 8) {  // the tail group (k order)
      __m256 xv[T];
      for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_ps(X + t * ldx + k);
      for (int r = 0; r < R; ++r) {
        const __m256 wf = _mm256_fmadd_ps(_mm256_cvtepi32_ps(codes8<4>(row[r], k)), sv[r], zv[r]);
        for (int t = 0; t < T; ++t) tot[r][t] = _mm256_fmadd_ps(wf, xv[t], tot[r][t]);
      }
    }
    if (k < kend)
      for (int r = 0; r < R; ++r) {
        const float s = scale_at<SDT>(w, n + r, b), zp = float(zero_at<4, ZP>(w, n + r, b));
        for (int t = 0; t < T; ++t)
          for (int64_t j = k; j < kend; ++j) extra[r][t] += (float(w.code(n + r, j)) - zp) * s * X[t * ldx + j];
      }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) Y[t * ldy + r] = hsum(tot[r][t]) + extra[r][t];
}

// Blocks of 32, no zero points, K a multiple of 32 (the layout the builder
// and hina-export write): per block the codes q meet the tokens unscaled,
// sum q x, and the block's scale joins once per block and token:
// s * sum q x; the zero point 2^(bits-1) comes off once per row as
// zp * sum_b s_b * sum(x of b), a dot product of the row's scales with the
// tokens' block sums xs. A third fewer operations per code than
// dequantise-then-multiply, which is what bounds the 1-token decode. 4-bit
// tokens in EvenOdd order (16 codes per zero-extending load), 8-bit in k order.
template <int BITS, int R, int T, DType SDT>
HQ_FN void micro_fq_b32(const QWeight& w, int64_t n, const float* X, int64_t ldx, const float* xs, float* Y,
                        int64_t ldy) {
  const int64_t rb = w.row_stride();
  const uint8_t* row[R];
  for (int r = 0; r < R; ++r) row[r] = w.codes + (n + r) * rb;
  const int64_t pf = prefetch_ahead(rb, R);
  __m256 tot[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) tot[r][t] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi32(0xF);
  for (int64_t b = 0; b < w.nb; ++b) {
    const int64_t k = b * 32, kb = k * BITS / 8;
    if ((kb & 63) == 0)
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(row[r] + kb + pf), HINAMOE_QPF_HINT);
    if ((b & 15) == 0)
      for (int r = 0; r < R; ++r) prefetch_scales<SDT>(w, n + r + HINAMOE_QPF_TILES * R, b);
    for (int r = 0; r < R; ++r) {
      __m256 q[4];
      if constexpr (BITS == 4) {
        const __m256i d0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row[r] + kb)));
        const __m256i d1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row[r] + kb + 8)));
        q[0] = _mm256_cvtepi32_ps(_mm256_and_si256(d0, low4));
        q[1] = _mm256_cvtepi32_ps(_mm256_srli_epi32(d0, 4));
        q[2] = _mm256_cvtepi32_ps(_mm256_and_si256(d1, low4));
        q[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(d1, 4));
      } else {
        for (int i = 0; i < 4; ++i)
          q[i] = _mm256_cvtepi32_ps(
              _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row[r] + kb + 8 * i))));
      }
      const __m256 sv = _mm256_set1_ps(scale_at<SDT>(w, n + r, b));
      for (int t = 0; t < T; ++t) {
        const float* x = X + t * ldx + k;
        __m256 a = _mm256_mul_ps(q[0], _mm256_loadu_ps(x));
        a = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(x + 8), a);
        a = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(x + 16), a);
        a = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x + 24), a);
        tot[r][t] = _mm256_fmadd_ps(a, sv, tot[r][t]);
      }
    }
  }
  constexpr float kZero = float(1 << (BITS - 1));
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) Y[t * ldy + r] = hsum(tot[r][t]) - kZero * dot_scales<SDT>(w, n + r, xs + t * w.nb);
}

// The float micro-kernel of a width: 4-bit on even_odd tokens, 8-bit in k order.
template <int BITS, int R, int T, DType SDT, bool ZP>
inline void micro_float(const QWeight& w, int64_t n, const float* X, int64_t ldx, float* Y, int64_t ldy) {
  if constexpr (BITS == 4) micro_f4<R, T, SDT, ZP>(w, n, X, ldx, Y, ldy);
  else micro_f<BITS, R, T, SDT, ZP>(w, n, X, ldx, Y, ldy);
}

// Row blocks (kRowBlock), in each every token tile of up to 3.
template <int BITS, DType SDT, bool ZP>
HQ_FN void qgemm_t(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
             int64_t ldy) {
  // Blocks of 32 without zero points: micro_fq_b32 on the tokens' block sums.
  std::vector<float> xs;
  if constexpr (!ZP) {
    if (w.block == 32 && w.K % 32 == 0 && w.nb > 1) {
      xs.resize(size_t(M * w.nb));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t b = 0; b < w.nb; ++b) {
          const __m256 a = _mm256_add_ps(_mm256_loadu_ps(X + m * ldx + 32 * b), _mm256_loadu_ps(X + m * ldx + 32 * b + 8));
          const __m256 c = _mm256_add_ps(_mm256_loadu_ps(X + m * ldx + 32 * b + 16), _mm256_loadu_ps(X + m * ldx + 32 * b + 24));
          xs[size_t(m * w.nb + b)] = hsum(_mm256_add_ps(a, c));
        }
    }
  }
  for (int64_t r0 = n0; r0 < n1; r0 += kRowBlock) {
    const int64_t r1 = std::min(n1, r0 + kRowBlock);
    for (int64_t m = 0; m < M; m += 3) {
      const int64_t T = std::min<int64_t>(3, M - m);
      const float* x = X + m * ldx;
      float* y = Y + m * ldy;
      int64_t n = r0;
      if constexpr (!ZP) {
        if (!xs.empty()) {
          const float* s = xs.data() + m * w.nb;
          if (T == 1) {
            for (; n + 4 <= r1; n += 4) micro_fq_b32<BITS, 4, 1, SDT>(w, n, x, ldx, s, y + (n - n0), ldy);
            for (; n < r1; ++n) micro_fq_b32<BITS, 1, 1, SDT>(w, n, x, ldx, s, y + (n - n0), ldy);
          } else if (T == 2) {
            for (; n + 3 <= r1; n += 3) micro_fq_b32<BITS, 3, 2, SDT>(w, n, x, ldx, s, y + (n - n0), ldy);
            for (; n < r1; ++n) micro_fq_b32<BITS, 1, 2, SDT>(w, n, x, ldx, s, y + (n - n0), ldy);
          } else {
            for (; n + 2 <= r1; n += 2) micro_fq_b32<BITS, 2, 3, SDT>(w, n, x, ldx, s, y + (n - n0), ldy);
            for (; n < r1; ++n) micro_fq_b32<BITS, 1, 3, SDT>(w, n, x, ldx, s, y + (n - n0), ldy);
          }
          continue;
        }
      }
      if (T == 1) {
        for (; n + 4 <= r1; n += 4) micro_float<BITS, 4, 1, SDT, ZP>(w, n, x, ldx, y + (n - n0), ldy);
        for (; n < r1; ++n) micro_float<BITS, 1, 1, SDT, ZP>(w, n, x, ldx, y + (n - n0), ldy);
      } else if (T == 2) {
        for (; n + 3 <= r1; n += 3) micro_float<BITS, 3, 2, SDT, ZP>(w, n, x, ldx, y + (n - n0), ldy);
        for (; n < r1; ++n) micro_float<BITS, 1, 2, SDT, ZP>(w, n, x, ldx, y + (n - n0), ldy);
      } else {
        for (; n + 2 <= r1; n += 2) micro_float<BITS, 2, 3, SDT, ZP>(w, n, x, ldx, y + (n - n0), ldy);
        for (; n < r1; ++n) micro_float<BITS, 1, 3, SDT, ZP>(w, n, x, ldx, y + (n - n0), ldy);
      }
    }
  }
}

// Picks the instantiation for the weight's scale type and zero points.
template <int BITS>
void qgemm_avx2(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
                int64_t ldy) {
  const bool zp = w.zero_points != nullptr;
  switch (w.scale_dtype) {
    case DType::F32:
      return zp ? qgemm_t<BITS, DType::F32, true>(w, n0, n1, X, ldx, M, Y, ldy)
                : qgemm_t<BITS, DType::F32, false>(w, n0, n1, X, ldx, M, Y, ldy);
    case DType::F16:
      return zp ? qgemm_t<BITS, DType::F16, true>(w, n0, n1, X, ldx, M, Y, ldy)
                : qgemm_t<BITS, DType::F16, false>(w, n0, n1, X, ldx, M, Y, ldy);
    default:
      return zp ? qgemm_t<BITS, DType::BF16, true>(w, n0, n1, X, ldx, M, Y, ldy)
                : qgemm_t<BITS, DType::BF16, false>(w, n0, n1, X, ldx, M, Y, ldy);
  }
}

// The int8-token dot on vpmaddubsw + vpmaddwd (qgemm_i8_avx2.inc).
struct I8Dot {
  static constexpr int kShift8 = 128;  // 8-bit codes enter as q - 128 (|q - 128| and its sign on the tokens)
  template <int BITS>
  HQ_INLINE static void codes32(const uint8_t* row, int64_t k, __m256i* u, __m256i* sgn) {
    if constexpr (BITS == 4) {
      *u = nibbles32(row, k);
    } else {
      *sgn = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k)),
                              _mm256_set1_epi8(char(0x80)));
      *u = _mm256_abs_epi8(*sgn);
    }
  }
  template <int BITS>
  HQ_INLINE static void codes16(const uint8_t* row, int64_t k, __m256i* u, __m256i* sgn) {
    if constexpr (BITS == 4) {
      *u = nibbles16(row, k);
    } else {
      const __m128i q = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)),
                                      _mm_set1_epi8(char(0x80)));
      *sgn = _mm256_zextsi128_si256(q);
      *u = _mm256_zextsi128_si256(_mm_abs_epi8(q));
    }
  }
  // Two 4-bit pair sums stay under 2 * 15 * 127 * 2: added in int16 before vpmaddwd.
  HQ_INLINE static __m256i pair4(__m256i lo, __m256i hi, __m256i xe, __m256i xo) {
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
  }
  // 4-bit products stay under 15 * 127 * 2, 8-bit under 128 * 127 * 2: no int16 saturation.
  template <int BITS>
  HQ_INLINE static __m256i dot(__m256i acc, __m256i u, __m256i sgn, __m256i x) {
    const __m256i p = BITS == 4 ? _mm256_maddubs_epi16(u, x) : _mm256_maddubs_epi16(u, _mm256_sign_epi8(x, sgn));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
};

#define HQ_I8_FN HQ_FN
#include "qgemm_i8_avx2.inc"
#undef HQ_I8_FN

// 4-bit float rows in EvenOdd order (micro_f4, micro_fq_b32); int8 codes
// in Pair32 for 4-bit blocks of 32 in pairs without zero points, else EvenOdd.
TokenOrder avx2_f_order(int bits, int64_t, int64_t, bool) {
  return bits == 4 ? TokenOrder::EvenOdd : TokenOrder::KOrder;
}
TokenOrder avx2_i8_order(int bits, int64_t block, int64_t K, bool zero_points) {
  if (bits != 4) return TokenOrder::KOrder;
  return block == 32 && K % 64 == 0 && !zero_points ? TokenOrder::Pair32 : TokenOrder::EvenOdd;
}

}  // namespace

const QuantKernels& quant_avx2() {
  static const QuantKernels q = [] {
    QuantKernels t;
    t.name = "avx2";
    t.gemm[0] = qgemm_avx2<4>;
    t.gemm[1] = qgemm_avx2<8>;
    t.gemm_i8[0] = qgemm_i8<4>;
    t.gemm_i8[1] = qgemm_i8<8>;
    t.f_order = avx2_f_order;
    t.i8_order = avx2_i8_order;
    return t;
  }();
  return q;
}

}  // namespace hinamoe
