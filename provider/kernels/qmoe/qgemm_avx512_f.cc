// The avx512 tier's float-token kernels for a few tokens per call (1-11):
// codes decoded in registers from the packed rows where they lie, R rows
// against a tile of up to 8 tokens, sums across lanes at the end.
//   4-bit: 16 bytes of codes zero-extended to 16 int32 by one load; vpermps
//     looks each nibble up in a 16-entry table of the row's dequantised
//     values (q - zp) * s for the block: the low nibbles as they are
//     (vpermps reads only an index's low 4 bits), the high ones after one
//     shift. 32 weights cost four instructions and no int-to-float
//     conversion. Tokens in EvenOdd32 order.
//   8-bit: 16 codes -> 16 int32 -> float -> weights by one FMA
//     (q * s - zp * s), shared by the tokens.
#include "qgemm_avx512.h"

#include <vector>

#include "../aligned_buffer.h"

namespace hinamoe {
namespace qz {
namespace {

// Y[t*ldy + r] (+)= the float path's R x T tile, its A accumulator sets added.
template <int A, int R, int T>
HINAMOE_AVX512_INLINE void store_tile(__m512 (&tot)[A][R][T], float* Y, int64_t ldy, bool acc) {
  if constexpr (A == 2)
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) tot[0][r][t] = _mm512_add_ps(tot[0][r][t], tot[1][r][t]);
  float sum[R * T];
  lane_sums<R, T>(tot[0], sum);
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) Y[t * ldy + r] = (acc ? Y[t * ldy + r] : 0.0f) + sum[r * T + t];
}

// Rows [n, n+R) x tokens [0, T) of 4-bit codes; X in EvenOdd32 order. Each
// (row, block) gets its table of 16 dequantised values; each 32 codes are one
// zero-extending load, a shift and two vpermps, shared by the T tokens. With
// few tokens the even and odd halves accumulate apart, so the FMA chains
// outnumber the FMA latency.
template <int R, int T, DType SDT, bool ZP, bool B32>
HINAMOE_AVX512_FN void micro_f4(const QWeight& w, int64_t n, int64_t ka, int64_t kz, const float* X, int64_t ldx, float* Y,
                   int64_t ldy, bool acc) {
  constexpr int A = T <= 2 ? 2 : 1;
  const int64_t rb = w.row_stride();
  const int64_t pf = prefetch_ahead(rb, R);
  const uint8_t* row[R];
  for (int r = 0; r < R; ++r) row[r] = w.codes + (n + r) * rb;
  __m512 tot[A][R][T];
  for (int a = 0; a < A; ++a)
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) tot[a][r][t] = _mm512_setzero_ps();
  // The 16 codes, less the zero point 8 when there are no zero points.
  const __m512 codes = ZP ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                          : _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  const int64_t b0 = B32 ? ka / 32 : ka / w.block, b1 = B32 ? kz / 32 : (kz - 1) / w.block + 1;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t k0 = B32 ? b * 32 : std::max(ka, b * w.block), k1 = B32 ? k0 + 32 : std::min(kz, w.block_end(b));
    __m512 tbl[R];
    for (int r = 0; r < R; ++r) {
      if ((b & 15) == 0) prefetch_scales<SDT>(w, n + r + HINAMOE_QPF_TILES * R, b);
      const __m512 s = _mm512_set1_ps(scale_at<SDT>(w, n + r, b));
      // (q - zp) * s, rounded once (without zero points: (q - 8) exact, times s).
      if constexpr (ZP) tbl[r] = _mm512_mul_ps(_mm512_sub_ps(codes, _mm512_set1_ps(float(w.zero_point(n + r, b)))), s);
      else tbl[r] = _mm512_mul_ps(codes, s);
    }
    for (int64_t k = k0; k < k1; k += 32) {
      const uint64_t kb = uint64_t(k) >> 1;
      if ((kb & 63) == 0)
        for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(row[r] + kb + pf), HINAMOE_QPF_HINT);
      for (int r = 0; r < R; ++r) {
        const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row[r] + kb)));
        const __m512 we = _mm512_permutexvar_ps(d, tbl[r]);
        const __m512 wo = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), tbl[r]);
        for (int t = 0; t < T; ++t) {
          const float* x = X + t * ldx + k;
          tot[0][r][t] = _mm512_fmadd_ps(we, _mm512_loadu_ps(x), tot[0][r][t]);
          tot[A - 1][r][t] = _mm512_fmadd_ps(wo, _mm512_loadu_ps(x + 16), tot[A - 1][r][t]);
        }
      }
    }
  }
  store_tile<A, R, T>(tot, Y, ldy, acc);
}

// The same for 8-bit codes in k order: 16 codes -> float -> q * s - zp * s.
template <int R, int T, DType SDT, bool ZP, bool B32>
HINAMOE_AVX512_FN void micro_f8(const QWeight& w, int64_t n, int64_t ka, int64_t kz, const float* X, int64_t ldx, float* Y,
                   int64_t ldy, bool acc) {
  constexpr int A = T <= 2 ? 2 : 1;
  const int64_t rb = w.row_stride();
  const int64_t pf = prefetch_ahead(rb, R);
  const uint8_t* row[R];
  for (int r = 0; r < R; ++r) row[r] = w.codes + (n + r) * rb;
  __m512 tot[A][R][T];
  for (int a = 0; a < A; ++a)
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) tot[a][r][t] = _mm512_setzero_ps();
  const int64_t b0 = B32 ? ka / 32 : ka / w.block, b1 = B32 ? kz / 32 : (kz - 1) / w.block + 1;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t k0 = B32 ? b * 32 : std::max(ka, b * w.block), k1 = B32 ? k0 + 32 : std::min(kz, w.block_end(b));
    __m512 sv[R], zv[R];
    for (int r = 0; r < R; ++r) {
      if ((b & 15) == 0) prefetch_scales<SDT>(w, n + r + HINAMOE_QPF_TILES * R, b);
      const float s = scale_at<SDT>(w, n + r, b);
      sv[r] = _mm512_set1_ps(s);
      zv[r] = _mm512_set1_ps(-float(zero_at<8, ZP>(w, n + r, b)) * s);
    }
    for (int64_t k = k0; k < k1; k += 32) {
      if ((k & 63) == 0)
        for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(row[r] + k + pf), HINAMOE_QPF_HINT);
      for (int r = 0; r < R; ++r)
        for (int h = 0; h < 2; ++h) {
          const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row[r] + k + 16 * h));
          const __m512 wf = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(c)), sv[r], zv[r]);
          const int a = h % A;
          for (int t = 0; t < T; ++t)
            tot[a][r][t] = _mm512_fmadd_ps(wf, _mm512_loadu_ps(X + t * ldx + k + 16 * h), tot[a][r][t]);
        }
    }
  }
  store_tile<A, R, T>(tot, Y, ldy, acc);
}

// 1 token, 4-bit blocks of 32 without zero points: the codes less 8 come
// from a fixed table and each block's dot is scaled once (an FMA by the
// broadcast scale), so no table per (row, block) is built: one core
// streamed 25.5 against 21.5 GB/s (Zen 5, C++ bench; at 2 threads both sit
// at the read bandwidth).
template <int R, DType SDT>
HINAMOE_AVX512_FN void micro_f4_t1(const QWeight& w, int64_t n, int64_t ka, int64_t kz, const float* X, float* Y, bool acc) {
  const int64_t rb = w.row_stride();
  const int64_t pf = prefetch_ahead(rb, R);
  const uint8_t* row[R];
  const void* srow[R];
  for (int r = 0; r < R; ++r) {
    row[r] = w.codes + (n + r) * rb;
    srow[r] = scale_ptr(w, n + r, 0, SDT == DType::F32 ? 4 : 2);
  }
  const __m512 tbl = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  __m512 tot[1][R][1];
  for (int r = 0; r < R; ++r) tot[0][r][0] = _mm512_setzero_ps();
  for (int64_t k = ka; k < kz; k += 32) {
    const int64_t b = k >> 5, kb = k >> 1;
    if ((kb & 63) == 0)
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(row[r] + kb + pf), HINAMOE_QPF_HINT);
    if ((b & 15) == 0)
      for (int r = 0; r < R; ++r) prefetch_scales<SDT>(w, n + r + HINAMOE_QPF_TILES * R, b);
    const __m512 x0 = _mm512_loadu_ps(X + k), x1 = _mm512_loadu_ps(X + k + 16);
    for (int r = 0; r < R; ++r) {
      const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row[r] + kb)));
      const __m512 p = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), tbl), x1,
                                       _mm512_mul_ps(_mm512_permutexvar_ps(d, tbl), x0));
      tot[0][r][0] = _mm512_fmadd_ps(p, _mm512_set1_ps(row_scale<SDT>(srow[r], b)), tot[0][r][0]);
    }
  }
  store_tile<1, R, 1>(tot, Y, 1, acc);
}

// Rows [r0, r1) x T tokens over columns [ka, kz) (multiples of 32); acc: add to y.
template <int BITS, int R, int T, DType SDT, bool ZP>
void rows_f(const QWeight& w, int64_t r0, int64_t r1, int64_t ka, int64_t kz, const float* x, int64_t ldx, float* y,
            int64_t ldy, bool acc) {
  const bool b32 = w.block == 32;
  auto micro = [&](auto rr, int64_t n) {
    constexpr int RR = decltype(rr)::value;
    float* yn = y + (n - r0);
    if constexpr (BITS == 4) {
      if (T == 1 && !ZP && b32) micro_f4_t1<RR, SDT>(w, n, ka, kz, x, yn, acc);
      else if (b32) micro_f4<RR, T, SDT, ZP, true>(w, n, ka, kz, x, ldx, yn, ldy, acc);
      else micro_f4<RR, T, SDT, ZP, false>(w, n, ka, kz, x, ldx, yn, ldy, acc);
    } else {
      if (b32) micro_f8<RR, T, SDT, ZP, true>(w, n, ka, kz, x, ldx, yn, ldy, acc);
      else micro_f8<RR, T, SDT, ZP, false>(w, n, ka, kz, x, ldx, yn, ldy, acc);
    }
  };
  int64_t n = r0;
  for (; n + R <= r1; n += R) micro(std::integral_constant<int, R>(), n);
  for (; n < r1; ++n) micro(std::integral_constant<int, 1>(), n);
}

// Row blocks (kRowBlock), in each every token tile (of 8, else up to 4).
// Where a tile's token rows pass 2 x kSliceBytes, K is cut into slices of
// kSliceBytes of tokens per tile, so each tile's slice stays in L1 while the
// row block's codes (also in L1) meet every tile: otherwise every R rows
// would stream the tile's whole rows from L2 again (8 tokens of 2048 floats
// are 64 KiB; in-cache A/B on Zen 5: X in L1 ~1.5x the FMA rate of X in L2).
constexpr int64_t kSliceBytes = 16 * 1024;
#ifndef HINAMOE_QZ_R1
// Rows per 1-token micro-kernel (an A/B knob: 2, 6 and 12 rows against 4 on
// Zen 5, DRAM-streaming C++ bench: no consistent gain; 12 lost 10-30%).
#define HINAMOE_QZ_R1 4
#endif

template <int BITS, DType SDT, bool ZP>
void qgemm_f_t(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
               int64_t ldy) {
  const int64_t tmax = M >= 8 ? 8 : std::min<int64_t>(4, M);
  const int64_t slice = tmax * w.K * 4 <= 2 * kSliceBytes ? w.K : std::max<int64_t>(32, kSliceBytes / (4 * tmax) / 32 * 32);
  for (int64_t r0 = n0; r0 < n1; r0 += kRowBlock) {
    const int64_t r1 = std::min(n1, r0 + kRowBlock);
    for (int64_t ka = 0; ka < w.K; ka += slice) {
      const int64_t kz = std::min(w.K, ka + slice);
      for (int64_t m = 0; m < M;) {
        const float* x = X + m * ldx;
        float* y = Y + m * ldy + (r0 - n0);
        const int64_t T = M - m >= 8 ? 8 : std::min<int64_t>(4, M - m);
        const bool acc = ka > 0;
        switch (T) {
          case 1: rows_f<BITS, HINAMOE_QZ_R1, 1, SDT, ZP>(w, r0, r1, ka, kz, x, ldx, y, ldy, acc); break;
          case 2: rows_f<BITS, 4, 2, SDT, ZP>(w, r0, r1, ka, kz, x, ldx, y, ldy, acc); break;
          case 3: rows_f<BITS, 4, 3, SDT, ZP>(w, r0, r1, ka, kz, x, ldx, y, ldy, acc); break;
          case 4: rows_f<BITS, 3, 4, SDT, ZP>(w, r0, r1, ka, kz, x, ldx, y, ldy, acc); break;
          default: rows_f<BITS, 2, 8, SDT, ZP>(w, r0, r1, ka, kz, x, ldx, y, ldy, acc); break;
        }
        m += T;
      }
    }
  }
}

}  // namespace

void f_tiles(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
             int64_t ldy) {
  with_weight_kind(w, [&](auto bits, auto sdt, auto zp) {
    qgemm_f_t<decltype(bits)::value, decltype(sdt)::value, decltype(zp)::value>(w, n0, n1, X, ldx, M, Y, ldy);
  });
}

}  // namespace qz
}  // namespace hinamoe
