// The two bf16 operands of the tile GEMM (qgemm_tiles.h), each a scalar
// version (the emulator's, and the reference) and an AVX512-BF16 one that
// writes the same bytes: weight rows dequantised into tile-major panels
// ((float(q) - float(zp)) * scale in float32, rounded to bf16, RNE), and
// token rows into VNNI blocks.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "qgemm_tiles.h"

#include "../aligned_buffer.h"

namespace hinamoe {

uint16_t* tile_panel(int64_t Kp) {
  thread_local AlignedVector<uint16_t> panel;
  if (panel.size() < size_t(32 * Kp)) panel.assign(size_t(32 * Kp), 0);
  return panel.data();
}

// Element (r, k) of the tile-major panel.
inline uint16_t& at(uint16_t* panel, int r, int64_t k) { return panel[(k / 32) * 1024 + r * 32 + (k & 31)]; }

void dequant_rows_bf16_ref(const QWeight& w, int64_t n, int rows, int64_t Kp, uint16_t* panel) {
  for (int r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < w.nb; ++b) {
      const float s = w.scale(n + r, b), z = float(w.zero_point(n + r, b));
      for (int64_t k = b * w.block; k < w.block_end(b); ++k)
        at(panel, r, k) = f32_to_bf16((float(w.code(n + r, k)) - z) * s);
    }
    for (int64_t k = w.K; k < Kp; ++k) at(panel, r, k) = 0;
  }
}

#define HINA_DQ_FN __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace {

// 32 codes from k (k a multiple of 32, k + 32 <= K) as two vectors of 16 floats.
HINA_DQ_FN inline void codes32(const uint8_t* row, int bits, int64_t k, __m512* lo, __m512* hi) {
  __m128i a, b;
  if (bits == 4) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2));
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m128i even = _mm_and_si128(v, m), odd = _mm_and_si128(_mm_srli_epi16(v, 4), m);
    a = _mm_unpacklo_epi8(even, odd);  // elements k .. k+15
    b = _mm_unpackhi_epi8(even, odd);  // k+16 .. k+31
  } else {
    a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k));
    b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k + 16));
  }
  *lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(a));
  *hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
}

}  // namespace

HINA_DQ_FN void dequant_rows_bf16_avx512(const QWeight& w, int64_t n, int rows, int64_t Kp, uint16_t* panel) {
  const int64_t K32 = w.K / 32 * 32;
  const int64_t half = std::min<int64_t>(w.block, 32) == 16 ? 16 : 32;  // elements per scale lookup
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = w.codes + (n + r) * w.row_stride();
    for (int64_t k = 0; k < K32; k += 32) {
      __m512 lo, hi;
      codes32(row, w.bits, k, &lo, &hi);
      const int64_t b0 = k / w.block, b1 = (k + half) / w.block;
      const __m512 s0 = _mm512_set1_ps(w.scale(n + r, b0)), z0 = _mm512_set1_ps(float(w.zero_point(n + r, b0)));
      const __m512 s1 = half == 16 ? _mm512_set1_ps(w.scale(n + r, b1)) : s0;
      const __m512 z1 = half == 16 ? _mm512_set1_ps(float(w.zero_point(n + r, b1))) : z0;
      lo = _mm512_mul_ps(_mm512_sub_ps(lo, z0), s0);
      hi = _mm512_mul_ps(_mm512_sub_ps(hi, z1), s1);
      _mm512_storeu_si512(&at(panel, r, k), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    for (int64_t k = K32; k < w.K; ++k) {  // a K that is not a multiple of 32
      const int64_t b = k / w.block;
      at(panel, r, k) = f32_to_bf16((float(w.code(n + r, k)) - float(w.zero_point(n + r, b))) * w.scale(n + r, b));
    }
    for (int64_t k = w.K; k < Kp; ++k) at(panel, r, k) = 0;
  }
}

}  // namespace hinamoe

namespace hinamoe {

void vnni_rows16_ref(const float* const* rows, int n, int64_t K, int64_t Kp, uint32_t* dst, int64_t ld) {
  for (int64_t kk = 0; kk < Kp / 2; ++kk) {
    const int64_t k = 2 * kk;
    for (int i = 0; i < n; ++i) {
      const uint16_t lo = k < K ? f32_to_bf16(rows[i][k]) : 0;
      const uint16_t hi = k + 1 < K ? f32_to_bf16(rows[i][k + 1]) : 0;
      dst[kk * ld + i] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
  }
}

namespace {

// v[i] holds 16 dwords of row i; afterwards v[j] holds dword j of rows 0..15.
HINA_DQ_FN inline void transpose16(__m512i v[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // v[4q + r] now holds, in 128-bit lane L, dword r of rows 4L'.. of group q
  // (rows 4q..4q+3 within each lane's 4-dword columns): regroup the lanes.
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(v[i], v[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(v[i], v[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(v[i + 8], v[i + 12], 0xdd);
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    v[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    v[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
    v[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
  }
}

}  // namespace

HINA_DQ_FN void vnni_rows16_avx512(const float* const* rows, int n, int64_t K, int64_t Kp, uint32_t* dst,
                                   int64_t ld) {
  const int64_t K32 = K / 32 * 32;
  const __mmask16 store = __mmask16((1u << n) - 1u);
  __m512i v[16];
  for (int64_t k = 0; k < K32; k += 32) {
    for (int i = 0; i < 16; ++i) {
      const float* r = rows[i < n ? i : 0];
      v[i] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(r + k + 16), _mm512_loadu_ps(r + k));
    }
    transpose16(v);  // v[j]: pair k/2 + j of the 16 rows
    for (int j = 0; j < 16; ++j) _mm512_mask_storeu_epi32(dst + (k / 2 + j) * ld, store, v[j]);
  }
  if (K32 < Kp) {  // the last 32 columns: through a zero-padded copy
    alignas(64) float tail[16][32] = {};
    const float* trows[16];
    for (int i = 0; i < n; ++i) {
      std::memcpy(tail[i], rows[i] + K32, size_t(K - K32) * sizeof(float));
      trows[i] = tail[i];
    }
    vnni_rows16_ref(trows, n, 32, 32, dst + (K32 / 2) * ld, ld);
  }
}

}  // namespace hinamoe
