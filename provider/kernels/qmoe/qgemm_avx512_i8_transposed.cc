// The avx512 tier's int8-token kernels for many tokens per call (12 on),
// as qgemm_avx512_f_transposed.cc does for float tokens: the tokens
// transposed once per call at dword granularity (XT8: per 4 of a token's
// codes, 16 tokens; the codes + 128, vpdpbusd's unsigned operand), R rows'
// codes unpacked per chunk into L1 as signed bytes in the tokens' order
// (4-bit: q - 8, the low nibbles of a 128-element group then the high ones,
// which is where Quad32 put the tokens; 8-bit: q - 128), and each 4 codes
// of a row broadcast against 16 tokens per vpdpbusd. Each block's int32
// sums start at -128 x the block's code sum (the tokens' +128), then one
// FMA by s_w x s_x per block adds them to the float totals.
#include "qgemm_avx512.h"

#include <vector>

#include "../aligned_buffer.h"

namespace hinamoe {
namespace qz {
namespace {

constexpr int64_t kTTI8Chunk = 512;  // elements per unpacked chunk (a multiple of 128)

// XT8[d * 16V + t] = token t's codes 4d..4d+3 (as stored), each + 128; the
// tokens from M on: 128 (a zero). XS[b * 16V + t] = token t's block-b scale (0 from M on).
template <int V>
HINAMOE_AVX512_FN void i8_tokens_transposed(const QTokens& x, int64_t M, int64_t K, int32_t* XT8, float* XS) {
  const __m512i flip = _mm512_set1_epi8(char(0x80));
  for (int v = 0; v < V; ++v)
    for (int64_t d = 0; d < K / 4; d += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t t = 16 * v + i;
        const __m512i q = t < M ? _mm512_loadu_si512(x.q + t * x.ld + 4 * d) : _mm512_setzero_si512();
        r[i] = _mm512_castsi512_ps(_mm512_xor_si512(q, flip));
      }
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_store_ps(reinterpret_cast<float*>(XT8 + (d + i) * 16 * V + 16 * v), r[i]);
    }
  for (int64_t b = 0; b < K / 32; ++b)
    for (int64_t t = 0; t < 16 * V; ++t) XS[b * 16 * V + t] = t < M ? x.scale[t * x.scale_stride() + b] : 0.0f;
}

// Row codes of elements [k0, k1) (k0 a multiple of 128, k1 - k0 of 64) as
// signed bytes in the tokens' order into out, and each block's sum of them
// into bsum[(k - k0) / 32].
template <int BITS>
HINAMOE_AVX512_INLINE void unpack_row_i8(const uint8_t* row, int64_t k0, int64_t k1, int8_t* out, int32_t* bsum) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512();
  if constexpr (BITS == 4) {
    const __m512i eight = _mm512_set1_epi8(8);
    for (int64_t k = k0; k < k1; k += 128) {
      const int64_t g = std::min<int64_t>(128, k1 - k);  // a last group of 64: Pair32
      const __mmask64 m = g == 128 ? ~__mmask64(0) : (__mmask64(1) << 32) - 1;
      const __m512i v = _mm512_maskz_loadu_epi8(m, row + k / 2);
      const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      _mm512_mask_storeu_epi8(out + (k - k0), m, _mm512_sub_epi8(lo, eight));
      _mm512_mask_storeu_epi8(out + (k - k0) + g / 2, m, _mm512_sub_epi8(hi, eight));
      // per 64-bit lane the sum of 8 bytes of lo + hi; a block is two lanes
      alignas(64) int64_t q[8];
      _mm512_store_si512(q, _mm512_sad_epu8(_mm512_add_epi8(lo, hi), zero));
      for (int64_t bb = 0; bb < g / 32; ++bb) bsum[(k - k0) / 32 + bb] = int32_t(q[2 * bb] + q[2 * bb + 1]) - 8 * 32;
    }
  } else {
    const __m512i flip = _mm512_set1_epi8(char(0x80));
    for (int64_t k = k0; k < k1; k += 64) {
      const __m512i v = _mm512_loadu_si512(row + k);
      _mm512_storeu_si512(out + (k - k0), _mm512_xor_si512(v, flip));
      alignas(64) int64_t q[8];
      _mm512_store_si512(q, _mm512_sad_epu8(v, zero));
      for (int bb = 0; bb < 2; ++bb) bsum[(k - k0) / 32 + bb] = int32_t(q[4 * bb] + q[4 * bb + 1] + q[4 * bb + 2] + q[4 * bb + 3]) - 128 * 32;
    }
  }
}

// The first dwords of a block's two runs of 4 (chunk-relative), block j of a
// chunk of J elements: 4-bit, in its group's low then high half; 8-bit, k order.
template <int BITS>
HINAMOE_AVX512_INLINE void block_runs(int64_t j, int64_t J, int64_t* a0, int64_t* a1) {
  if constexpr (BITS == 4) {
    const int64_t g0 = j / 4 * 128, half = std::min<int64_t>(128, J - g0) / 8;  // dwords per half group
    *a0 = g0 / 4 + 4 * (j % 4);
    *a1 = *a0 + half;
  } else {
    *a0 = 8 * j;
    *a1 = 8 * j + 4;
  }
}

// C[(r V + v) 16 ..] += rows' x tokens' dots over the chunk's J elements (blocks of 32).
template <int BITS, DType SDT, int R, int V>
HINAMOE_AVX512_VNNI_FN void tt_i8_chunk(const int8_t* Wq, const int32_t* bsum, const void* const* srow, int64_t b0,
                            const int32_t* XT8, const float* XS, int64_t J, float* C, bool first) {
  __m512 tot[R][V];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) tot[r][v] = first ? _mm512_setzero_ps() : _mm512_load_ps(C + (r * V + v) * 16);
  for (int64_t j = 0; j < J / 32; ++j) {
    int64_t a[2];
    block_runs<BITS>(j, J, &a[0], &a[1]);
    __m512i acc[R][V];
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_set1_epi32(-128 * bsum[r * (kTTI8Chunk / 32) + j]);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const int64_t d = a[h] + i;
        __m512i xv[V];
#pragma GCC unroll 2
        for (int v = 0; v < V; ++v) xv[v] = _mm512_load_si512(XT8 + d * 16 * V + 16 * v);
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
          int32_t wq;
          __builtin_memcpy(&wq, Wq + r * kTTI8Chunk + 4 * d, 4);
          const __m512i wb = _mm512_set1_epi32(wq);
#pragma GCC unroll 2
          for (int v = 0; v < V; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], xv[v], wb);
        }
      }
    __m512 sx[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) sx[v] = _mm512_load_ps(XS + (b0 + j) * 16 * V + 16 * v);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const __m512 sw = _mm512_set1_ps(row_scale<SDT>(srow[r], b0 + j));
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v)
        tot[r][v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][v]), _mm512_mul_ps(sx[v], sw), tot[r][v]);
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm512_store_ps(C + (r * V + v) * 16, tot[r][v]);
}

// Rows [n, n + R) against the M (<= 16 V) transposed tokens: Y[t * ldy + r].
template <int BITS, DType SDT, int R, int V>
HINAMOE_AVX512_VNNI_FN void tt_i8_rows(const QWeight& w, int64_t n, const int32_t* XT8, const float* XS, int64_t M, float* Y,
                           int64_t ldy, int8_t* Wq, int32_t* bsum, float* C) {
  const void* srow[R];
  for (int r = 0; r < R; ++r) srow[r] = scale_ptr(w, n + r, 0, SDT == DType::F32 ? 4 : 2);
  for (int64_t kc = 0; kc < w.K; kc += kTTI8Chunk) {
    const int64_t kz = std::min(w.K, kc + kTTI8Chunk);
    for (int r = 0; r < R; ++r) {
      prefetch_chunk_ahead<BITS, SDT>(w, n, r, R, kc, kTTI8Chunk);
      unpack_row_i8<BITS>(w.codes + (n + r) * w.row_stride(), kc, kz, Wq + r * kTTI8Chunk,
                          bsum + r * (kTTI8Chunk / 32));
    }
    tt_i8_chunk<BITS, SDT, R, V>(Wq, bsum, srow, kc / 32, XT8 + kc / 4 * 16 * V, XS, kz - kc, C, kc == 0);
  }
  store_transposed<R, V>(C, M, Y, ldy);
}

template <int BITS, DType SDT, int V>
void tt_i8_range(const QWeight& w, int64_t n0, int64_t n1, const int32_t* XT8, const float* XS, int64_t M, float* Y,
                 int64_t ldy, int8_t* Wq, int32_t* bsum, float* C) {
  constexpr int R = V == 1 ? 12 : 6;  // R x V int32 sums + as many float totals
  row_blocks<R>(n0, n1, [&](auto rr, int64_t n) {
    tt_i8_rows<BITS, SDT, decltype(rr)::value, V>(w, n, XT8, XS, M, Y + (n - n0), ldy, Wq, bsum, C);
  });
}

template <int BITS, DType SDT>
void qgemm_i8_tt(const QWeight& w, int64_t n0, int64_t n1, const QTokens& X, int64_t M, float* Y, int64_t ldy) {
  // Per thread, reused across calls (at most K/4 x 32 dwords + 12 x 512 bytes).
  thread_local AlignedVector<int32_t> xt8, bsum(size_t(12 * kTTI8Chunk / 32));
  thread_local AlignedVector<float> xs, c(size_t(12 * 16));
  thread_local AlignedVector<int8_t> wq(size_t(12 * kTTI8Chunk));
  for (int64_t g = 0; g < M; g += 32) {
    const int64_t Mg = std::min<int64_t>(32, M - g);
    const int V = Mg > 16 ? 2 : 1;
    if (xt8.size() < size_t(w.K / 4 * 16 * V)) xt8.resize(size_t(w.K / 4 * 16 * V));
    if (xs.size() < size_t(w.K / 32 * 16 * V)) xs.resize(size_t(w.K / 32 * 16 * V));
    QTokens x = X;
    x.q += g * X.ld;
    x.scale += g * X.scale_stride();
    if (V == 1) {
      i8_tokens_transposed<1>(x, Mg, w.K, xt8.data(), xs.data());
      tt_i8_range<BITS, SDT, 1>(w, n0, n1, xt8.data(), xs.data(), Mg, Y + g * ldy, ldy, wq.data(), bsum.data(), c.data());
    } else {
      i8_tokens_transposed<2>(x, Mg, w.K, xt8.data(), xs.data());
      tt_i8_range<BITS, SDT, 2>(w, n0, n1, xt8.data(), xs.data(), Mg, Y + g * ldy, ldy, wq.data(), bsum.data(), c.data());
    }
  }
}

}  // namespace

void i8_transposed(const QWeight& w, int64_t n0, int64_t n1, const QTokens& X, int64_t M, float* Y, int64_t ldy) {
  with_weight_kind(w, [&](auto bits, auto sdt, auto) {
    qgemm_i8_tt<decltype(bits)::value, decltype(sdt)::value>(w, n0, n1, X, M, Y, ldy);
  });
}

}  // namespace qz
}  // namespace hinamoe
