// Shared by the avx512 tier's quantised kernels (qgemm_avx512*.cc): the
// entry points of the four kernel families, which qgemm_avx512.cc chooses
// between, and the helpers more than one of them uses.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../isa_target.h"
#include "../vec_avx512.h"
#include "qgemm_avx2_common.h"
#include "../tuning.h"
#include "qmoe_ffn.h"

namespace hinamoe {
namespace qz {

using namespace qavx2;

// From this many tokens on, both paths run transposed.
constexpr int64_t kTTTokens = tuning::kTransposedMinTokensAvx512;

// Float tokens, fewer than kTTTokens: tiles of up to 8 tokens against R rows
// (qgemm_avx512_f.cc). X in the order f_order gives (EvenOdd32 for 4-bit).
void f_tiles(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
             int64_t ldy);
// Float tokens, any count (kTTTokens and more pay off): transposed once per
// call, weights dequantised per chunk (qgemm_avx512_f_transposed.cc).
void f_transposed(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
                  int64_t ldy);
// int8 tokens on AVX512-VNNI, blocks of 32 without zero points, fewer than
// kTTTokens (qgemm_avx512_i8.cc).
void i8_tiles(const QWeight& w, int64_t n0, int64_t n1, const QTokens& X, int64_t M, float* Y, int64_t ldy);
// The same, transposed tokens (qgemm_avx512_i8_transposed.cc).
void i8_transposed(const QWeight& w, int64_t n0, int64_t n1, const QTokens& X, int64_t M, float* Y, int64_t ldy);

// ------------------------------------------------ scales and lane sums

HINAMOE_AVX512_INLINE const void* scale_ptr(const QWeight& w, int64_t n, int64_t b, int esize) {
  return static_cast<const char*>(w.scales) + (n * w.scale_stride() + b) * esize;
}

// The scale of row n, block b, as a float; srow = the row's scales.
template <DType SDT>
HINAMOE_AVX512_INLINE float row_scale(const void* srow, int64_t b) {
  if constexpr (SDT == DType::F32) return static_cast<const float*>(srow)[b];
  else if constexpr (SDT == DType::F16) return _cvtsh_ss(static_cast<const uint16_t*>(srow)[b]);
  else return bf16_to_f32(static_cast<const uint16_t*>(srow)[b]);
}

// 4 / 2 consecutive block scales of row n from block b, as floats.
template <DType SDT>
HINAMOE_AVX512_INLINE __m128 scales4(const QWeight& w, int64_t n, int64_t b) {
  if constexpr (SDT == DType::F32) return _mm_loadu_ps(static_cast<const float*>(scale_ptr(w, n, b, 4)));
  const __m128i h = _mm_loadl_epi64(static_cast<const __m128i*>(scale_ptr(w, n, b, 2)));
  if constexpr (SDT == DType::F16) return _mm_cvtph_ps(h);
  return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16));
}

template <DType SDT>
HINAMOE_AVX512_INLINE __m128 scales2(const QWeight& w, int64_t n, int64_t b) {
  if constexpr (SDT == DType::F32)
    return _mm_castpd_ps(_mm_load_sd(static_cast<const double*>(scale_ptr(w, n, b, 4))));
  int32_t two;
  __builtin_memcpy(&two, scale_ptr(w, n, b, 2), 4);
  const __m128i h = _mm_cvtsi32_si128(two);
  if constexpr (SDT == DType::F16) return _mm_cvtph_ps(h);
  return _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16));
}

// out[r*T + t] = the sum of the lanes of v[r][t], 16 sums per transposing
// tree (vec_avx512.h) instead of one reduction each.
template <int R, int T>
HINAMOE_AVX512_INLINE void lane_sums(const __m512 (&v)[R][T], float* out) {
  constexpr int N = R * T;
  const __m512* flat = &v[0][0];
  alignas(64) float buf[(N + 15) / 16 * 16];
  if constexpr (N <= 16) {
    _mm512_store_ps(buf, avx512::hsum_lanes<N>(flat));
  } else {
    static_assert(N <= 32, "at most two trees");
    _mm512_store_ps(buf, avx512::hsum_lanes<16>(flat));
    _mm512_store_ps(buf + 16, avx512::hsum_lanes<(N > 16 ? N - 16 : 1)>(flat + 16));
  }
  for (int i = 0; i < N; ++i) out[i] = buf[i];
}

// ------------------------------------------------ transposed-token helpers

// In-register transpose of a 16 x 16 float matrix (r[i] = row i).
HINAMOE_AVX512_INLINE void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  // u[4i + c], lane L = column 4L + c of rows 4i..4i+3
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xEE);
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  // a 4 x 4 transpose of 128-bit lanes among r[c], r[4+c], r[8+c], r[12+c]
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44);       // A0 A1 B0 B1
    t[4 + c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);   // A2 A3 B2 B3
    t[8 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
    t[12 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88);
    r[4 + c] = _mm512_shuffle_f32x4(t[c], t[8 + c], 0xDD);
    r[8 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0xDD);
  }
}

// Before row n + r's chunk at kc is unpacked (chunks of `chunk` columns): its
// codes two chunks ahead (the next block's rows, R further, near the row's
// end) into L1 (this path, from 12 tokens, was tuned with T0; the 1-2 token
// kernels' HINAMOE_QPF_HINT was not measured here), their scales as
// prefetch_scales puts them. One chunk ahead, the unpacking loads still
// stalled on misses (in-process A/B on Zen 5, 16 tokens: 8.0 against 9.2
// ms; three or four ahead: no further gain).
template <int BITS, DType SDT>
HINAMOE_AVX512_INLINE void prefetch_chunk_ahead(const QWeight& w, int64_t n, int r, int R, int64_t kc, int64_t chunk) {
  const int64_t kn = kc + 2 * chunk;
  const bool same = kn < w.K;
  const int64_t rn = same ? n + r : n + R + r, kr = same ? kn : kn - w.K;
  const uint8_t* next = w.codes + rn * w.row_stride() + kr * BITS / 8;
  for (int64_t o = 0; o < chunk * BITS / 8; o += 64) _mm_prefetch(reinterpret_cast<const char*>(next + o), _MM_HINT_T0);
  prefetch_scales<SDT>(w, rn, kr / w.block);
}

// Y[t * ldy + r] = C[(r V + t / 16) 16 + t % 16] for t < M: the R x V token
// vectors of a row block, transposed back into token rows.
template <int R, int V>
HINAMOE_AVX512_INLINE void store_transposed(const float* C, int64_t M, float* Y, int64_t ldy) {
  for (int64_t t = 0; t < M; ++t) {
    const float* c = C + (t >> 4) * 16 + (t & 15);
    for (int r = 0; r < R; ++r) Y[t * ldy + r] = c[r * V * 16];
  }
}

// rows(RR, n) over [n0, n1): blocks of R rows, then of R / 3, then single rows.
template <int R, class Rows>
inline void row_blocks(int64_t n0, int64_t n1, Rows&& rows) {
  int64_t n = n0;
  for (; n + R <= n1; n += R) rows(std::integral_constant<int, R>(), n);
  for (; n + R / 3 <= n1; n += R / 3) rows(std::integral_constant<int, R / 3>(), n);
  for (; n < n1; ++n) rows(std::integral_constant<int, 1>(), n);
}


}  // namespace qz
}  // namespace hinamoe
