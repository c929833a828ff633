// The AVX2 tier's int8-token kernels on AVX-VNNI (vpdpbusd on ymm, VEX
// encoded: Alder Lake, Sapphire Rapids and later, Zen 5): the body
// of qgemm_i8_avx2.inc with one vpdpbusd per 32 codes and token, where
// vpmaddubsw + vpmaddwd + vpaddd take three. u8 x s8 products sum in int32,
// so 8-bit codes enter raw (no sign trick) and their zero point 128 joins
// the 4-bit one in the per-row correction. The float path stays avx2's.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "../isa_target.h"
#include "qgemm_avx2_common.h"
#include "qmoe_ffn.h"

namespace hinamoe {
namespace {

using namespace qavx2;

struct I8Dot {
  static constexpr int kShift8 = 0;  // 8-bit codes enter as they are
  template <int BITS>
  HINAMOE_AVX2_VNNI_INLINE static void codes32(const uint8_t* row, int64_t k, __m256i* u, __m256i*) {
    if constexpr (BITS == 4) *u = nibbles32(row, k);
    else *u = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k));
  }
  template <int BITS>
  HINAMOE_AVX2_VNNI_INLINE static void codes16(const uint8_t* row, int64_t k, __m256i* u, __m256i*) {
    if constexpr (BITS == 4) *u = nibbles16(row, k);
    else *u = _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));
  }
  HINAMOE_AVX2_VNNI_INLINE static __m256i pair4(__m256i lo, __m256i hi, __m256i xe, __m256i xo) {
    return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), lo, xe), hi, xo);
  }
  template <int BITS>
  HINAMOE_AVX2_VNNI_INLINE static __m256i dot(__m256i acc, __m256i u, __m256i, __m256i x) {
    return _mm256_dpbusd_avx_epi32(acc, u, x);
  }
};

#define HQ_I8_FN HINAMOE_AVX2_VNNI_FN
#include "qgemm_i8_avx2.inc"
#undef HQ_I8_FN

}  // namespace

const QuantKernels& quant_avx2_vnni() {
  static const QuantKernels q = [] {
    QuantKernels t = quant_avx2();
    t.name = "avx2-vnni";
    t.gemm_i8[0] = qgemm_i8<4>;
    t.gemm_i8[1] = qgemm_i8<8>;
    return t;
  }();
  return q;
}

}  // namespace hinamoe
