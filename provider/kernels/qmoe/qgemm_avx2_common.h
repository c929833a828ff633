// Register-level helpers the AVX2 quantised kernels share (qgemm_avx2.cc and
// the int8-token kernel body qgemm_i8_avx2.inc, compiled once per dot
// instruction). Every function carries target("avx2,fma,f16c") and is
// always inlined into a kernel whose target includes those features, so no
// AVX2 body escapes into baseline code.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "../isa_target.h"
#include "qmoe_ffn.h"

namespace hinamoe {
namespace qavx2 {

#ifndef HINAMOE_QPF_BYTES
#define HINAMOE_QPF_BYTES 1024
#endif
constexpr int64_t kPrefetchBytes = HINAMOE_QPF_BYTES;  // software prefetch distance on each row, at least
#ifndef HINAMOE_QPF_TILES
#define HINAMOE_QPF_TILES 2
#endif
// The codes' and scales' prefetch goes to L2 (T1): on Zen 5 (2026-12-04,
// hina-bench ffn A/B, 2 threads, Qwen3-30B-A3B / gpt-oss-20b, int4/int8,
// 1-2 tokens per expert) the QMoE layers took 8-40% less time than with T0
// on the avx512 kernels; on the avx2 kernels x CPU EP rose at most points
// (gpt-oss-20b at 2 tokens within the noise). Probably T0 requests queue
// on L1's few miss buffers (untested: no counters on that VM).
#ifndef HINAMOE_QPF_HINT
#define HINAMOE_QPF_HINT _MM_HINT_T1
#endif
// Packed rows are short (a 4-bit row of K = 2048 is 1 KiB), too short for
// the hardware prefetcher to learn each one, so the kernels prefetch the same
// offset HINAMOE_QPF_TILES micro-tiles (of R rows of rb bytes) further down
// the row block, which is contiguous in memory.
inline int64_t prefetch_ahead(int64_t rb, int R) {
  const int64_t d = HINAMOE_QPF_TILES * R * rb;
  return d > kPrefetchBytes ? d : kPrefetchBytes;
}

// Rows are handled in blocks of kRowBlock: within a block every token tile
// (up to 3 tokens, or 4 where a kernel takes them; rows as many as the
// registers allow: 4, 3, 2 or 2) runs, so the block's rows come from memory
// once and stay in L1 for the later token tiles instead of streaming the
// whole row range once per token tile.
constexpr int64_t kRowBlock = 12;  // a multiple of 4, 3 and 2

// Runs a token tile of T tokens (1..kMaxT) over the rows [n, r1): micro-tiles
// of the rows the registers allow for T, the rest one row at a time, as
// micro(std::integral_constant<int, R>, std::integral_constant<int, T>, n).
template <int kMaxT, class Micro>
inline void tile_rows(int64_t T, int64_t n, int64_t r1, Micro&& micro) {
  auto rows = [&](auto r, auto t) {
    for (; n + decltype(r)::value <= r1; n += decltype(r)::value) micro(r, t, n);
    for (; n < r1; ++n) micro(std::integral_constant<int, 1>{}, t, n);
  };
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  using I3 = std::integral_constant<int, 3>;
  using I4 = std::integral_constant<int, 4>;
  if (T == 1) return rows(I4{}, I1{});
  if (T == 2) return rows(I3{}, I2{});
  if constexpr (kMaxT >= 4)
    if (T == 4) return rows(I2{}, I4{});
  rows(I2{}, I3{});
}

HINAMOE_AVX2_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <DType SDT>
HINAMOE_AVX2_INLINE float scale_at(const QWeight& w, int64_t n, int64_t b) {
  const int64_t i = n * w.scale_stride() + b;
  if constexpr (SDT == DType::F32) return static_cast<const float*>(w.scales)[i];
  else if constexpr (SDT == DType::F16) return _cvtsh_ss(static_cast<const uint16_t*>(w.scales)[i]);
  else return bf16_to_f32(static_cast<const uint16_t*>(w.scales)[i]);
}

// The scales of row n from block b on into L2 (a cache line of f32 scales
// covers 16 blocks): beside each row's codes they are a second stream, which
// the hardware prefetcher does not follow either. Where micro-kernels call
// this HINAMOE_QPF_TILES tiles ahead as for the codes, 1-token QMoE streams
// ~1.4x faster from DRAM (Zen 5, 2 threads, C++ A/B).
template <DType SDT>
HINAMOE_AVX2_INLINE void prefetch_scales(const QWeight& w, int64_t n, int64_t b) {
  const size_t es = SDT == DType::F32 ? 4 : 2;
  _mm_prefetch(static_cast<const char*>(w.scales) + size_t(n * w.scale_stride() + b) * es, HINAMOE_QPF_HINT);
}

// 8 scales of row n from block b on, as floats.
template <DType SDT>
HINAMOE_AVX2_INLINE __m256 scales8(const QWeight& w, int64_t n, int64_t b) {
  const int64_t i = n * w.scale_stride() + b;
  if constexpr (SDT == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(w.scales) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w.scales) + i));
    if constexpr (SDT == DType::F16) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// sum over blocks b of scale(n, b) * v[b]: the zero point's share of a row
// when it is the same for every block (v = token scale x code sum per block).
template <DType SDT>
HINAMOE_AVX2_INLINE float dot_scales(const QWeight& w, int64_t n, const float* v) {
  __m256 acc = _mm256_setzero_ps();
  int64_t b = 0;
  for (; b + 8 <= w.nb; b += 8) acc = _mm256_fmadd_ps(scales8<SDT>(w, n, b), _mm256_loadu_ps(v + b), acc);
  float s = hsum(acc);
  for (; b < w.nb; ++b) s += scale_at<SDT>(w, n, b) * v[b];
  return s;
}

// The zero point of (row n, block b); without zero points the constant 2^(bits-1).
template <int BITS, bool ZP>
HINAMOE_AVX2_INLINE int zero_at(const QWeight& w, int64_t n, int64_t b) {
  if constexpr (!ZP) return 1 << (BITS - 1);
  else return w.zero_point(n, b);
}

// 8 codes of a row starting at element k (k a multiple of 8) as int32.
template <int BITS>
HINAMOE_AVX2_INLINE __m256i codes8(const uint8_t* row, int64_t k) {
  if constexpr (BITS == 4) {
    int32_t d;
    __builtin_memcpy(&d, row + k / 2, 4);
    const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(d), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    return _mm256_and_si256(v, _mm256_set1_epi32(0xF));
  } else {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k)));
  }
}

// 32 4-bit codes at element k (a multiple of 32) as bytes, in the even_odd
// order of the tokens: the low nibbles of each 8 bytes, then the high ones.
HINAMOE_AVX2_INLINE __m256i nibbles32(const uint8_t* row, int64_t k) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2));
  const __m128i m = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
  return _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi));
}

// The same for 16 codes, in the low lane.
HINAMOE_AVX2_INLINE __m256i nibbles16(const uint8_t* row, int64_t k) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k / 2));
  const __m128i m = _mm_set1_epi8(0x0F);
  return _mm256_zextsi128_si256(_mm_unpacklo_epi64(_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m)));
}

}  // namespace qavx2
}  // namespace hinamoe
