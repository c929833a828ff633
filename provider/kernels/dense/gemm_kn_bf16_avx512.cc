// gemm_kn for bfloat16 weights and tokens on AVX512-BF16 (tier.h's
// GemmKnBf16Fn). The loops are gemm_kn_impl.h's (bands of rows across the
// columns, register tiles of MR tokens x NV vectors); what differs is the
// tile's step: two rows at once. Columns j of rows k and k+1 are zero-extended
// into one 32-bit lane each and joined as the pair (w[k][j], w[k+1][j]);
// each token broadcasts its own pair (a[m][k], a[m][k+1]), 32 bits that
// lie side by side in A; vdpbf16ps adds both products to the float32
// accumulator. Per two rows that is one instruction per token and vector
// instead of two FMAs, and A is never widened. An odd last row goes
// through the float path.
#include <algorithm>
#include <cstring>

#include "../vec_avx512.h"
#include "gemm_kn.h"

// The shared loops get this file's target (AVX-512 with BF16).
#define KN_INLINE HINAMOE_AVX512_BF16_INLINE
#include "gemm_kn_impl.h"

namespace hinamoe {
namespace {

using kn_impl::kPrefetchBytes;

HINAMOE_AVX512_BF16_INLINE __m512 bf16x16_as_f32(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

template <int MR, int NV>
HINAMOE_AVX512_BF16_INLINE void pair_tile(const uint16_t* w, int64_t ldw, int64_t rows, const uint16_t* a,
                                          int64_t lda, float* y, int64_t ldy, bool first) {
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[m][v] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(y + m * ldy + v * 16);
  int64_t k = 0;
  for (; k + 2 <= rows; k += 2) {
    const uint16_t* w0 = w + k * ldw;
    const uint16_t* w1 = w0 + ldw;
    const char* pf0 = reinterpret_cast<const char*>(w0) + kPrefetchBytes;
    const char* pf1 = reinterpret_cast<const char*>(w1) + kPrefetchBytes;
    for (int b = 0; b < NV * 32; b += 64) {
      __builtin_prefetch(pf0 + b, 0, 2);
      __builtin_prefetch(pf1 + b, 0, 2);
    }
    __m512bh pair[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + v * 16)));
      const __m512i hi = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w1 + v * 16)));
      pair[v] = reinterpret_cast<__m512bh>(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      uint32_t x2;
      std::memcpy(&x2, a + m * lda + k, 4);
      const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi32(int(x2)));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], pair[v], b);
    }
  }
  if (k < rows) {  // an odd last row
    __m512 wf[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) wf[v] = bf16x16_as_f32(w + k * ldw + v * 16);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m512 b = _mm512_set1_ps(bf16_to_f32(a[m * lda + k]));
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_fmadd_ps(b, wf[v], acc[m][v]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(y + m * ldy + v * 16, acc[m][v]);
}

struct PairTiles {
  using WT = uint16_t;
  using XT = uint16_t;
  static constexpr int kLanes = 16;
  template <int MR, int NV>
  static HINAMOE_AVX512_BF16_INLINE void tile(const uint16_t* w, int64_t ldw, int64_t rows, const uint16_t* a,
                                              int64_t lda, float* y, int64_t ldy, bool first) {
    pair_tile<MR, NV>(w, ldw, rows, a, lda, y, ldy, first);
  }
  static float w_at(const uint16_t* w, int64_t i) { return bf16_to_f32(w[i]); }
  static float x_at(const uint16_t* a, int64_t i) { return bf16_to_f32(a[i]); }
};

HINAMOE_AVX512_BF16_FN void gemm_kn_bf16(const uint16_t* W, int64_t ldw, int64_t K, int64_t n0, int64_t n1,
                                         const uint16_t* A, int64_t lda, int64_t M, float* Y, int64_t ldy) {
  kn_impl::gemm_kn_loops<PairTiles>(W, ldw, K, n0, n1, A, lda, M, Y, ldy);
}

}  // namespace

GemmKnBf16Fn gemm_kn_bf16_avx512() { return avx512_bf16_unavailable_reason().empty() ? gemm_kn_bf16 : nullptr; }

}  // namespace hinamoe
