// The AVX2 quantised kernels: codes decoded in registers straight from the
// packed rows (never a dequantised copy of a weight; from 16 tokens a
// 256-column chunk of 12 rows at a time, in L1), several rows at once so
// several weight streams are in flight, a software prefetch ahead on each.
//   float path: 8-bit, 8 codes -> 8 int32 -> float -> weights by one FMA
//     (q * s - zp * s) -> one FMA per token; 4-bit, 16 codes from one
//     zero-extending load on tokens in EvenOdd order (micro_f4); for
//     blocks of 32 without zero points (both widths) the scale applied per
//     block to sum q x, the zero point once per row (micro_fq_b32); from
//     16 tokens the tokens transposed and each weight broadcast against 8
//     tokens a vector (f_transposed);
//   int8 path (accuracy_level 4, qgemm_i8_avx2.inc): 32 codes x 32 int8
//     tokens per vpmaddubsw + vpmaddwd (8-bit: codes - 128 via sign/abs, so
//     no int16 overflow); qgemm_avx2_vnni.cc runs the same body on vpdpbusd.
// Only the functions below carry target attributes (see moe/gemm_rows_avx2.cc).
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "../aligned_buffer.h"
#include "../isa_target.h"
#include "qgemm_avx2_common.h"
#include "../tuning.h"
#include "qmoe_ffn.h"

namespace hinamoe {
namespace {

using namespace qavx2;

// Rows [n, n+R) x tokens [0, T): Y[t*ldy + r] = dot over K. Each group of 8
// codes becomes weights with one FMA, q * s + (-zp * s), shared by the T
// tokens; no cancellation, no per-block epilogue.
template <int BITS, int R, int T, DType SDT, bool ZP>
HINAMOE_AVX2_FN void micro_f(const QWeight& w, int64_t n, const float* X, int64_t ldx, float* Y, int64_t ldy) {
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
HINAMOE_AVX2_FN void micro_f4(const QWeight& w, int64_t n, const float* X, int64_t ldx, float* Y, int64_t ldy) {
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
HINAMOE_AVX2_FN void micro_fq_b32(const QWeight& w, int64_t n, const float* X, int64_t ldx, const float* xs, float* Y,
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

// ------------------------------------------ float path, many tokens: transposed tokens
// With many tokens the tiles below reach about 43% of the FMA rate (Zen 5,
// one core, 4-bit codes in L2, 8-16 tokens: horizontal sums, a conversion
// per code per tile, a token load per FMA). Here, as on the avx512 tier, a
// call transposes its tokens once (XT[k][8 V]: V vectors of 8 tokens), each
// block of R rows is dequantised kTTChunk columns at a time into an L1
// buffer in the tokens' order, and every weight is broadcast against 8
// tokens a vector into R x V accumulators: 68% of the FMA rate at 16
// tokens, 51% at 12; streaming from DRAM on two threads (hinamoe_qmoe_bench,
// Qwen3-30B-A3B / gpt-oss-20b) 15-37% less time at 16 tokens; slower than
// the tiles below tuning::kTransposedMinTokensAvx2.
constexpr int64_t kTTTokens = tuning::kTransposedMinTokensAvx2;
constexpr int64_t kTTChunk = 256;  // columns dequantised at a time (a multiple of 16)

// The transposed path takes K in whole 16-element groups, each inside one
// scale block (so every group has one scale and zero point).
inline bool transposed_ok(const QWeight& w) { return w.K % 16 == 0 && (w.nb == 1 || w.block % 16 == 0); }

// In-register transpose of an 8 x 8 float matrix (r[i] = row i).
HINAMOE_AVX2_INLINE void transpose8(__m256 (&r)[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    u[4 * i + 0] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

// XT[k * 8V + t] = X[t * ldx + k] for t < M (M <= 8 V), 0 for t >= M; K % 8 == 0.
template <int V>
HINAMOE_AVX2_FN void transpose_tokens8(const float* X, int64_t ldx, int64_t M, int64_t K, float* XT) {
  for (int v = 0; v < V; ++v)
    for (int64_t k = 0; k < K; k += 8) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        const int64_t t = 8 * v + i;
        r[i] = t < M ? _mm256_loadu_ps(X + t * ldx + k) : _mm256_setzero_ps();
      }
      transpose8(r);
      for (int i = 0; i < 8; ++i) _mm256_store_ps(XT + (k + i) * 8 * V + 8 * v, r[i]);
    }
}

// Row n's columns [k0, k1) (multiples of 16) as (q - zp) * s into out, in
// the tokens' order (4-bit: EvenOdd per 16, 8-bit: k order).
template <int BITS, DType SDT, bool ZP>
HINAMOE_AVX2_INLINE void dequant_row(const QWeight& w, int64_t n, int64_t k0, int64_t k1, float* out) {
  const uint8_t* row = w.codes + n * w.row_stride();
  const __m256i low4 = _mm256_set1_epi32(0xF);
  for (int64_t k = k0; k < k1; k += 16) {
    const int64_t b = w.nb == 1 ? 0 : k / w.block;
    const float s = scale_at<SDT>(w, n, b);
    const __m256 sv = _mm256_set1_ps(s), zv = _mm256_set1_ps(-float(zero_at<BITS, ZP>(w, n, b)) * s);
    float* o = out + (k - k0);
    if constexpr (BITS == 4) {
      const __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k / 2)));
      _mm256_store_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(d, low4)), sv, zv));
      _mm256_store_ps(o + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(d, 4)), sv, zv));
    } else {
      for (int h = 0; h < 2; ++h) {
        const __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k + 8 * h)));
        _mm256_store_ps(o + 8 * h, _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), sv, zv));
      }
    }
  }
}

// C[(r V + v) 8 ..] (+)= sum over j < J of Wd[r * kTTChunk + j] * XT[j * 8V + 8v ..].
template <int R, int V>
HINAMOE_AVX2_FN void transposed_chunk(const float* Wd, const float* XT, int64_t J, float* C, bool first) {
  // Fully unrolled over r and v so the accumulators stay in registers.
  __m256 acc[R][V];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = first ? _mm256_setzero_ps() : _mm256_load_ps(C + (r * V + v) * 8);
  for (int64_t j = 0; j < J; ++j) {
    __m256 xv[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) xv[v] = _mm256_load_ps(XT + j * 8 * V + 8 * v);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m256 wb = _mm256_broadcast_ss(Wd + r * kTTChunk + j);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(wb, xv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm256_store_ps(C + (r * V + v) * 8, acc[r][v]);
}

// Rows [n, n + R) against the M (<= 8 V) tokens of XT: Y[t * ldy + r].
template <int BITS, DType SDT, bool ZP, int R, int V>
HINAMOE_AVX2_FN void transposed_rows(const QWeight& w, int64_t n, const float* XT, int64_t M, float* Y, int64_t ldy, float* Wd,
                     float* C) {
  const int64_t rb = w.row_stride();
  for (int64_t kc = 0; kc < w.K; kc += kTTChunk) {
    const int64_t kz = std::min(w.K, kc + kTTChunk);
    for (int r = 0; r < R; ++r) {
      // The codes two chunks ahead (near a row's end: the next block's row).
      const int64_t kn = kc + 2 * kTTChunk;
      const int64_t rn = kn < w.K ? n + r : n + R + r, kr = kn < w.K ? kn : kn - w.K;
      const uint8_t* next = w.codes + rn * rb + kr * BITS / 8;
      for (int64_t o = 0; o < kTTChunk * BITS / 8; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next + o), _MM_HINT_T0);
      dequant_row<BITS, SDT, ZP>(w, n + r, kc, kz, Wd + r * kTTChunk);
    }
    transposed_chunk<R, V>(Wd, XT + kc * 8 * V, kz - kc, C, kc == 0);
  }
  for (int64_t t = 0; t < M; ++t)
    for (int r = 0; r < R; ++r) Y[t * ldy + r] = C[(r * V + t / 8) * 8 + t % 8];
}

template <int BITS, DType SDT, bool ZP, int V>
void transposed_range(const QWeight& w, int64_t n0, int64_t n1, const float* XT, int64_t M, float* Y, int64_t ldy,
                float* Wd, float* C) {
  constexpr int R = V == 1 ? 12 : 6;  // R x V accumulators of the 16 ymm registers
  int64_t n = n0;
  for (; n + R <= n1; n += R) transposed_rows<BITS, SDT, ZP, R, V>(w, n, XT, M, Y + (n - n0), ldy, Wd, C);
  for (; n < n1; ++n) transposed_rows<BITS, SDT, ZP, 1, V>(w, n, XT, M, Y + (n - n0), ldy, Wd, C);
}

template <int BITS, DType SDT, bool ZP>
void f_transposed(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
                int64_t ldy) {
  // Per thread, reused across calls (K x 16 floats, 12 rows of a chunk).
  thread_local AlignedVector<float> xt, wd(size_t(12 * kTTChunk)), c(size_t(12 * 8));
  if (xt.size() < size_t(w.K * 16)) xt.resize(size_t(w.K * 16));
  for (int64_t g = 0; g < M; g += 16) {
    const int64_t Mg = std::min<int64_t>(16, M - g);
    if (Mg > 8) {
      transpose_tokens8<2>(X + g * ldx, ldx, Mg, w.K, xt.data());
      transposed_range<BITS, SDT, ZP, 2>(w, n0, n1, xt.data(), Mg, Y + g * ldy, ldy, wd.data(), c.data());
    } else {
      transpose_tokens8<1>(X + g * ldx, ldx, Mg, w.K, xt.data());
      transposed_range<BITS, SDT, ZP, 1>(w, n0, n1, xt.data(), Mg, Y + g * ldy, ldy, wd.data(), c.data());
    }
  }
}

// Row blocks (kRowBlock), in each every token tile of up to 3 (4 in micro_fq_b32).
template <int BITS, DType SDT, bool ZP>
HINAMOE_AVX2_FN void qgemm_t(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
             int64_t ldy) {
  if (M >= kTTTokens && transposed_ok(w)) return f_transposed<BITS, SDT, ZP>(w, n0, n1, X, ldx, M, Y, ldy);
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
    for (int64_t m = 0, T; m < M; m += T) {
      // micro_fq_b32 takes 4 tokens x 2 rows from 4 tokens on: a row's codes
      // are converted once per 4 tokens, not for 3 and again for the rest.
      T = !xs.empty() && M - m >= 4 ? 4 : std::min<int64_t>(3, M - m);
      const float* x = X + m * ldx;
      float* y = Y + m * ldy;
      if constexpr (!ZP)
        if (!xs.empty()) {
          const float* s = xs.data() + m * w.nb;
          tile_rows<4>(T, r0, r1, [&](auto r, auto t, int64_t n) {
            micro_fq_b32<BITS, decltype(r)::value, decltype(t)::value, SDT>(w, n, x, ldx, s, y + (n - n0), ldy);
          });
          continue;
        }
      tile_rows<3>(T, r0, r1, [&](auto r, auto t, int64_t n) {
        micro_float<BITS, decltype(r)::value, decltype(t)::value, SDT, ZP>(w, n, x, ldx, y + (n - n0), ldy);
      });
    }
  }
}

// Picks the instantiation for the weight's scale type and zero points.
template <int BITS>
void qgemm_avx2(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
                int64_t ldy) {
  with_weight_kind<BITS>(w, [&](auto, auto sdt, auto zp) {
    qgemm_t<BITS, decltype(sdt)::value, decltype(zp)::value>(w, n0, n1, X, ldx, M, Y, ldy);
  });
}

// The int8-token dot on vpmaddubsw + vpmaddwd (qgemm_i8_avx2.inc).
struct I8Dot {
  static constexpr int kShift8 = 128;  // 8-bit codes enter as q - 128 (|q - 128| and its sign on the tokens)
  template <int BITS>
  HINAMOE_AVX2_INLINE static void codes32(const uint8_t* row, int64_t k, __m256i* u, __m256i* sgn) {
    if constexpr (BITS == 4) {
      *u = nibbles32(row, k);
    } else {
      *sgn = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k)),
                              _mm256_set1_epi8(char(0x80)));
      *u = _mm256_abs_epi8(*sgn);
    }
  }
  template <int BITS>
  HINAMOE_AVX2_INLINE static void codes16(const uint8_t* row, int64_t k, __m256i* u, __m256i* sgn) {
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
  HINAMOE_AVX2_INLINE static __m256i pair4(__m256i lo, __m256i hi, __m256i xe, __m256i xo) {
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xe), _mm256_maddubs_epi16(hi, xo));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
  }
  // 4-bit products stay under 15 * 127 * 2, 8-bit under 128 * 127 * 2: no int16 saturation.
  template <int BITS>
  HINAMOE_AVX2_INLINE static __m256i dot(__m256i acc, __m256i u, __m256i sgn, __m256i x) {
    const __m256i p = BITS == 4 ? _mm256_maddubs_epi16(u, x) : _mm256_maddubs_epi16(u, _mm256_sign_epi8(x, sgn));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
};

#define HQ_I8_FN HINAMOE_AVX2_FN
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
