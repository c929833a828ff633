// The avx512 tier's float-token kernels for many tokens per call (12 on).
// From kTTTokens tokens on, FMAs bound the float path, and the tiles of
// qgemm_avx512_f.cc spend issue slots on horizontal sums, a table per (row,
// block) per tile and a token load per FMA (in-cache: ~40% of the FMA peak
// at 16 tokens). Here each call transposes its tokens once ([K][16 V]: V
// vectors of 16 tokens), and per row block dequantises R rows x kTTChunk
// columns into an L1 buffer, in the tokens' order; every weight is then
// broadcast against 16 tokens at a time into R x V accumulators: no sums
// across lanes, one token load per vector and column. The outputs are
// transposed back when they are stored.
#include "qgemm_avx512.h"

#include <vector>

#include "../aligned_buffer.h"

namespace hinamoe {
namespace qz {
namespace {

constexpr int64_t kTTChunk = tuning::kTransposedChunkAvx512;  // columns per dequantised block

// XT[k * 16V + t] = X[t * ldx + k] for t < M (M <= 16 V), 0 for t >= M; K % 16 == 0.
template <int V>
HINAMOE_AVX512_FN void transpose_tokens(const float* X, int64_t ldx, int64_t M, int64_t K, float* XT) {
  for (int v = 0; v < V; ++v)
    for (int64_t k = 0; k < K; k += 16) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t t = 16 * v + i;
        r[i] = t < M ? _mm512_loadu_ps(X + t * ldx + k) : _mm512_setzero_ps();
      }
      transpose16(r);
      for (int i = 0; i < 16; ++i) _mm512_store_ps(XT + (k + i) * 16 * V + 16 * v, r[i]);
    }
}

// 32 weights of row from element k on, dequantised by tbl / (sv, zv), stored in
// the tokens' order (EvenOdd32 for 4-bit, k order for 8-bit).
template <int BITS>
HINAMOE_AVX512_INLINE void dequant32(const uint8_t* row, int64_t k, __m512 tbl, __m512 sv, __m512 zv, float* out) {
  if constexpr (BITS == 4) {
    const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k / 2)));
    _mm512_store_ps(out, _mm512_permutexvar_ps(d, tbl));
    _mm512_store_ps(out + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), tbl));
  } else {
    for (int h = 0; h < 2; ++h) {
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k + 16 * h));
      _mm512_store_ps(out + 16 * h, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(c)), sv, zv));
    }
  }
}

// Block b's factors: 4-bit, the table (q - zp) * s of the 16 codes; 8-bit, s and -zp * s.
template <int BITS, DType SDT, bool ZP>
HINAMOE_AVX512_INLINE void dequant_factors(const QWeight& w, const void* srow, int64_t n, int64_t b, __m512 codes, __m512& tbl,
                               __m512& sv, __m512& zv) {
  const float s = row_scale<SDT>(srow, b);
  sv = _mm512_set1_ps(s);
  if constexpr (BITS == 4) {
    if constexpr (ZP) tbl = _mm512_mul_ps(_mm512_sub_ps(codes, _mm512_set1_ps(float(w.zero_point(n, b)))), sv);
    else tbl = _mm512_mul_ps(codes, sv);
  } else {
    zv = _mm512_set1_ps(-float(zero_at<8, ZP>(w, n, b)) * s);
  }
}

// Row n's columns [k0, k1) (multiples of 32) dequantised into out[0, k1 - k0).
// 4-bit: a table of (q - zp) * s per block; 8-bit: q * s - zp * s.
template <int BITS, DType SDT, bool ZP, bool B32>
HINAMOE_AVX512_INLINE void dequant_row(const QWeight& w, int64_t n, int64_t k0, int64_t k1, float* out) {
  const uint8_t* row = w.codes + n * w.row_stride();
  const void* srow = scale_ptr(w, n, 0, SDT == DType::F32 ? 4 : 2);
  const __m512 codes = ZP ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                          : _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  __m512 tbl = codes, sv = codes, zv = codes;
  if constexpr (B32) {
    for (int64_t k = k0; k < k1; k += 32) {
      dequant_factors<BITS, SDT, ZP>(w, srow, n, k >> 5, codes, tbl, sv, zv);
      dequant32<BITS>(row, k, tbl, sv, zv, out + (k - k0));
    }
  } else {
    for (int64_t b = k0 / w.block; b * w.block < k1; ++b) {
      dequant_factors<BITS, SDT, ZP>(w, srow, n, b, codes, tbl, sv, zv);
      const int64_t kz = std::min(k1, w.block_end(b));
      for (int64_t k = std::max(k0, b * w.block); k < kz; k += 32) dequant32<BITS>(row, k, tbl, sv, zv, out + (k - k0));
    }
  }
}

// acc[r][v] += sum over j < J of Wd[r * kTTChunk + j] * XT[j * 16V + 16v ..]
// (acc kept in C between chunks: [R][V] vectors).
template <int R, int V>
HINAMOE_AVX512_FN void tt_chunk(const float* Wd, const float* XT, int64_t J, float* C, bool first) {
  __m512 acc[R][V];  // unrolled, so the accumulators stay in registers
#pragma GCC unroll 24
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = first ? _mm512_setzero_ps() : _mm512_load_ps(C + (r * V + v) * 16);
  for (int64_t j = 0; j < J; ++j) {
    __m512 x[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) x[v] = _mm512_load_ps(XT + j * 16 * V + 16 * v);
#pragma GCC unroll 24
    for (int r = 0; r < R; ++r) {
      const __m512 wb = _mm512_set1_ps(Wd[r * kTTChunk + j]);
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(wb, x[v], acc[r][v]);
    }
  }
#pragma GCC unroll 24
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm512_store_ps(C + (r * V + v) * 16, acc[r][v]);
}

// Rows [n, n + R) against the M (<= 16 V) tokens of XT: Y[t * ldy + r] for t < M.
template <int BITS, DType SDT, bool ZP, bool B32, int R, int V>
HINAMOE_AVX512_FN void tt_rows(const QWeight& w, int64_t n, const float* XT, int64_t M, float* Y, int64_t ldy, float* Wd,
                   float* C) {
  for (int64_t kc = 0; kc < w.K; kc += kTTChunk) {
    const int64_t kz = std::min(w.K, kc + kTTChunk);
    for (int r = 0; r < R; ++r) {
      prefetch_chunk_ahead<BITS, SDT>(w, n, r, R, kc, kTTChunk);
      dequant_row<BITS, SDT, ZP, B32>(w, n + r, kc, kz, Wd + r * kTTChunk);
    }
    tt_chunk<R, V>(Wd, XT + kc * 16 * V, kz - kc, C, kc == 0);
  }
  store_transposed<R, V>(C, M, Y, ldy);
}

template <int BITS, DType SDT, bool ZP, int V>
void tt_range(const QWeight& w, int64_t n0, int64_t n1, const float* XT, int64_t M, float* Y, int64_t ldy,
              float* Wd, float* C) {
  constexpr int R = V == 1 ? 24 : 12;  // R x V accumulators (24) + V token vectors + a weight
  auto run = [&](auto b32) {
    row_blocks<R>(n0, n1, [&](auto rr, int64_t n) {
      tt_rows<BITS, SDT, ZP, decltype(b32)::value, decltype(rr)::value, V>(w, n, XT, M, Y + (n - n0), ldy, Wd, C);
    });
  };
  if (w.block == 32) run(std::true_type());
  else run(std::false_type());
}

template <int BITS, DType SDT, bool ZP>
void qgemm_f_tt(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
                int64_t ldy) {
  // Per thread, reused across calls (at most K x 32 tokens + 24 x 1 KiB).
  thread_local AlignedVector<float> xt, wd(size_t(24 * kTTChunk)), c(size_t(24 * 16));
  for (int64_t g = 0; g < M; g += 32) {
    const int64_t Mg = std::min<int64_t>(32, M - g);
    const int V = Mg > 16 ? 2 : 1;
    if (xt.size() < size_t(w.K * 16 * V)) xt.resize(size_t(w.K * 16 * V));
    if (V == 1) {
      transpose_tokens<1>(X + g * ldx, ldx, Mg, w.K, xt.data());
      tt_range<BITS, SDT, ZP, 1>(w, n0, n1, xt.data(), Mg, Y + g * ldy, ldy, wd.data(), c.data());
    } else {
      transpose_tokens<2>(X + g * ldx, ldx, Mg, w.K, xt.data());
      tt_range<BITS, SDT, ZP, 2>(w, n0, n1, xt.data(), Mg, Y + g * ldy, ldy, wd.data(), c.data());
    }
  }
}

}  // namespace

void f_transposed(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
                  int64_t ldy) {
  with_weight_kind(w, [&](auto bits, auto sdt, auto zp) {
    qgemm_f_tt<decltype(bits)::value, decltype(sdt)::value, decltype(zp)::value>(w, n0, n1, X, ldx, M, Y, ldy);
  });
}

}  // namespace qz
}  // namespace hinamoe
