// Horizontal sums of several zmm vectors at once, for the avx512 tier's
// kernels (gemm_rows_avx512.cc, qmoe/qgemm_avx512.cc). Include after
// <immintrin.h>; the functions carry the tier's target and are always
// inlined into functions that have it.
#pragma once

#include "isa_target.h"

#include <immintrin.h>

namespace hinamoe {
namespace avx512 {

// Per 128-bit lane: [a0+a1, a2+a3, b0+b1, b2+b3] (the lanes of _mm256_hadd_ps).
HINAMOE_AVX512_INLINE __m512 hadd(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

// Lane i of the result = the sum of the 16 lanes of v[i], for i < N <= 16
// (the other lanes: 0). A transposing tree: two hadd levels leave, per
// 128-bit lane, partial sums of four vectors; two levels of 128-bit lane
// shuffles add up the lanes. About 3 instructions per sum instead of ~8 for
// one reduction per vector.
template <int N>
HINAMOE_AVX512_INLINE __m512 hsum_lanes(const __m512* v) {
  static_assert(N >= 1 && N <= 16, "one zmm of sums");
  const __m512 z = _mm512_setzero_ps();
  __m512 q[4];
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    const int i = 4 * g;
    const __m512 a = i < N ? v[i] : z, b = i + 1 < N ? v[i + 1] : z;
    const __m512 c = i + 2 < N ? v[i + 2] : z, d = i + 3 < N ? v[i + 3] : z;
    q[g] = i < N ? hadd(hadd(a, b), hadd(c, d)) : z;
  }
  // q[g], 128-bit lane L: [sum of part L of v[4g] .. v[4g+3]].
  const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(q[0], q[1], 0x44), _mm512_shuffle_f32x4(q[0], q[1], 0xee));
  const __m512 w1 = N > 8 ? _mm512_add_ps(_mm512_shuffle_f32x4(q[2], q[3], 0x44), _mm512_shuffle_f32x4(q[2], q[3], 0xee)) : z;
  return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xdd));
}

}  // namespace avx512
}  // namespace hinamoe
