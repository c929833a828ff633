// AVX-512 vector helpers shared by the avx512 kernels (gemm_rows, the dense
// MatMul): 16 elements of any DType widened exactly to float32 (f16 via
// vcvtph2ps, bf16 via zero-extend + 16-bit shift), whole or masked (lanes
// outside the mask are zero and not read).
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
