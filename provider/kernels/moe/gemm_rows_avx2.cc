// The AVX2 tier: register-blocked dot-product micro-kernels that read the
// weights in place (f32, f16 via vcvtph2ps, bf16 via zero-extend + shift).
//
// Only the functions below carry target("avx2,fma,f16c"); the file itself is
// built for baseline x86-64, so no header inline function gets an AVX2 body
// that the linker could hand to code running on an older CPU.
#include <immintrin.h>

#include <algorithm>

#include "../isa_target.h"
#include "../vec_avx2.h"
#include "../weight_prefetch.h"
#include "gemm_rows.h"
#include "gemm_rows_tiling.h"

// Software prefetch on the weight stream, bytes ahead of the current load
// (0 = none). On Zen 3 a prefetch 1 KiB ahead measured 2-15% faster than
// the hardware prefetcher alone at M = 1..16, and faster than NTA or than
// 512 / 2048 bytes ahead (hinamoe_kernel_bench; the machine is shared, so
// best-of-rounds numbers). Into L2 (T1), not L1 (with 8 rows in flight the
// L1 miss buffers probably run out): on Zen 5 at 1 token per expert T1
// streamed the long rows of Mixtral-8x7B and DeepSeek-V3 (per-row
// prefetch) 10-40% faster than T0 (hina-bench ffn A/B against ggml,
// 2026-12-04).
#ifndef HINAMOE_PF_DIST
#define HINAMOE_PF_DIST 1024
#endif
#ifndef HINAMOE_PF_HINT
#define HINAMOE_PF_HINT _MM_HINT_T1
#endif
// Short contiguous blocks prefetch the next block linearly into L2
// (weight_prefetch.h), up to LIN_MAX KiB. Knob for A/B runs.
#ifndef HINAMOE_LIN_MAX
#define HINAMOE_LIN_MAX 48
#endif
// One token on contiguous rows of at most ROW1_MAXK elements: rows_one_token.
// On Zen 5 against ggml at 1 token per expert (hina-bench ffn, 3 alternating
// rounds, 2026-12-04): Qwen3-30B-A3B 0.92-0.99x -> 0.99-1.01x, the other
// shapes within the noise; on longer rows (Mixtral-8x7B, DeepSeek-V3 gate/up)
// it was 20-40% slower, hence the limit.
#ifndef HINAMOE_ROW1_MAXK
#define HINAMOE_ROW1_MAXK 3072
#endif

namespace hinamoe {
namespace {

using avx2::hsum;
using avx2::load1;
using avx2::load8;

// R weight rows x T tokens over the whole K: R*T ymm accumulators, each row
// vector loaded (and converted) once per step and reused by the T tokens.
// y[t*ldy + r] (+)= dot(w row r, x row t) over K elements; rows are ldw apart.
template <DType DT, int R, int T>
HINAMOE_AVX2_FN void micro(const typename Elem<DT>::T* w, int64_t K, int64_t ldw, const float* x, int64_t ldx,
                           float* y, int64_t ldy, bool accumulate) {
  using E = typename Elem<DT>::T;
  __m256 acc[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  // Prefetch (weight_prefetch.h): the next block of short rows linearly,
  // long rows per row.
  const WeightPrefetch<E, R, 8, HINAMOE_PF_DIST, HINAMOE_PF_HINT, HINAMOE_LIN_MAX> prefetch(w, K, ldw);
  const int64_t K8 = K & ~int64_t(7);
  for (int64_t k = 0; k < K8; k += 8) {
    prefetch.before(k);
    __m256 wv[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) wv[r] = load8<DT>(w + r * ldw + k);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x + t * ldx + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      float s = hsum(acc[r][t]);
      for (int64_t k = K8; k < K; ++k) s += load1<DT>(w + r * ldw + k) * x[t * ldx + k];
      y[t * ldy + r] = accumulate ? y[t * ldy + r] + s : s;
    }
  }
}

// One token, contiguous short rows: one row at a time with four
// accumulators, so each thread reads its rows as one linear stream, as
// ggml's vec_dot does, left to the hardware prefetcher. Only while the token
// row (K floats) stays in L1 next to the stream: re-read for every row.
template <DType DT>
HINAMOE_AVX2_FN void rows_one_token(const typename Elem<DT>::T* w, int64_t K, int64_t rows, const float* x,
                                    float* y, bool accumulate) {
  const int64_t K32 = K & ~int64_t(31);
  for (int64_t r = 0; r < rows; ++r, w += K) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t k = 0; k < K32; k += 32) {
      a0 = _mm256_fmadd_ps(load8<DT>(w + k), _mm256_loadu_ps(x + k), a0);
      a1 = _mm256_fmadd_ps(load8<DT>(w + k + 8), _mm256_loadu_ps(x + k + 8), a1);
      a2 = _mm256_fmadd_ps(load8<DT>(w + k + 16), _mm256_loadu_ps(x + k + 16), a2);
      a3 = _mm256_fmadd_ps(load8<DT>(w + k + 24), _mm256_loadu_ps(x + k + 24), a3);
    }
    int64_t k = K32;
    for (; k + 8 <= K; k += 8) a0 = _mm256_fmadd_ps(load8<DT>(w + k), _mm256_loadu_ps(x + k), a0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; k < K; ++k) s += load1<DT>(w + k) * x[k];
    y[r] = accumulate ? y[r] + s : s;
  }
}

// Rows per micro-kernel call for a token tile of T: R*T accumulators + R
// weight registers + 1 token register fit the 16 ymm registers.
// One token: 8 rows (8 weight streams, 8 independent FMA chains) measured
// faster than 4 at M=1.
#ifndef HINAMOE_R1
#define HINAMOE_R1 8
#endif
constexpr int rows_for(int T) { return T == 1 ? HINAMOE_R1 : T == 2 ? 4 : 3; }

// Rows [nb0, nb1) against one token tile, over the K slice that W and x
// already point at (kc elements of rows ldw apart).
template <DType DT, int T>
HINAMOE_AVX2_FN void rows_loop(const typename Elem<DT>::T* W, int64_t kc, int64_t ldw, int64_t nb0, int64_t nb1,
                               int64_t n0, const float* x, int64_t ldx, float* y, int64_t ldy, bool acc) {
  constexpr int R = rows_for(T);
  if (T == 1 && ldw == kc && kc <= HINAMOE_ROW1_MAXK) {
    rows_one_token<DT>(W + nb0 * ldw, kc, nb1 - nb0, x, y + (nb0 - n0), acc);
    return;
  }
  int64_t n = nb0;
  for (; n + R <= nb1; n += R) micro<DT, R, T>(W + n * ldw, kc, ldw, x, ldx, y + (n - n0), ldy, acc);
  // Leftover rows (fewer than R): at most one call of each smaller size.
  if constexpr (R > 4) {
    if (nb1 - n >= 4) { micro<DT, 4, T>(W + n * ldw, kc, ldw, x, ldx, y + (n - n0), ldy, acc); n += 4; }
  }
  switch (nb1 - n) {
    case 1: micro<DT, 1, T>(W + n * ldw, kc, ldw, x, ldx, y + (n - n0), ldy, acc); break;
    case 2: micro<DT, 2, T>(W + n * ldw, kc, ldw, x, ldx, y + (n - n0), ldy, acc); break;
    case 3: micro<DT, 3, T>(W + n * ldw, kc, ldw, x, ldx, y + (n - n0), ldy, acc); break;
    default: break;
  }
}

// Rows ldw elements apart, K columns each (ldw == K: gemm_rows), in the
// shared blocking (gemm_rows_tiling.h) over this tier's rows_loop.
template <DType DT>
HINAMOE_AVX2_INLINE void gemm_rows_impl(const void* Wv, int64_t ldw, int64_t K, int64_t n0, int64_t n1,
                                        const float* X, int64_t ldx, int64_t M, float* Y, int64_t ldy) {
  using E = typename Elem<DT>::T;
  tile_gemm_rows(static_cast<const E*>(Wv), K, n0, n1, X, ldx, M, Y, ldy, 12,
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
HINAMOE_AVX2_FN void gemm_rows_avx2(const void* W, int64_t K, int64_t n0, int64_t n1, const float* X,
                                    int64_t ldx, int64_t M, float* Y, int64_t ldy) {
  gemm_rows_impl<DT>(W, K, K, n0, n1, X, ldx, M, Y, ldy);
}

template <DType DT>
HINAMOE_AVX2_FN void gemm_rows_strided_avx2(const void* W, int64_t ldw, int64_t K, int64_t n0, int64_t n1,
                                            const float* X, int64_t ldx, int64_t M, float* Y, int64_t ldy) {
  gemm_rows_impl<DT>(W, ldw, K, n0, n1, X, ldx, M, Y, ldy);
}

}  // namespace

GemmRowsKernels gemm_rows_avx2_kernels() {
  return {{gemm_rows_avx2<DType::F32>, gemm_rows_avx2<DType::F16>, gemm_rows_avx2<DType::BF16>},
          {gemm_rows_strided_avx2<DType::F32>, gemm_rows_strided_avx2<DType::F16>, gemm_rows_strided_avx2<DType::BF16>}};
}

}  // namespace hinamoe
