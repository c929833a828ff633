// AVX2 vector helpers shared by the avx2 kernels (gemm_rows, gqa, the dense
// MatMul): weights / cache rows of any DType widened exactly to float32
// (f16 via vcvtph2ps, bf16 via zero-extend + 16-bit shift), and horizontal
// sums. Every function carries the tier's
// target and is always inlined into functions that have it.
#pragma once

#include <immintrin.h>

#include "dtype.h"
#include "isa_target.h"

namespace hinamoe {
namespace avx2 {

// 8 elements as float32.
template <DType DT>
HINAMOE_AVX2_INLINE __m256 load8(const typename Elem<DT>::T* p) {
  if constexpr (DT == DType::F32) {
    return _mm256_loadu_ps(p);
  } else if constexpr (DT == DType::F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
}

// One element as float32.
template <DType DT>
HINAMOE_AVX2_INLINE float load1(const typename Elem<DT>::T* p) {
  if constexpr (DT == DType::F32) {
    return *p;
  } else if constexpr (DT == DType::F16) {
    return _cvtsh_ss(*p);
  } else {
    return bits_to_f32(uint32_t(*p) << 16);
  }
}

HINAMOE_AVX2_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The vector traits of dense/gemm_kn_impl.h on ymm registers.
struct Vec {
  using Reg = __m256;
  static constexpr int kLanes = 8;
  template <DType DT>
  static HINAMOE_AVX2_INLINE Reg load(const typename Elem<DT>::T* p) { return load8<DT>(p); }
  static HINAMOE_AVX2_INLINE Reg zero() { return _mm256_setzero_ps(); }
  static HINAMOE_AVX2_INLINE Reg set1(float v) { return _mm256_set1_ps(v); }
  static HINAMOE_AVX2_INLINE Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static HINAMOE_AVX2_INLINE Reg loadf(const float* p) { return _mm256_loadu_ps(p); }
  static HINAMOE_AVX2_INLINE void storef(float* p, Reg v) { _mm256_storeu_ps(p, v); }
};

}  // namespace avx2
}  // namespace hinamoe
