// The AVX-512 tier: the register-blocked dot products of the avx2 tier
// (gemm_rows_avx2.cc) on zmm registers: 16 lanes, 32 registers, so more
// rows x tokens per micro-tile, and one masked step for the K tail. Weights
// are read in place and widened exactly to float32 (f16 via vcvtph2ps, bf16
// via zero-extend + shift); the tokens stay float32, as on the other tiers,
// except in the bf16 pair kernels (AVX512-BF16: bf16 tokens).
//
// Only the functions below carry the target attribute; the file itself is
// built for baseline x86-64, so no header inline function gets an AVX-512
// body that the linker could hand to code running on an older CPU.
#include "../vec_avx512.h"  // first: <immintrin.h> without GCC 12's false warnings

#include <algorithm>

#include "../aligned_buffer.h"
#include "../isa_target.h"
#include "../vec_avx512.h"
#include "../weight_prefetch.h"
#include "gemm_rows.h"
#include "gemm_rows_tiling.h"


// Software prefetch on the weight stream, as in the avx2 tier (its scheme):
// PF_DIST bytes ahead of the current load (0 = none) into PF_HINT, or, for
// contiguous blocks up to LIN_MAX KiB, the next block linearly into L2.
// Knobs for A/B runs; see micro(). Into L2, not L1: on Zen 5 at 1 token
// per expert, T1 instead of T0 on the per-row path streamed Mixtral-8x7B
// and DeepSeek-V3 experts 10-40% faster (x ggml 0.74-0.97 -> 0.98-1.26,
// hina-bench ffn A/B, 2026-12-04); the short rows of the linear path
// (Qwen3's down projection) moved within the noise.
#ifndef HINAMOE_AVX512_PF_DIST
#define HINAMOE_AVX512_PF_DIST 1024
#endif
#ifndef HINAMOE_AVX512_PF_HINT
#define HINAMOE_AVX512_PF_HINT _MM_HINT_T1
#endif
#ifndef HINAMOE_AVX512_LIN_MAX
#define HINAMOE_AVX512_LIN_MAX 48
#endif

namespace hinamoe {
namespace {

using avx512::load16;

template <DType DT, bool Masked>
HINAMOE_AVX512_INLINE __m512 load_w(const typename Elem<DT>::T* p, __mmask16 m) {
  if constexpr (Masked) return load16<DT>(p, m);
  (void)m;
  return load16<DT>(p);
}

template <bool Masked>
HINAMOE_AVX512_INLINE __m512 load_x(const float* p, __mmask16 m) {
  if constexpr (Masked) return _mm512_maskz_loadu_ps(m, p);
  (void)m;
  return _mm512_loadu_ps(p);
}

// One K step of the R x T tile: acc[r][t] += w row r * x row t over 16 (or,
// masked, fewer) elements. Whichever of the R weight vectors or the T token
// vectors is fewer stays in registers while the other streams through one:
// R*T accumulators + min(R, T) + 1 live registers.
template <DType DT, int R, int T, bool Masked>
HINAMOE_AVX512_INLINE void step(const typename Elem<DT>::T* w, int64_t ldw, const float* x, int64_t ldx,
                                __mmask16 m, __m512 (&acc)[R][T]) {
  if constexpr (R <= T) {
    __m512 wv[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) wv[r] = load_w<DT, Masked>(w + r * ldw, m);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 xv = load_x<Masked>(x + t * ldx, m);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  } else {
    __m512 xv[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) xv[t] = load_x<Masked>(x + t * ldx, m);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 wv = load_w<DT, Masked>(w + r * ldw, m);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
}

// This tier's weight prefetch (weight_prefetch.h) for steps of StepElems.
template <class E, int R, int64_t StepElems>
using TierPrefetch = WeightPrefetch<E, R, StepElems, HINAMOE_AVX512_PF_DIST, HINAMOE_AVX512_PF_HINT,
                                 HINAMOE_AVX512_LIN_MAX>;

// Per token: the R row sums of the tile as one vector, one (masked) store
// into y[t*ldy + r] (added to what is there when `accumulate`).
template <int R, int T>
HINAMOE_AVX512_INLINE void store_row_sums(__m512 (&acc)[R][T], float* y, int64_t ldy, bool accumulate) {
  constexpr __mmask16 rows_mask = __mmask16((1u << R) - 1);
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    __m512 col[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) col[r] = acc[r][t];
    __m512 s = avx512::hsum_lanes<R>(col);
    float* yp = y + t * ldy;
    if (accumulate) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(rows_mask, yp));
    _mm512_mask_storeu_ps(yp, rows_mask, s);
  }
}

// R weight rows x T tokens over the whole K:
// y[t*ldy + r] (+)= dot(w row r, x row t) over K elements; rows are ldw apart.
template <DType DT, int R, int T>
HINAMOE_AVX512_FN void micro(const typename Elem<DT>::T* w, int64_t K, int64_t ldw, const float* x, int64_t ldx,
                             float* y, int64_t ldy, bool accumulate) {
  using E = typename Elem<DT>::T;
  __m512 acc[R][T];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const TierPrefetch<E, R, 16> prefetch(w, K, ldw);
  const int64_t K16 = K & ~int64_t(15);
  for (int64_t k = 0; k < K16; k += 16) {
    prefetch.before(k);
    step<DT, R, T, false>(w + k, ldw, x + k, ldx, 0, acc);
  }
  // The tail: masked loads read only the K % 16 elements left (the lanes
  // beyond are zero in both operands).
  if (K16 < K) step<DT, R, T, true>(w + K16, ldw, x + K16, ldx, __mmask16((1u << (K - K16)) - 1), acc);
  store_row_sums<R, T>(acc, y, ldy, accumulate);
}

// Rows per micro-kernel call for a token tile of T, within the 32 zmm
// registers (R*T accumulators + min(R, T) + 1 live). In-cache A/B on Zen 5
// (hinamoe_kernel_bench --incache, noisy shared machine): 8 rows at 2
// tokens beat 12 (bf16 +5-10%, f32 +10-30%), 6 rows at 3 tokens beat 8
// (bf16/f16 +5-15%); 12 or 16 rows at 1 token and 4 or 5 at 4 tokens showed
// no consistent gain.
#ifndef HINAMOE_AVX512_R1
#define HINAMOE_AVX512_R1 8
#endif
#ifndef HINAMOE_AVX512_R2
#define HINAMOE_AVX512_R2 8
#endif
#ifndef HINAMOE_AVX512_R3
#define HINAMOE_AVX512_R3 6
#endif
#ifndef HINAMOE_AVX512_R4
#define HINAMOE_AVX512_R4 6
#endif
constexpr int rows_for(int T) {
  return T == 1 ? HINAMOE_AVX512_R1 : T == 2 ? HINAMOE_AVX512_R2 : T == 3 ? HINAMOE_AVX512_R3 : HINAMOE_AVX512_R4;
}
// Row blocks of gemm_rows_impl are multiples of every R above (no leftovers
// inside a range).
constexpr int64_t kRowMultiple = 24;

// Rows [nb0, nb1) against one token tile, over the K slice that W and x
// already point at (kc elements of rows ldw apart).
template <DType DT, int T>
HINAMOE_AVX512_FN void rows_loop(const typename Elem<DT>::T* W, int64_t kc, int64_t ldw, int64_t nb0, int64_t nb1,
                                 int64_t n0, const float* x, int64_t ldx, float* y, int64_t ldy, bool acc) {
  constexpr int R = rows_for(T);
  static_assert(R <= 16, "leftover rows are split into 8, 4, 2, 1");
  int64_t n = nb0;
  for (; n + R <= nb1; n += R) micro<DT, R, T>(W + n * ldw, kc, ldw, x, ldx, y + (n - n0), ldy, acc);
  // Leftover rows (fewer than R): at most one call of each power of two.
  if constexpr (R > 8) {
    if (nb1 - n >= 8) { micro<DT, 8, T>(W + n * ldw, kc, ldw, x, ldx, y + (n - n0), ldy, acc); n += 8; }
  }
  if constexpr (R > 4) {
    if (nb1 - n >= 4) { micro<DT, 4, T>(W + n * ldw, kc, ldw, x, ldx, y + (n - n0), ldy, acc); n += 4; }
  }
  if constexpr (R > 2) {
    if (nb1 - n >= 2) { micro<DT, 2, T>(W + n * ldw, kc, ldw, x, ldx, y + (n - n0), ldy, acc); n += 2; }
  }
  if (nb1 - n >= 1) micro<DT, 1, T>(W + n * ldw, kc, ldw, x, ldx, y + (n - n0), ldy, acc);
}

// bf16 weights against one token: one 64-byte load gives 32 weights of a
// row; the even ones are its low halves (shifted up 16 bits), the odd ones
// its high halves (masked), both exact float32. The token is put in that
// order once per call (eo_order), so a cache line of weights costs 1 load,
// 2 integer ops and 2 FMAs instead of 2 widening loads, 2 shifts and
// 2 FMAs: fewer instructions between the loads of a memory-bound stream.
// The K % 32 tail runs the masked step on the token in its own order.
template <int R>
HINAMOE_AVX512_FN void micro_bf16_eo(const uint16_t* w, int64_t K, int64_t ldw, const float* xeo, const float* x,
                                     float* y) {
  __m512 acc[R][1], odd[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r][0] = odd[r] = _mm512_setzero_ps();
  const __m512i hi = _mm512_set1_epi32(int32_t(0xFFFF0000u));
  const TierPrefetch<uint16_t, R, 32> prefetch(w, K, ldw);  // a cache line per row and step
  const int64_t K32 = K & ~int64_t(31);
  for (int64_t k = 0; k < K32; k += 32) {
    prefetch.before(k);
    const __m512 xe = _mm512_load_ps(xeo + k), xo = _mm512_load_ps(xeo + k + 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512i v = _mm512_loadu_si512(w + r * ldw + k);
      acc[r][0] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), xe, acc[r][0]);
      odd[r] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, hi)), xo, odd[r]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r][0] = _mm512_add_ps(acc[r][0], odd[r]);
  for (int64_t k = K32; k < K; k += 16) {
    const int64_t n = std::min<int64_t>(16, K - k);
    step<DType::BF16, R, 1, true>(w + k, ldw, x + k, 0, __mmask16((1u << n) - 1), acc);
  }
  constexpr __mmask16 rows_mask = __mmask16((1u << R) - 1);
  __m512 col[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) col[r] = acc[r][0];
  _mm512_mask_storeu_ps(y, rows_mask, avx512::hsum_lanes<R>(col));
}

// x[0, K) in eo order: per 32 elements, the 16 even ones, then the 16 odd.
HINAMOE_AVX512_FN void eo_order(const float* x, int64_t K32, float* out) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i oddi = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t k = 0; k < K32; k += 32) {
    const __m512 a = _mm512_loadu_ps(x + k), b = _mm512_loadu_ps(x + k + 16);
    _mm512_store_ps(out + k, _mm512_permutex2var_ps(a, even, b));
    _mm512_store_ps(out + k + 16, _mm512_permutex2var_ps(a, oddi, b));
  }
}

// Rows [n0, n1) of bf16 W against one token x (K elements, rows ldw apart).
HINAMOE_AVX512_FN void rows_bf16_one_token(const uint16_t* W, int64_t ldw, int64_t K, int64_t n0, int64_t n1,
                                           const float* x, float* y) {
  thread_local AlignedVector<float> xeo;
  const int64_t K32 = K & ~int64_t(31);
  if (xeo.size() < size_t(K32)) xeo.resize(size_t(K32));
  eo_order(x, K32, xeo.data());
  constexpr int R = HINAMOE_AVX512_R1;
  static_assert(R <= 16, "leftover rows are split into 8, 4, 2, 1");
  int64_t n = n0;
  for (; n + R <= n1; n += R) micro_bf16_eo<R>(W + n * ldw, K, ldw, xeo.data(), x, y + (n - n0));
  if constexpr (R > 8) {
    if (n1 - n >= 8) { micro_bf16_eo<8>(W + n * ldw, K, ldw, xeo.data(), x, y + (n - n0)); n += 8; }
  }
  if constexpr (R > 4) {
    if (n1 - n >= 4) { micro_bf16_eo<4>(W + n * ldw, K, ldw, xeo.data(), x, y + (n - n0)); n += 4; }
  }
  if constexpr (R > 2) {
    if (n1 - n >= 2) { micro_bf16_eo<2>(W + n * ldw, K, ldw, xeo.data(), x, y + (n - n0)); n += 2; }
  }
  if (n1 - n >= 1) micro_bf16_eo<1>(W + n * ldw, K, ldw, xeo.data(), x, y + (n - n0));
}

// bf16 weights against bf16 tokens on AVX512-BF16: per K step of 32, one
// 64-byte load of a weight row and of a token row are both 16 pairs of
// neighbours (k, k+1), and one vdpbf16ps adds the 32 products of the pair
// into a float32 accumulator -- no widening, a third of the float path's
// instructions. Same R x T tiles and row blocks as micro(); the K tail is
// masked (zeros beyond K in both operands).
template <bool Masked>
HINAMOE_AVX512_BF16_INLINE __m512bh load_pairs(const uint16_t* p, __mmask32 m) {
  if constexpr (Masked) return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(m, p));
  (void)m;
  return reinterpret_cast<__m512bh>(_mm512_loadu_si512(p));
}

template <int R, int T, bool Masked>
HINAMOE_AVX512_BF16_INLINE void step_pairs(const uint16_t* w, int64_t ldw, const uint16_t* x, int64_t ldx,
                                           __mmask32 m, __m512 (&acc)[R][T]) {
  __m512bh xv[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) xv[t] = load_pairs<Masked>(x + t * ldx, m);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const __m512bh wv = load_pairs<Masked>(w + r * ldw, m);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], wv, xv[t]);
  }
}

template <int R, int T>
HINAMOE_AVX512_BF16_FN void micro_pairs(const uint16_t* w, int64_t K, int64_t ldw, const uint16_t* x, int64_t ldx,
                                        float* y, int64_t ldy, bool accumulate) {
  __m512 acc[R][T];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  const TierPrefetch<uint16_t, R, 32> prefetch(w, K, ldw);
  const int64_t K32 = K & ~int64_t(31);
  for (int64_t k = 0; k < K32; k += 32) {
    prefetch.before(k);
    step_pairs<R, T, false>(w + k, ldw, x + k, ldx, 0, acc);
  }
  if (K32 < K) step_pairs<R, T, true>(w + K32, ldw, x + K32, ldx, __mmask32((uint64_t(1) << (K - K32)) - 1), acc);
  store_row_sums<R, T>(acc, y, ldy, accumulate);
}

template <int T>
HINAMOE_AVX512_BF16_FN void rows_loop_pairs(const uint16_t* W, int64_t kc, int64_t ldw, int64_t nb0, int64_t nb1,
                                            int64_t n0, const uint16_t* x, int64_t ldx, float* y, int64_t ldy,
                                            bool acc) {
  constexpr int R = rows_for(T);
  int64_t n = nb0;
  for (; n + R <= nb1; n += R) micro_pairs<R, T>(W + n * ldw, kc, ldw, x, ldx, y + (n - n0), ldy, acc);
  if constexpr (R > 4) {
    if (nb1 - n >= 4) { micro_pairs<4, T>(W + n * ldw, kc, ldw, x, ldx, y + (n - n0), ldy, acc); n += 4; }
  }
  if constexpr (R > 2) {
    if (nb1 - n >= 2) { micro_pairs<2, T>(W + n * ldw, kc, ldw, x, ldx, y + (n - n0), ldy, acc); n += 2; }
  }
  if (nb1 - n >= 1) micro_pairs<1, T>(W + n * ldw, kc, ldw, x, ldx, y + (n - n0), ldy, acc);
}

HINAMOE_AVX512_BF16_FN void gemm_rows_bf16_pairs(const uint16_t* W, int64_t K, int64_t n0, int64_t n1,
                                                 const uint16_t* X, int64_t ldx, int64_t M, float* Y, int64_t ldy) {
  static_assert(rows_for(1) <= 8 && rows_for(4) <= 8, "leftover rows are split into 4, 2, 1");
  tile_gemm_rows(W, K, n0, n1, X, ldx, M, Y, ldy, kRowMultiple,
                 [&](int64_t T, const uint16_t* w, int64_t kc, int64_t nb, int64_t nbe, const uint16_t* x, float* y,
                     bool acc) {
                   switch (T) {
                     case 1: rows_loop_pairs<1>(w, kc, K, nb, nbe, n0, x, ldx, y, ldy, acc); break;
                     case 2: rows_loop_pairs<2>(w, kc, K, nb, nbe, n0, x, ldx, y, ldy, acc); break;
                     case 3: rows_loop_pairs<3>(w, kc, K, nb, nbe, n0, x, ldx, y, ldy, acc); break;
                     default: rows_loop_pairs<4>(w, kc, K, nb, nbe, n0, x, ldx, y, ldy, acc); break;
                   }
                 });
}

// Rows ldw elements apart, K columns each (ldw == K: gemm_rows), in the
// shared blocking (gemm_rows_tiling.h) over this tier's rows_loop.
template <DType DT>
HINAMOE_AVX512_INLINE void gemm_rows_impl(const void* Wv, int64_t ldw, int64_t K, int64_t n0, int64_t n1,
                                        const float* X, int64_t ldx, int64_t M, float* Y, int64_t ldy) {
  using E = typename Elem<DT>::T;
  if constexpr (DT == DType::BF16) {
    if (M == 1 && n1 > n0) return rows_bf16_one_token(static_cast<const E*>(Wv), ldw, K, n0, n1, X, Y);
  }
  tile_gemm_rows(static_cast<const E*>(Wv), K, n0, n1, X, ldx, M, Y, ldy, kRowMultiple,
                 [&](int64_t T, const E* w, int64_t kc, int64_t nb, int64_t nbe, const float* x, float* y, bool acc) {
                   switch (T) {
                     case 1: rows_loop<DT, 1>(w, kc, ldw, nb, nbe, n0, x, ldx, y, ldy, acc); break;
                     case 2: rows_loop<DT, 2>(w, kc, ldw, nb, nbe, n0, x, ldx, y, ldy, acc); break;
                     case 3: rows_loop<DT, 3>(w, kc, ldw, nb, nbe, n0, x, ldx, y, ldy, acc); break;
                     default: rows_loop<DT, 4>(w, kc, ldw, nb, nbe, n0, x, ldx, y, ldy, acc); break;
                   }
                 });
}
template <DType DT>
HINAMOE_AVX512_FN void gemm_rows_avx512(const void* W, int64_t K, int64_t n0, int64_t n1, const float* X,
                                        int64_t ldx, int64_t M, float* Y, int64_t ldy) {
  gemm_rows_impl<DT>(W, K, K, n0, n1, X, ldx, M, Y, ldy);
}

template <DType DT>
HINAMOE_AVX512_FN void gemm_rows_strided_avx512(const void* W, int64_t ldw, int64_t K, int64_t n0, int64_t n1,
                                                const float* X, int64_t ldx, int64_t M, float* Y, int64_t ldy) {
  gemm_rows_impl<DT>(W, ldw, K, n0, n1, X, ldx, M, Y, ldy);
}

}  // namespace

GemmRowsKernels gemm_rows_avx512_kernels() {
  return {{gemm_rows_avx512<DType::F32>, gemm_rows_avx512<DType::F16>, gemm_rows_avx512<DType::BF16>},
          {gemm_rows_strided_avx512<DType::F32>, gemm_rows_strided_avx512<DType::F16>, gemm_rows_strided_avx512<DType::BF16>}};
}

GemmRowsBf16Fn gemm_rows_bf16_avx512() {
  return avx512_bf16_unavailable_reason().empty() ? gemm_rows_bf16_pairs : nullptr;
}

}  // namespace hinamoe
