// The two bf16 operands of the tile GEMM (qgemm_tiles.h), each a scalar
// version (the emulator's, and the reference) and an AVX512-BF16 one that
// writes the same bytes: weight rows dequantised into tile-major panels
// ((float(q) - float(zp)) * scale in float32, rounded to bf16, RNE), and
// token rows into VNNI blocks.
//
// GCC 12 warns about the self-initialised _mm512_undefined_*() inside some
// AVX-512 intrinsics once inlined (a false positive in the header; see
// gemm_rows_avx512.cc).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

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
inline uint16_t& at(uint16_t* panel, int r, int64_t k) { return panel[(k / 32) * 1024 + r * 32 + (tile_slot(k) & 31)]; }

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

// 32 codes from k (k a multiple of 32, k + 32 <= K) as floats: the even
// elements k, k+2, .., k+30 and the odd ones.
HINA_DQ_FN inline void codes32(const uint8_t* row, int bits, int64_t k, __m512* even, __m512* odd) {
  __m128i a, b;
  if (bits == 4) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2));
    const __m128i m = _mm_set1_epi8(0x0f);
    a = _mm_and_si128(v, m);
    b = _mm_and_si128(_mm_srli_epi16(v, 4), m);
  } else {  // even bytes of each 128-bit lane, then odd ones; then the lanes' halves together
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k));
    const __m256i sel = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m256i eo = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, sel), 0xd8);
    a = _mm256_castsi256_si128(eo);
    b = _mm256_extracti128_si256(eo, 1);
  }
  *even = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(a));
  *odd = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
}

}  // namespace

// 4-bit rows with blocks of 32 or more (or row-wise): the 16 values of a
// block's codes are a table of 16 bf16, looked up for 32 codes at a time
// (vpermw), instead of converting and scaling every element.
HINA_DQ_FN void dequant_rows_bf16_4bit_table(const QWeight& w, int64_t n, int rows, int64_t Kp, uint16_t* panel) {
  const int64_t K32 = w.K / 32 * 32;
  const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m256i m = _mm256_set1_epi16(0x0f);
  // float32 scales without zero points (what exporters write): read in
  // place, the centred codes precomputed; else through QWeight's accessors.
  const bool plain = w.scale_dtype == DType::F32 && w.zero_points == nullptr;
  const __m512 centred = _mm512_sub_ps(iota, _mm512_set1_ps(float(1 << (w.bits - 1))));
  const float* scales = static_cast<const float*>(w.scales) + n * w.scale_stride();
  const int64_t sld = w.scale_stride(), cld = w.row_stride();
  const uint8_t* codes = w.codes + n * cld;
  // Column blocks outer, rows inner: the panel is written in order (one
  // 2 KiB block of 32 rows at a time); the block of k kept by counting.
  int64_t b = -1, bend = 0;
  for (int64_t k = 0; k < K32; k += 32) {
    if (k >= bend) {
      ++b;
      bend += w.block;
    }
    uint16_t* out = panel + (k / 32) * 1024;
    for (int r = 0; r < rows; ++r) {
      const __m512 v = plain ? _mm512_mul_ps(centred, _mm512_set1_ps(scales[r * sld + b]))
                             : _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(float(w.zero_point(n + r, b)))),
                                             _mm512_set1_ps(w.scale(n + r, b)));
      const __m512i table = _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(v));
      // Codes as words: low nibbles (even elements) in slots 0-15, high ones in 16-31.
      const __m256i c = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + r * cld + k / 2)));
      const __m512i idx = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(c, m)), _mm256_srli_epi16(c, 4), 1);
      _mm512_storeu_si512(out + r * 32, _mm512_permutexvar_epi16(idx, table));
    }
  }
  for (int r = 0; r < rows; ++r) {
    for (int64_t k = K32; k < w.K; ++k) {  // a K that is not a multiple of 32
      const int64_t kb = k / w.block;
      at(panel, r, k) = f32_to_bf16((float(w.code(n + r, k)) - float(w.zero_point(n + r, kb))) * w.scale(n + r, kb));
    }
    for (int64_t k = w.K; k < Kp; ++k) at(panel, r, k) = 0;
  }
}

HINA_DQ_FN void dequant_rows_bf16_avx512(const QWeight& w, int64_t n, int rows, int64_t Kp, uint16_t* panel) {
  if (w.bits == 4 && w.block >= 32) return dequant_rows_bf16_4bit_table(w, n, rows, Kp, panel);
  const int64_t K32 = w.K / 32 * 32;
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = w.codes + (n + r) * w.row_stride();
    for (int64_t k = 0; k < K32; k += 32) {
      __m512 even, odd;
      codes32(row, w.bits, k, &even, &odd);
      const int64_t b0 = w.block == 16 ? k >> 4 : w.block == 32 ? k >> 5 : k / w.block;
      __m512 s = _mm512_set1_ps(w.scale(n + r, b0)), z = _mm512_set1_ps(float(w.zero_point(n + r, b0)));
      if (w.block == 16) {  // lanes 8-15 of both halves (k+16..k+31) are the next block's
        const __mmask16 upper = 0xff00;
        s = _mm512_mask_mov_ps(s, upper, _mm512_set1_ps(w.scale(n + r, b0 + 1)));
        z = _mm512_mask_mov_ps(z, upper, _mm512_set1_ps(float(w.zero_point(n + r, b0 + 1))));
      }
      even = _mm512_mul_ps(_mm512_sub_ps(even, z), s);
      odd = _mm512_mul_ps(_mm512_sub_ps(odd, z), s);
      _mm512_storeu_si512(&at(panel, r, k), (__m512i)_mm512_cvtne2ps_pbh(odd, even));
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
  for (int64_t k = 0; k < Kp; ++k) {
    const int64_t slot = tile_slot(k);
    for (int i = 0; i < n; ++i) {
      uint16_t* pair = reinterpret_cast<uint16_t*>(dst + (slot / 2) * ld + i);
      pair[slot & 1] = k < K ? f32_to_bf16(rows[i][k]) : 0;
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
  // Even columns of a and b (16 each) and the odd ones: the slot order.
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t k = 0; k < K32; k += 32) {
    for (int i = 0; i < 16; ++i) {
      const float* r = rows[i < n ? i : 0];
      const __m512 a = _mm512_loadu_ps(r + k), b = _mm512_loadu_ps(r + k + 16);
      v[i] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_permutex2var_ps(a, odd, b), _mm512_permutex2var_ps(a, even, b));
    }
    transpose16(v);  // v[j]: VNNI row k/2 + j of the 16 rows
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
