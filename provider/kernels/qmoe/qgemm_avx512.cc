// The avx512 tier's quantised kernels on zmm registers, codes decoded in
// registers from the packed rows where they lie (as the avx2 kernels):
//   float path, 4-bit: 16 bytes of codes zero-extended to 16 int32 by one
//     load; vpermps looks each nibble up in a 16-entry table of the row's
//     dequantised values (q - zp) * s for the block: the low nibbles as they
//     are (vpermps reads only an index's low 4 bits), the high ones after one
//     shift. 32 weights cost four instructions and no int-to-float
//     conversion. Tokens in EvenOdd32 order.
//   float path, 8-bit: 16 codes -> 16 int32 -> float -> weights by one FMA
//     (q * s - zp * s), shared by the tokens.
//   int8 tokens (accuracy_level 4) on AVX512-VNNI vpdpbusd, blocks of 32
//     without zero points: 4-bit four blocks per 64-byte load (Quad32, a
//     block per 128-bit lane), 8-bit two (a block per 256-bit half).
//   From 12 tokens per expert on, both paths transpose the tokens once per
//     call and broadcast each dequantised weight (each 4 codes) against 16
//     tokens at a time (the "many tokens" sections below).
// Weights these do not cover (groups that do not divide the blocks, the int8
// path with zero points or other block sizes, CPUs without AVX512-VNNI) run
// on the avx2 tier's kernels; the order functions below say which order each
// case reads, so the driver gathers the tokens to match.
//
// GCC 12 warns about the self-initialised _mm512_undefined_*() inside some
// AVX-512 intrinsics once inlined (a false positive in the header; see
// gemm_rows_avx512.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <vector>

#include "../aligned_buffer.h"
#include "../avx512_hsum.h"
#include "../isa_target.h"
#include "qgemm_avx2_common.h"
#include "qmoe_ffn.h"

namespace hinamoe {
namespace {

using namespace qavx2;

// Chosen once: the check builds strings, and the kernels ask per work item.
const QuantKernels& fallback() {
  static const QuantKernels& k = avx_vnni_unavailable_reason().empty() ? quant_avx2_vnni() : quant_avx2();
  return k;
}

bool has_vnni() {
  static const bool v = avx512_vnni_unavailable_reason().empty();
  return v;
}

// The zmm float kernels take blocks (K when row-wise) and K in whole groups of 32.
bool zmm_float(int64_t block, int64_t K) { return K % 32 == 0 && block % 32 == 0; }

// The zmm int8-token kernels: blocks of 32 without zero points, K a multiple of 64.
bool zmm_i8(int64_t block, int64_t K, bool zero_points) {
  return has_vnni() && !zero_points && block == 32 && K % 64 == 0;
}

TokenOrder avx512_f_order(int bits, int64_t block, int64_t K, bool zero_points) {
  if (!zmm_float(block, K)) return fallback().f_order(bits, block, K, zero_points);
  return bits == 4 ? TokenOrder::EvenOdd32 : TokenOrder::KOrder;
}

TokenOrder avx512_i8_order(int bits, int64_t block, int64_t K, bool zero_points) {
  if (!zmm_i8(block, K, zero_points)) return fallback().i8_order(bits, block, K, zero_points);
  return bits == 4 ? TokenOrder::Quad32 : TokenOrder::KOrder;
}

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
// tree (avx512_hsum.h) instead of one reduction each.
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

// ---------------------------------------------------------------- float path

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
#ifndef HINAMOE_QZ_I8_R1
// Rows per 1-token int8-token micro-kernel: 6 shares each token load and
// scale permute over more rows than 4 (docs/kernels.md, Zen 4).
#define HINAMOE_QZ_I8_R1 6
#endif
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

// ------------------------------------------ float path, many tokens
// From kTTTokens tokens on, FMAs bound the float path, and the tiles above
// spend issue slots on horizontal sums, a table per (row, block) per tile and
// a token load per FMA (in-cache: ~40% of the FMA peak at 16 tokens). Here
// each call transposes its tokens once ([K][16 V]: V vectors of 16 tokens),
// and per row block dequantises R rows x kTTChunk columns into an L1 buffer,
// in the tokens' order; every weight is then broadcast against 16 tokens at
// a time into R x V accumulators: no sums across lanes, one token load per
// vector and column. The outputs are transposed back when they are stored.
#ifndef HINAMOE_QTT_MIN
#define HINAMOE_QTT_MIN 12
#endif
constexpr int64_t kTTTokens = HINAMOE_QTT_MIN;  // against the tiles above (Zen 5): 0.8x at 8 tokens, 1.1x at 12
#ifndef HINAMOE_QTT_CHUNK
#define HINAMOE_QTT_CHUNK 256
#endif
constexpr int64_t kTTChunk = HINAMOE_QTT_CHUNK;  // columns per dequantised block

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

// XT[k * 16V + t] = X[t * ldx + k] for t < M (M <= 16 V), 0 for t >= M; K % 16 == 0.
template <int V>
HINAMOE_AVX512_FN void transpose_tokens(const float* X, int64_t ldx, int64_t M, int64_t K, float* XT) {
  for (int v = 0; v < V; ++v)
    for (int64_t k = 0; k < K; k += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t t = 16 * v + i;
        r[i] = t < M ? _mm512_loadu_ps(X + t * ldx + k) : _mm512_setzero_ps();
      }
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_store_ps(XT + (k + i) * 16 * V + 16 * v, r[i]);
    }
}

// 32 weights of row from element k on, dequantised by tbl / (sv, zv), stored in
// the tokens' order (EvenOdd32 for 4-bit, k order for 8-bit).
template <int BITS>
HINAMOE_AVX512_INLINE void dequant32(const uint8_t* row, int64_t k, __m512 tbl, __m512 sv, __m512 zv, float* out) {
  if constexpr (BITS == 4) {
    const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2)));
    _mm512_store_ps(out, _mm512_permutexvar_ps(d, tbl));
    _mm512_store_ps(out + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), tbl));
  } else {
    for (int h = 0; h < 2; ++h) {
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k + 16 * h));
      _mm512_store_ps(out + 16 * h, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(c)), sv, zv));
    }
  }
}

// Block b's factors: 4-bit, the table (q - zp) * s of the 16 codes; 8-bit, s and -zp * s.
template <int BITS, DType SDT, bool ZP>
HINAMOE_AVX512_INLINE void dequant_factors(const QWeight& w, const void* srow, int64_t n, int64_t b, __m512 codes, __m512& tbl,
                               __m512& sv, __m512& zv) {
  const float s = row_scale<SDT>(srow, b);
  sv = _mm512_set1_ps(s);
  if constexpr (BITS == 4) {
    if constexpr (ZP) tbl = _mm512_mul_ps(_mm512_sub_ps(codes, _mm512_set1_ps(float(w.zero_point(n, b)))), sv);
    else tbl = _mm512_mul_ps(codes, sv);
  } else {
    zv = _mm512_set1_ps(-float(zero_at<8, ZP>(w, n, b)) * s);
  }
}

// Row n's columns [k0, k1) (multiples of 32) dequantised into out[0, k1 - k0).
// 4-bit: a table of (q - zp) * s per block; 8-bit: q * s - zp * s.
template <int BITS, DType SDT, bool ZP, bool B32>
HINAMOE_AVX512_INLINE void dequant_row(const QWeight& w, int64_t n, int64_t k0, int64_t k1, float* out) {
  const uint8_t* row = w.codes + n * w.row_stride();
  const void* srow = scale_ptr(w, n, 0, SDT == DType::F32 ? 4 : 2);
  const __m512 codes = ZP ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                          : _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  __m512 tbl = codes, sv = codes, zv = codes;
  if constexpr (B32) {
    for (int64_t k = k0; k < k1; k += 32) {
      dequant_factors<BITS, SDT, ZP>(w, srow, n, k >> 5, codes, tbl, sv, zv);
      dequant32<BITS>(row, k, tbl, sv, zv, out + (k - k0));
    }
  } else {
    for (int64_t b = k0 / w.block; b * w.block < k1; ++b) {
      dequant_factors<BITS, SDT, ZP>(w, srow, n, b, codes, tbl, sv, zv);
      const int64_t kz = std::min(k1, w.block_end(b));
      for (int64_t k = std::max(k0, b * w.block); k < kz; k += 32) dequant32<BITS>(row, k, tbl, sv, zv, out + (k - k0));
    }
  }
}

// acc[r][v] += sum over j < J of Wd[r * kTTChunk + j] * XT[j * 16V + 16v ..]
// (acc kept in C between chunks: [R][V] vectors).
template <int R, int V>
HINAMOE_AVX512_FN void tt_chunk(const float* Wd, const float* XT, int64_t J, float* C, bool first) {
  __m512 acc[R][V];  // unrolled, so the accumulators stay in registers
#pragma GCC unroll 24
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = first ? _mm512_setzero_ps() : _mm512_load_ps(C + (r * V + v) * 16);
  for (int64_t j = 0; j < J; ++j) {
    __m512 x[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) x[v] = _mm512_load_ps(XT + j * 16 * V + 16 * v);
#pragma GCC unroll 24
    for (int r = 0; r < R; ++r) {
      const __m512 wb = _mm512_set1_ps(Wd[r * kTTChunk + j]);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(wb, x[v], acc[r][v]);
    }
  }
#pragma GCC unroll 24
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm512_store_ps(C + (r * V + v) * 16, acc[r][v]);
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

// Rows [n, n + R) against the M (<= 16 V) tokens of XT: Y[t * ldy + r] for t < M.
template <int BITS, DType SDT, bool ZP, bool B32, int R, int V>
HINAMOE_AVX512_FN void tt_rows(const QWeight& w, int64_t n, const float* XT, int64_t M, float* Y, int64_t ldy, float* Wd,
                   float* C) {
  for (int64_t kc = 0; kc < w.K; kc += kTTChunk) {
    const int64_t kz = std::min(w.K, kc + kTTChunk);
    for (int r = 0; r < R; ++r) {
      prefetch_chunk_ahead<BITS, SDT>(w, n, r, R, kc, kTTChunk);
      dequant_row<BITS, SDT, ZP, B32>(w, n + r, kc, kz, Wd + r * kTTChunk);
    }
    tt_chunk<R, V>(Wd, XT + kc * 16 * V, kz - kc, C, kc == 0);
  }
  store_transposed<R, V>(C, M, Y, ldy);
}

template <int BITS, DType SDT, bool ZP, int V>
void tt_range(const QWeight& w, int64_t n0, int64_t n1, const float* XT, int64_t M, float* Y, int64_t ldy,
              float* Wd, float* C) {
  constexpr int R = V == 1 ? 24 : 12;  // R x V accumulators (24) + V token vectors + a weight
  auto run = [&](auto b32) {
    row_blocks<R>(n0, n1, [&](auto rr, int64_t n) {
      tt_rows<BITS, SDT, ZP, decltype(b32)::value, decltype(rr)::value, V>(w, n, XT, M, Y + (n - n0), ldy, Wd, C);
    });
  };
  if (w.block == 32) run(std::true_type());
  else run(std::false_type());
}

template <int BITS, DType SDT, bool ZP>
void qgemm_f_tt(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
                int64_t ldy) {
  // Per thread, reused across calls (at most K x 32 tokens + 24 x 1 KiB).
  thread_local AlignedVector<float> xt, wd(size_t(24 * kTTChunk)), c(size_t(24 * 16));
  for (int64_t g = 0; g < M; g += 32) {
    const int64_t Mg = std::min<int64_t>(32, M - g);
    const int V = Mg > 16 ? 2 : 1;
    if (xt.size() < size_t(w.K * 16 * V)) xt.resize(size_t(w.K * 16 * V));
    if (V == 1) {
      transpose_tokens<1>(X + g * ldx, ldx, Mg, w.K, xt.data());
      tt_range<BITS, SDT, ZP, 1>(w, n0, n1, xt.data(), Mg, Y + g * ldy, ldy, wd.data(), c.data());
    } else {
      transpose_tokens<2>(X + g * ldx, ldx, Mg, w.K, xt.data());
      tt_range<BITS, SDT, ZP, 2>(w, n0, n1, xt.data(), Mg, Y + g * ldy, ldy, wd.data(), c.data());
    }
  }
}

template <int BITS, DType SDT, bool ZP>
void qgemm_f(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
             int64_t ldy) {
  if (M >= kTTTokens) qgemm_f_tt<BITS, SDT, ZP>(w, n0, n1, X, ldx, M, Y, ldy);
  else qgemm_f_t<BITS, SDT, ZP>(w, n0, n1, X, ldx, M, Y, ldy);
}

template <int BITS>
void qgemm_avx512(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
                  int64_t ldy) {
  if (!zmm_float(w.block, w.K)) return fallback().gemm[BITS == 8](w, n0, n1, X, ldx, M, Y, ldy);
  const bool zp = w.zero_points != nullptr;
  switch (w.scale_dtype) {
    case DType::F32:
      return zp ? qgemm_f<BITS, DType::F32, true>(w, n0, n1, X, ldx, M, Y, ldy)
                : qgemm_f<BITS, DType::F32, false>(w, n0, n1, X, ldx, M, Y, ldy);
    case DType::F16:
      return zp ? qgemm_f<BITS, DType::F16, true>(w, n0, n1, X, ldx, M, Y, ldy)
                : qgemm_f<BITS, DType::F16, false>(w, n0, n1, X, ldx, M, Y, ldy);
    default:
      return zp ? qgemm_f<BITS, DType::BF16, true>(w, n0, n1, X, ldx, M, Y, ldy)
                : qgemm_f<BITS, DType::BF16, false>(w, n0, n1, X, ldx, M, Y, ldy);
  }
}

// ------------------------------------------------------------ int8 tokens

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

// ------------------------------------------ int8 tokens, many tokens
// From kTTTokens tokens on, as the float path above: the tokens transposed
// once per call at dword granularity (XT8: per 4 of a token's codes, 16
// tokens; the codes + 128, vpdpbusd's unsigned operand), R rows' codes
// unpacked per chunk into L1 as signed bytes in the tokens' order (4-bit:
// q - 8, the low nibbles of a 128-element group then the high ones, which
// is where Quad32 put the tokens; 8-bit: q - 128), and each 4 codes of a
// row broadcast against 16 tokens per vpdpbusd. Each block's int32 sums
// start at -128 x the block's code sum (the tokens' +128), then one FMA by
// s_w x s_x per block adds them to the float totals.
constexpr int64_t kTTI8Chunk = 512;  // elements per unpacked chunk (a multiple of 128)

// XT8[d * 16V + t] = token t's codes 4d..4d+3 (as stored), each + 128; the
// tokens from M on: 128 (a zero). XS[b * 16V + t] = token t's block-b scale (0 from M on).
template <int V>
HINAMOE_AVX512_FN void i8_tokens_transposed(const QTokens& x, int64_t M, int64_t K, int32_t* XT8, float* XS) {
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  for (int v = 0; v < V; ++v)
    for (int64_t d = 0; d < K / 4; d += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t t = 16 * v + i;
        const __m512i q = t < M ? _mm512_loadu_si512(x.q + t * x.ld + 4 * d) : _mm512_setzero_si512();
        r[i] = _mm512_castsi512_ps(_mm512_xor_si512(q, flip));
      }
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_store_ps(reinterpret_cast<float*>(XT8 + (d + i) * 16 * V + 16 * v), r[i]);
    }
  for (int64_t b = 0; b < K / 32; ++b)
    for (int64_t t = 0; t < 16 * V; ++t) XS[b * 16 * V + t] = t < M ? x.scale[t * x.scale_stride() + b] : 0.0f;
}

// Row codes of elements [k0, k1) (k0 a multiple of 128, k1 - k0 of 64) as
// signed bytes in the tokens' order into out, and each block's sum of them
// into bsum[(k - k0) / 32].
template <int BITS>
HINAMOE_AVX512_INLINE void unpack_row_i8(const uint8_t* row, int64_t k0, int64_t k1, int8_t* out, int32_t* bsum) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
  if constexpr (BITS == 4) {
    const __m512i eight = _mm512_set1_epi8(8);
    for (int64_t k = k0; k < k1; k += 128) {
      const int64_t g = std::min<int64_t>(128, k1 - k);  // a last group of 64: Pair32
      const __mmask64 m = g == 128 ? ~__mmask64(0) : (__mmask64(1) << 32) - 1;
      const __m512i v = _mm512_maskz_loadu_epi8(m, row + k / 2);
      const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      _mm512_mask_storeu_epi8(out + (k - k0), m, _mm512_sub_epi8(lo, eight));
      _mm512_mask_storeu_epi8(out + (k - k0) + g / 2, m, _mm512_sub_epi8(hi, eight));
      // per 64-bit lane the sum of 8 bytes of lo + hi; a block is two lanes
      alignas(64) int64_t q[8];
      _mm512_store_si512(q, _mm512_sad_epu8(_mm512_add_epi8(lo, hi), zero));
      for (int64_t bb = 0; bb < g / 32; ++bb) bsum[(k - k0) / 32 + bb] = int32_t(q[2 * bb] + q[2 * bb + 1]) - 8 * 32;
    }
  } else {
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    for (int64_t k = k0; k < k1; k += 64) {
      const __m512i v = _mm512_loadu_si512(row + k);
      _mm512_storeu_si512(out + (k - k0), _mm512_xor_si512(v, flip));
      alignas(64) int64_t q[8];
      _mm512_store_si512(q, _mm512_sad_epu8(v, zero));
      for (int bb = 0; bb < 2; ++bb) bsum[(k - k0) / 32 + bb] = int32_t(q[4 * bb] + q[4 * bb + 1] + q[4 * bb + 2] + q[4 * bb + 3]) - 128 * 32;
    }
  }
}

// The first dwords of a block's two runs of 4 (chunk-relative), block j of a
// chunk of J elements: 4-bit, in its group's low then high half; 8-bit, k order.
template <int BITS>
HINAMOE_AVX512_INLINE void block_runs(int64_t j, int64_t J, int64_t* a0, int64_t* a1) {
  if constexpr (BITS == 4) {
    const int64_t g0 = j / 4 * 128, half = std::min<int64_t>(128, J - g0) / 8;  // dwords per half group
    *a0 = g0 / 4 + 4 * (j % 4);
    *a1 = *a0 + half;
  } else {
    *a0 = 8 * j;
    *a1 = 8 * j + 4;
  }
}

// C[(r V + v) 16 ..] += rows' x tokens' dots over the chunk's J elements (blocks of 32).
template <int BITS, DType SDT, int R, int V>
HINAMOE_AVX512_VNNI_FN void tt_i8_chunk(const int8_t* Wq, const int32_t* bsum, const void* const* srow, int64_t b0,
                            const int32_t* XT8, const float* XS, int64_t J, float* C, bool first) {
  __m512 tot[R][V];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) tot[r][v] = first ? _mm512_setzero_ps() : _mm512_load_ps(C + (r * V + v) * 16);
  for (int64_t j = 0; j < J / 32; ++j) {
    int64_t a[2];
    block_runs<BITS>(j, J, &a[0], &a[1]);
    __m512i acc[R][V];
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_set1_epi32(-128 * bsum[r * (kTTI8Chunk / 32) + j]);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const int64_t d = a[h] + i;
        __m512i xv[V];
#pragma GCC unroll 2
        for (int v = 0; v < V; ++v) xv[v] = _mm512_load_si512(XT8 + d * 16 * V + 16 * v);
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
          int32_t wq;
          __builtin_memcpy(&wq, Wq + r * kTTI8Chunk + 4 * d, 4);
          const __m512i wb = _mm512_set1_epi32(wq);
#pragma GCC unroll 2
          for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], xv[v], wb);
        }
      }
    __m512 sx[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) sx[v] = _mm512_load_ps(XS + (b0 + j) * 16 * V + 16 * v);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 sw = _mm512_set1_ps(row_scale<SDT>(srow[r], b0 + j));
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v)
        tot[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][v]), _mm512_mul_ps(sx[v], sw), tot[r][v]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm512_store_ps(C + (r * V + v) * 16, tot[r][v]);
}

// Rows [n, n + R) against the M (<= 16 V) transposed tokens: Y[t * ldy + r].
template <int BITS, DType SDT, int R, int V>
HINAMOE_AVX512_VNNI_FN void tt_i8_rows(const QWeight& w, int64_t n, const int32_t* XT8, const float* XS, int64_t M, float* Y,
                           int64_t ldy, int8_t* Wq, int32_t* bsum, float* C) {
  const void* srow[R];
  for (int r = 0; r < R; ++r) srow[r] = scale_ptr(w, n + r, 0, SDT == DType::F32 ? 4 : 2);
  for (int64_t kc = 0; kc < w.K; kc += kTTI8Chunk) {
    const int64_t kz = std::min(w.K, kc + kTTI8Chunk);
    for (int r = 0; r < R; ++r) {
      prefetch_chunk_ahead<BITS, SDT>(w, n, r, R, kc, kTTI8Chunk);
      unpack_row_i8<BITS>(w.codes + (n + r) * w.row_stride(), kc, kz, Wq + r * kTTI8Chunk,
                          bsum + r * (kTTI8Chunk / 32));
    }
    tt_i8_chunk<BITS, SDT, R, V>(Wq, bsum, srow, kc / 32, XT8 + kc / 4 * 16 * V, XS, kz - kc, C, kc == 0);
  }
  store_transposed<R, V>(C, M, Y, ldy);
}

template <int BITS, DType SDT, int V>
void tt_i8_range(const QWeight& w, int64_t n0, int64_t n1, const int32_t* XT8, const float* XS, int64_t M, float* Y,
                 int64_t ldy, int8_t* Wq, int32_t* bsum, float* C) {
  constexpr int R = V == 1 ? 12 : 6;  // R x V int32 sums + as many float totals
  row_blocks<R>(n0, n1, [&](auto rr, int64_t n) {
    tt_i8_rows<BITS, SDT, decltype(rr)::value, V>(w, n, XT8, XS, M, Y + (n - n0), ldy, Wq, bsum, C);
  });
}

template <int BITS, DType SDT>
void qgemm_i8_tt(const QWeight& w, int64_t n0, int64_t n1, const QTokens& X, int64_t M, float* Y, int64_t ldy) {
  // Per thread, reused across calls (at most K/4 x 32 dwords + 12 x 512 bytes).
  thread_local AlignedVector<int32_t> xt8, bsum(size_t(12 * kTTI8Chunk / 32));
  thread_local AlignedVector<float> xs, c(size_t(12 * 16));
  thread_local AlignedVector<int8_t> wq(size_t(12 * kTTI8Chunk));
  for (int64_t g = 0; g < M; g += 32) {
    const int64_t Mg = std::min<int64_t>(32, M - g);
    const int V = Mg > 16 ? 2 : 1;
    if (xt8.size() < size_t(w.K / 4 * 16 * V)) xt8.resize(size_t(w.K / 4 * 16 * V));
    if (xs.size() < size_t(w.K / 32 * 16 * V)) xs.resize(size_t(w.K / 32 * 16 * V));
    QTokens x = X;
    x.q += g * X.ld;
    x.scale += g * X.scale_stride();
    if (V == 1) {
      i8_tokens_transposed<1>(x, Mg, w.K, xt8.data(), xs.data());
      tt_i8_range<BITS, SDT, 1>(w, n0, n1, xt8.data(), xs.data(), Mg, Y + g * ldy, ldy, wq.data(), bsum.data(), c.data());
    } else {
      i8_tokens_transposed<2>(x, Mg, w.K, xt8.data(), xs.data());
      tt_i8_range<BITS, SDT, 2>(w, n0, n1, xt8.data(), xs.data(), Mg, Y + g * ldy, ldy, wq.data(), bsum.data(), c.data());
    }
  }
}

template <int BITS, DType SDT>
void qgemm_i8(const QWeight& w, int64_t n0, int64_t n1, const QTokens& X, int64_t M, float* Y, int64_t ldy) {
  // 6-10 tokens on the transposed path: no gain (4-bit: up to 2x slower)
  if (M >= kTTTokens) qgemm_i8_tt<BITS, SDT>(w, n0, n1, X, M, Y, ldy);
  else qgemm_i8_t<BITS, SDT>(w, n0, n1, X, M, Y, ldy);
}

template <int BITS>
void qgemm_i8_avx512(const QWeight& w, int64_t n0, int64_t n1, const QTokens& X, int64_t M, float* Y,
                     int64_t ldy) {
  // The order check: fc1 and fc3 share tokens gathered for zero points when
  // either has them, so a weight without them may meet the avx2 order.
  if (!zmm_i8(w.block, w.K, w.zero_points != nullptr) || X.order != avx512_i8_order(BITS, w.block, w.K, false))
    return fallback().gemm_i8[BITS == 8](w, n0, n1, X, M, Y, ldy);
  switch (w.scale_dtype) {
    case DType::F32: return qgemm_i8<BITS, DType::F32>(w, n0, n1, X, M, Y, ldy);
    case DType::F16: return qgemm_i8<BITS, DType::F16>(w, n0, n1, X, M, Y, ldy);
    default: return qgemm_i8<BITS, DType::BF16>(w, n0, n1, X, M, Y, ldy);
  }
}

}  // namespace

const QuantKernels& quant_avx512() {
  static const QuantKernels q = [] {
    QuantKernels t;
    t.name = has_vnni() ? "avx512-vnni" : "avx512";
    t.gemm[0] = qgemm_avx512<4>;
    t.gemm[1] = qgemm_avx512<8>;
    t.gemm_i8[0] = qgemm_i8_avx512<4>;
    t.gemm_i8[1] = qgemm_i8_avx512<8>;
    t.f_order = avx512_f_order;
    t.i8_order = avx512_i8_order;
    return t;
  }();
  return q;
}

}  // namespace hinamoe
