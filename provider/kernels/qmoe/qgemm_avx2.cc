// The AVX2 quantised kernels: codes decoded in registers straight from the
// packed rows (never a dequantised copy), several rows at once so several
// weight streams are in flight, a software prefetch ahead on each.
//   float path: 8 codes -> 8 int32 (4-bit: one broadcast dword shifted by
//     0,4,..,28, which is exactly the order of the nibbles) -> float ->
//     weights by one FMA (q * s - zp * s) -> one FMA per token;
//   int8 path (accuracy_level 4): 32 codes x 32 int8 tokens per
//     vpmaddubsw + vpmaddwd (8-bit: codes - 128 via sign/abs, so no int16
//     overflow), the block's scales folded in after the integer dot, the
//     zero point through the tokens' per-block code sums.
// Only the functions below carry target attributes (see gemm_rows_avx2.cc).
#include <immintrin.h>

#include <algorithm>

#include "qmoe_ffn.h"

#define HQ_FN __attribute__((target("avx2,fma,f16c")))
#define HQ_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline

namespace hinamoe {
namespace {

#ifndef HINAMOE_QPF_BYTES
#define HINAMOE_QPF_BYTES 1024
#endif
constexpr int64_t kPrefetchBytes = HINAMOE_QPF_BYTES;  // software prefetch distance on each row

HQ_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <DType SDT>
HQ_INLINE float scale_at(const QWeight& w, int64_t n, int64_t b) {
  const int64_t i = n * w.nb + b;
  if constexpr (SDT == DType::F32) return static_cast<const float*>(w.scales)[i];
  else if constexpr (SDT == DType::F16) return _cvtsh_ss(static_cast<const uint16_t*>(w.scales)[i]);
  else return bf16_to_f32(static_cast<const uint16_t*>(w.scales)[i]);
}

// The zero point of (row n, block b); without zero points the constant 2^(bits-1).
template <int BITS, bool ZP>
HQ_INLINE int zero_at(const QWeight& w, int64_t n, int64_t b) {
  if constexpr (!ZP) return 1 << (BITS - 1);
  else return w.zero_point(n, b);
}

// 8 codes of a row starting at element k (k a multiple of 8) as int32.
template <int BITS>
HQ_INLINE __m256i codes8(const uint8_t* row, int64_t k) {
  if constexpr (BITS == 4) {
    int32_t d;
    __builtin_memcpy(&d, row + k / 2, 4);
    const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(d), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    return _mm256_and_si256(v, _mm256_set1_epi32(0xF));
  } else {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k)));
  }
}

// Rows [n, n+R) x tokens [0, T): Y[t*ldy + r] = dot over K. Each group of 8
// codes becomes weights with one FMA, q * s + (-zp * s), shared by the T
// tokens; no cancellation, no per-block epilogue.
template <int BITS, int R, int T, DType SDT, bool ZP>
HQ_FN void micro_f(const QWeight& w, int64_t n, const float* X, int64_t ldx, float* Y, int64_t ldy) {
  const int64_t rb = w.row_bytes(), bs = w.block;
  const uint8_t* row[R];
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
      const float s = scale_at<SDT>(w, n + r, b);
      sv[r] = _mm256_set1_ps(s);
      zv[r] = _mm256_set1_ps(-float(zero_at<BITS, ZP>(w, n + r, b)) * s);
    }
    for (int64_t k = k0; k < k0 + kv; k += 8) {
      if (((k * BITS / 8) & 63) == 0)
        for (int r = 0; r < R; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(row[r] + k * BITS / 8 + kPrefetchBytes), _MM_HINT_T0);
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

// 32 codes at element k (a multiple of 32) as the unsigned operand of
// vpmaddubsw, and the signs to put on the tokens: 4-bit, the codes in the
// even_odd order of the tokens (sign unused); 8-bit, |q - 128| and q - 128.
template <int BITS>
HQ_INLINE void codes32(const uint8_t* row, int64_t k, __m256i* u, __m256i* sgn) {
  if constexpr (BITS == 4) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2));
    const __m128i m = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    *u = _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi));
  } else {
    *sgn = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k)),
                            _mm256_set1_epi8(char(0x80)));  // q - 128 as int8
    *u = _mm256_abs_epi8(*sgn);
  }
}

// The same for 16 codes (blocks of 16), in the low lane.
template <int BITS>
HQ_INLINE void codes16(const uint8_t* row, int64_t k, __m256i* u, __m256i* sgn) {
  if constexpr (BITS == 4) {
    const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k / 2));
    const __m128i m = _mm_set1_epi8(0x0F);
    *u = _mm256_zextsi128_si256(_mm_unpacklo_epi64(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m)));
  } else {
    const __m128i q = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)),
                                    _mm_set1_epi8(char(0x80)));
    *sgn = _mm256_zextsi128_si256(q);
    *u = _mm256_zextsi128_si256(_mm_abs_epi8(q));
  }
}

// acc += pairwise-summed products of codes and tokens x, as 8 int32.
template <int BITS>
HQ_INLINE __m256i dot_acc(__m256i acc, __m256i u, __m256i sgn, __m256i x) {
  const __m256i p = BITS == 4 ? _mm256_maddubs_epi16(u, x) : _mm256_maddubs_epi16(u, _mm256_sign_epi8(x, sgn));
  return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

template <int BITS, int R, int T, DType SDT, bool ZP>
HQ_FN void micro_i8(const QWeight& w, int64_t n, const QTokens& x, float* Y, int64_t ldy) {
  const int64_t rb = w.row_bytes(), bs = w.block;
  const uint8_t* row[R];
  for (int r = 0; r < R; ++r) row[r] = w.codes + (n + r) * rb;
  __m256 tot[R][T];
  float extra[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      tot[r][t] = _mm256_setzero_ps();
      extra[r][t] = 0.0f;
    }
  for (int64_t b = 0; b < w.nb; ++b) {
    const int64_t k0 = b * bs, kend = w.block_end(b);  // kend < k0 + bs: the partial last block
    __m256i acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_si256();
    int64_t k = k0;
    for (; k + 32 <= kend; k += 32) {
      if (((k * BITS / 8) & 63) == 0)
        for (int r = 0; r < R; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(row[r] + k * BITS / 8 + kPrefetchBytes), _MM_HINT_T0);
      __m256i xv[T];
      for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + t * x.ld + k));
      for (int r = 0; r < R; ++r) {
        __m256i u, sgn = _mm256_setzero_si256();
        codes32<BITS>(row[r], k, &u, &sgn);
        for (int t = 0; t < T; ++t) acc[r][t] = dot_acc<BITS>(acc[r][t], u, sgn, xv[t]);
      }
    }
    if (k + 16 <= kend) {  // a 16-element block or rest of one
      __m256i xv[T];
      for (int t = 0; t < T; ++t)
        xv[t] = _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.q + t * x.ld + k)));
      for (int r = 0; r < R; ++r) {
        __m256i u, sgn = _mm256_setzero_si256();
        codes16<BITS>(row[r], k, &u, &sgn);
        for (int t = 0; t < T; ++t) acc[r][t] = dot_acc<BITS>(acc[r][t], u, sgn, xv[t]);
      }
      k += 16;
    }
    // Under 16 elements left (partial last block): scalar, tokens in k order.
    int32_t tail[R][T] = {};
    for (; k < kend; ++k)
      for (int r = 0; r < R; ++r) {
        const int c = w.code(n + r, k) - (BITS == 8 ? 128 : 0);
        for (int t = 0; t < T; ++t) tail[r][t] += c * int32_t(x.q[t * x.ld + k]);
      }
    for (int r = 0; r < R; ++r) {
      const float sw = scale_at<SDT>(w, n + r, b);
      // 4-bit: sum q x - zp sum x; 8-bit: sum (q-128) x + (128 - zp) sum x.
      const int zp = zero_at<BITS, ZP>(w, n + r, b);
      const int zterm = BITS == 4 ? -zp : 128 - zp;
      for (int t = 0; t < T; ++t) {
        const float s = sw * x.scale[t * x.nb + b];
        tot[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][t]), _mm256_set1_ps(s), tot[r][t]);
        extra[r][t] += s * float(zterm * x.sum[t * x.nb + b] + tail[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) Y[t * ldy + r] = hsum(tot[r][t]) + extra[r][t];
}

// 4-bit rows on tokens in even_odd order (QuantKernels::f_even_odd): 16
// codes are 8 bytes zero-extended to 8 int32 in one load; the low nibbles
// (even elements) are one AND away, the high ones (odd elements) one shift,
// so a code costs a quarter of the old broadcast/shift/AND, and both halves
// meet 8 contiguous tokens. The weights are the same q * s + (-zp * s) as
// micro_f's; groups past the last whole 16 (tokens in k order) go through
// micro_f's 8-wide step and a scalar tail.
template <int R, int T, DType SDT, bool ZP>
HQ_FN void micro_f4(const QWeight& w, int64_t n, const float* X, int64_t ldx, float* Y, int64_t ldy) {
  const int64_t rb = w.row_bytes(), bs = w.block;
  const uint8_t* row[R];
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
      const float s = scale_at<SDT>(w, n + r, b);
      sv[r] = _mm256_set1_ps(s);
      zv[r] = _mm256_set1_ps(-float(zero_at<4, ZP>(w, n + r, b)) * s);
    }
    int64_t k = k0;
    for (; k + 16 <= kend; k += 16) {
      if ((k & 127) == 0)
        for (int r = 0; r < R; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(row[r] + k / 2 + kPrefetchBytes), _MM_HINT_T0);
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

// The float micro-kernel of a width: 4-bit on even_odd tokens, 8-bit in k order.
template <int BITS, int R, int T, DType SDT, bool ZP>
inline void micro_float(const QWeight& w, int64_t n, const float* X, int64_t ldx, float* Y, int64_t ldy) {
  if constexpr (BITS == 4) micro_f4<R, T, SDT, ZP>(w, n, X, ldx, Y, ldy);
  else micro_f<BITS, R, T, SDT, ZP>(w, n, X, ldx, Y, ldy);
}

// Rows in blocks of kRowBlock, and within a block every token tile (up to 3
// tokens, rows as many as the registers allow: 4, 3 or 2): the block's rows
// come from memory once and stay in L1 for the later token tiles, instead of
// streaming the whole row range once per token tile.
constexpr int64_t kRowBlock = 12;  // a multiple of 4, 3 and 2

template <int BITS, DType SDT, bool ZP>
void qgemm_t(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
             int64_t ldy) {
  for (int64_t r0 = n0; r0 < n1; r0 += kRowBlock) {
    const int64_t r1 = std::min(n1, r0 + kRowBlock);
    for (int64_t m = 0; m < M; m += 3) {
      const int64_t T = std::min<int64_t>(3, M - m);
      const float* x = X + m * ldx;
      float* y = Y + m * ldy;
      int64_t n = r0;
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

template <int BITS, DType SDT, bool ZP>
void qgemm_i8_t(const QWeight& w, int64_t n0, int64_t n1, const QTokens& X, int64_t M, float* Y, int64_t ldy) {
  for (int64_t r0 = n0; r0 < n1; r0 += kRowBlock) {
    const int64_t r1 = std::min(n1, r0 + kRowBlock);
    for (int64_t m = 0; m < M; m += 3) {
      const int64_t T = std::min<int64_t>(3, M - m);
      QTokens x = X;
      x.q += m * X.ld;
      x.scale += m * X.nb;
      x.sum += m * X.nb;
      float* y = Y + m * ldy;
      int64_t n = r0;
      if (T == 1) {
        for (; n + 4 <= r1; n += 4) micro_i8<BITS, 4, 1, SDT, ZP>(w, n, x, y + (n - n0), ldy);
        for (; n < r1; ++n) micro_i8<BITS, 1, 1, SDT, ZP>(w, n, x, y + (n - n0), ldy);
      } else if (T == 2) {
        for (; n + 3 <= r1; n += 3) micro_i8<BITS, 3, 2, SDT, ZP>(w, n, x, y + (n - n0), ldy);
        for (; n < r1; ++n) micro_i8<BITS, 1, 2, SDT, ZP>(w, n, x, y + (n - n0), ldy);
      } else {
        for (; n + 2 <= r1; n += 2) micro_i8<BITS, 2, 3, SDT, ZP>(w, n, x, y + (n - n0), ldy);
        for (; n < r1; ++n) micro_i8<BITS, 1, 3, SDT, ZP>(w, n, x, y + (n - n0), ldy);
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

template <int BITS>
void qgemm_i8_avx2(const QWeight& w, int64_t n0, int64_t n1, const QTokens& X, int64_t M, float* Y, int64_t ldy) {
  const bool zp = w.zero_points != nullptr;
  switch (w.scale_dtype) {
    case DType::F32:
      return zp ? qgemm_i8_t<BITS, DType::F32, true>(w, n0, n1, X, M, Y, ldy)
                : qgemm_i8_t<BITS, DType::F32, false>(w, n0, n1, X, M, Y, ldy);
    case DType::F16:
      return zp ? qgemm_i8_t<BITS, DType::F16, true>(w, n0, n1, X, M, Y, ldy)
                : qgemm_i8_t<BITS, DType::F16, false>(w, n0, n1, X, M, Y, ldy);
    default:
      return zp ? qgemm_i8_t<BITS, DType::BF16, true>(w, n0, n1, X, M, Y, ldy)
                : qgemm_i8_t<BITS, DType::BF16, false>(w, n0, n1, X, M, Y, ldy);
  }
}

}  // namespace

const QuantKernels& quant_avx2() {
  static const QuantKernels q = [] {
    QuantKernels t;
    t.name = "avx2";
    t.gemm[0] = qgemm_avx2<4>;
    t.gemm[1] = qgemm_avx2<8>;
    t.gemm_i8[0] = qgemm_i8_avx2<4>;
    t.gemm_i8[1] = qgemm_i8_avx2<8>;
    t.i8_even_odd = true;
    t.f_even_odd = true;
    return t;
  }();
  return q;
}

}  // namespace hinamoe
