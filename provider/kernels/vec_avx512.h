// AVX-512 vector helpers shared by the avx512 kernels (gemm_rows, the QMoE
// kernels, the dense MatMul): 16 elements of any DType widened exactly to
// float32 (f16 via vcvtph2ps, bf16 via zero-extend + 16-bit shift), whole or
// masked (lanes outside the mask are zero and not read), and horizontal
// sums of several vectors at once.
//
// GCC 12 warns about the self-initialised _mm512_undefined_*() inside some
// AVX-512 intrinsics once they are inlined into target functions (a false
// positive in the header, not about the includer's variables).
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "dtype.h"
#include "isa_target.h"

namespace hinamoe {
namespace avx512 {

template <DType DT>
HINAMOE_AVX512_INLINE __m512 load16(const typename Elem<DT>::T* p) {
  if constexpr (DT == DType::F32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (DT == DType::F16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
}

template <DType DT>
HINAMOE_AVX512_INLINE __m512 load16(const typename Elem<DT>::T* p, __mmask16 m) {
  if constexpr (DT == DType::F32) {
    return _mm512_maskz_loadu_ps(m, p);
  } else if constexpr (DT == DType::F16) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  } else {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
}

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

// The vector traits of dense/gemm_kn_impl.h on zmm registers.
struct Vec {
  using Reg = __m512;
  static constexpr int kLanes = 16;
  template <DType DT>
  static HINAMOE_AVX512_INLINE Reg load(const typename Elem<DT>::T* p) { return load16<DT>(p); }
  static HINAMOE_AVX512_INLINE Reg zero() { return _mm512_setzero_ps(); }
  static HINAMOE_AVX512_INLINE Reg set1(float v) { return _mm512_set1_ps(v); }
  static HINAMOE_AVX512_INLINE Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static HINAMOE_AVX512_INLINE Reg loadf(const float* p) { return _mm512_loadu_ps(p); }
  static HINAMOE_AVX512_INLINE void storef(float* p, Reg v) { _mm512_storeu_ps(p, v); }
};

}  // namespace avx512
}  // namespace hinamoe
