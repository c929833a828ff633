// The avx512 tier's int8-token kernels (accuracy_level 4) for a few tokens
// per call (1-11), on AVX512-VNNI vpdpbusd: blocks of 32 without zero
// points; 4-bit four blocks per 64-byte load (Quad32, a block per 128-bit
// lane), 8-bit two (a block per 256-bit half).
#include "qgemm_avx512.h"

#include <vector>

#include "../aligned_buffer.h"

namespace hinamoe {
namespace qz {
namespace {

#ifndef HINAMOE_QZ_I8_R1
// Rows per 1-token int8-token micro-kernel: 6 shares each token load and
// scale permute over more rows than 4 (docs/kernels.md, Zen 4).
#define HINAMOE_QZ_I8_R1 6
#endif

// 4-bit, blocks of 32 without zero points, tokens in Quad32 order: one
// 64-byte load holds 128 codes, the four blocks one per 128-bit lane, so
// the low nibbles meet the even tokens and the high ones the odd tokens of
// all four at once and each int32 lane of the two dots belongs to one
// block; one conversion and one FMA by [s_w * s_x] per block finish four
// blocks. A last group of 64 (K = 64 mod 128) goes as Pair32 on ymm. The
// zero point 8 is in the integer dot: each (token, lane) starts from
// -8 * the sum of the token codes that lane meets (token_bias), so
// sum (q - 8) x needs no correction afterwards.
template <int R, int T, DType SDT>
HINAMOE_AVX512_VNNI_FN void micro_i8_q32(const QWeight& w, int64_t n, const QTokens& x, const int32_t* bias, int64_t ldb,
                             float* Y, int64_t ldy) {
  const int64_t rb = w.row_stride();
  const int64_t pf = prefetch_ahead(rb, R);
  const uint8_t* row[R];
  for (int r = 0; r < R; ++r) row[r] = w.codes + (n + r) * rb;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i quad = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  __m512 tot[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) tot[r][t] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 128 <= w.K; k += 128) {
    const int64_t b = k / 32;
    __m512i lo[R], hi[R];
    __m512 sw[R];
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(row[r] + k / 2 + pf), HINAMOE_QPF_HINT);
      if ((b & 15) == 0) prefetch_scales<SDT>(w, n + r + HINAMOE_QPF_TILES * R, b);
      const __m512i v = _mm512_loadu_si512(row[r] + k / 2);
      lo[r] = _mm512_and_si512(v, low4);
      hi[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      sw[r] = _mm512_permutexvar_ps(quad, _mm512_zextps128_ps512(scales4<SDT>(w, n + r, b)));
    }
    for (int t = 0; t < T; ++t) {
      const int8_t* xq = x.q + t * x.ld + k;
      const __m512i xe = _mm512_loadu_si512(xq), xo = _mm512_loadu_si512(xq + 64);
      const __m512 sx = _mm512_permutexvar_ps(quad, _mm512_zextps128_ps512(_mm_loadu_ps(x.scale + t * x.scale_stride() + b)));
      const __m512i b0 = _mm512_loadu_si512(bias + t * ldb + k / 8);
      for (int r = 0; r < R; ++r) {
        const __m512i acc = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(b0, lo[r], xe), hi[r], xo);
        tot[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(sw[r], sx), tot[r][t]);
      }
    }
  }
  __m256 tail[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) tail[r][t] = _mm256_setzero_ps();
  if (k < w.K) {  // 64 left: two blocks in Pair32 order
    const int64_t b = k / 32;
    const __m256i low4y = _mm256_set1_epi8(0x0F);
    const __m256i pairs = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    for (int r = 0; r < R; ++r) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row[r] + k / 2));
      const __m256i lo = _mm256_and_si256(v, low4y), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4y);
      const __m256 sw = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(scales2<SDT>(w, n + r, b)), pairs);
      for (int t = 0; t < T; ++t) {
        const int8_t* xq = x.q + t * x.ld + k;
        const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
        const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32));
        const __m128 two = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(x.scale + t * x.scale_stride() + b)));
        const __m256 sx = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(two), pairs);
        const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias + t * ldb + k / 8));
        const __m256i acc = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(b0, lo, xe), hi, xo);
        tail[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(sw, sx), tail[r][t]);
      }
    }
  }
  float sum[R * T];
  lane_sums<R, T>(tot, sum);
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      Y[t * ldy + r] = sum[r * T + t] + hsum(tail[r][t]);
}

// 8-bit, blocks of 32 without zero points, tokens in k order: 64 codes (two
// blocks, one per 256-bit half) per vpdpbusd and token, the codes raw
// (u8 x s8 sums in int32), the zero point 128 in the start value as above.
template <int R, int T, DType SDT>
HINAMOE_AVX512_VNNI_FN void micro_i8_d32(const QWeight& w, int64_t n, const QTokens& x, const int32_t* bias, int64_t ldb,
                             float* Y, int64_t ldy) {
  const int64_t rb = w.row_stride();
  const int64_t pf = prefetch_ahead(rb, R);
  const uint8_t* row[R];
  for (int r = 0; r < R; ++r) row[r] = w.codes + (n + r) * rb;
  const __m512i dual = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m512 tot[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) tot[r][t] = _mm512_setzero_ps();
  for (int64_t k = 0; k < w.K; k += 64) {
    const int64_t b = k / 32;
    __m512i u[R];
    __m512 sw[R];
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(row[r] + k + pf), HINAMOE_QPF_HINT);
      if ((b & 15) == 0) prefetch_scales<SDT>(w, n + r + HINAMOE_QPF_TILES * R, b);
      u[r] = _mm512_loadu_si512(row[r] + k);
      sw[r] = _mm512_permutexvar_ps(dual, _mm512_zextps128_ps512(scales2<SDT>(w, n + r, b)));
    }
    for (int t = 0; t < T; ++t) {
      const __m512i xv = _mm512_loadu_si512(x.q + t * x.ld + k);
      const __m128 two = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(x.scale + t * x.scale_stride() + b)));
      const __m512 sx = _mm512_permutexvar_ps(dual, _mm512_zextps128_ps512(two));
      const __m512i b0 = _mm512_loadu_si512(bias + t * ldb + k / 4);
      for (int r = 0; r < R; ++r) {
        const __m512i acc = _mm512_dpbusd_epi32(b0, u[r], xv);
        tot[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(sw[r], sx), tot[r][t]);
      }
    }
  }
  float sum[R * T];
  lane_sums<R, T>(tot, sum);
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) Y[t * ldy + r] = sum[r * T + t];
}

template <int BITS, int R, int T, DType SDT>
void rows_i8(const QWeight& w, int64_t r0, int64_t r1, const QTokens& x, const int32_t* bias, int64_t ldb, float* y,
             int64_t ldy) {
  auto micro = [&](auto rr, int64_t n) {
    constexpr int RR = decltype(rr)::value;
    if constexpr (BITS == 4) micro_i8_q32<RR, T, SDT>(w, n, x, bias, ldb, y + (n - r0), ldy);
    else micro_i8_d32<RR, T, SDT>(w, n, x, bias, ldb, y + (n - r0), ldy);
  };
  int64_t n = r0;
  for (; n + R <= r1; n += R) micro(std::integral_constant<int, R>(), n);
  for (; n < r1; ++n) micro(std::integral_constant<int, 1>(), n);
}

// The zero point's start values of the int8 dots: per token, for each
// 64-byte group of its codes, -zp * (the sum of the codes each int32 lane
// of the group meets), zp = 8 (4-bit: the even and the odd group of a
// Quad32 or Pair32 unit share lanes) or 128 (8-bit). 4-bit: 16 lanes per
// 128 elements (8 for the last 64), 8-bit: 16 per 64; ldb = K / 8 or K / 4.
template <int BITS>
HINAMOE_AVX512_VNNI_FN void token_bias(const QTokens& x, int64_t M, int64_t K, int32_t* bias, int64_t ldb) {
  const __m512i zp = _mm512_set1_epi8(char(BITS == 4 ? 8 : 128));
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* q = x.q + m * x.ld;
    int32_t* out = bias + m * ldb;
    int64_t k = 0;
    if constexpr (BITS == 4) {
      for (; k + 128 <= K; k += 128) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), zp, _mm512_loadu_si512(q + k)),
                                              zp, _mm512_loadu_si512(q + k + 64));
        _mm512_storeu_si512(out + k / 8, _mm512_sub_epi32(_mm512_setzero_si512(), s));
      }
      if (k < K) {
        const __m256i z = _mm512_castsi512_si256(zp);
        const __m256i s = _mm256_dpbusd_epi32(
            _mm256_dpbusd_epi32(_mm256_setzero_si256(), z, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k))), z,
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + k + 32)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k / 8), _mm256_sub_epi32(_mm256_setzero_si256(), s));
      }
    } else {
      for (; k < K; k += 64) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), zp, _mm512_loadu_si512(q + k));
        _mm512_storeu_si512(out + k / 4, _mm512_sub_epi32(_mm512_setzero_si512(), s));
      }
    }
  }
}

template <int BITS, DType SDT>
void qgemm_i8_t(const QWeight& w, int64_t n0, int64_t n1, const QTokens& X, int64_t M, float* Y, int64_t ldy) {
  const int64_t ldb = BITS == 4 ? w.K / 8 : w.K / 4;
  AlignedVector<int32_t> bias(size_t(M * ldb));
  token_bias<BITS>(X, M, w.K, bias.data(), ldb);
  for (int64_t r0 = n0; r0 < n1; r0 += kRowBlock) {
    const int64_t r1 = std::min(n1, r0 + kRowBlock);
    for (int64_t m = 0; m < M; m += 4) {
      QTokens x = X;
      x.q += m * X.ld;
      x.scale += m * X.scale_stride();
      x.sum += m * X.scale_stride();
      const int32_t* b = bias.data() + m * ldb;
      float* y = Y + m * ldy + (r0 - n0);
      switch (std::min<int64_t>(4, M - m)) {
        case 1: rows_i8<BITS, HINAMOE_QZ_I8_R1, 1, SDT>(w, r0, r1, x, b, ldb, y, ldy); break;
        case 2: rows_i8<BITS, 4, 2, SDT>(w, r0, r1, x, b, ldb, y, ldy); break;
        case 3: rows_i8<BITS, 4, 3, SDT>(w, r0, r1, x, b, ldb, y, ldy); break;
        default: rows_i8<BITS, 3, 4, SDT>(w, r0, r1, x, b, ldb, y, ldy); break;
      }
    }
  }
}

}  // namespace

void i8_tiles(const QWeight& w, int64_t n0, int64_t n1, const QTokens& X, int64_t M, float* Y, int64_t ldy) {
  with_weight_kind(w, [&](auto bits, auto sdt, auto) {
    qgemm_i8_t<decltype(bits)::value, decltype(sdt)::value>(w, n0, n1, X, M, Y, ldy);
  });
}

}  // namespace qz
}  // namespace hinamoe
