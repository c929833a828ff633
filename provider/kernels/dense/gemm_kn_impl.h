// gemm_kn (tier.h) on one ISA's vectors: one source for every tier, after
// tinyBLAS. The including file defines KN_INLINE (its ISA's always-inline
// target attribute) and passes vector traits V:
//   Reg, kLanes, load<DT>(const Elem<DT>::T*) (kLanes weights as float),
//   zero(), set1(float), fma(a, b, c) = a*b + c, loadf(const float*),
//   storef(float*, Reg).
//
// ONNX's MatMul weight is [K, N]: a row of W holds one input feature for
// every output. So the tile is an outer product, not a dot product: per
// weight row k, kLanes*NV outputs are loaded (and widened) once and each of
// the MR tokens adds x[m, k] times them to its accumulators. The tokens are
// read where they lie (one broadcast per token and row). Rows go a band at
// a time across all of the call's columns, so each row is read front to
// back, a band of rows in flight, and the accumulators of a tile live in
// registers for a whole band. (The op's driver, matmul.cc, hands a thread
// whole rows when there are few tokens: then a band is one contiguous
// block of W.)
#pragma once

#include <algorithm>
#include <cstdint>

#include "../dtype.h"

namespace hinamoe {
namespace kn_impl {

constexpr int kMaxTokens = 8;        // tokens per register tile
// Weight rows per pass over the columns: few for a few tokens (a pass
// streams its rows from DRAM), more for more tokens (each pass loads and
// stores every tile's accumulators once; docs/kernels.md, "Dense MatMul").
constexpr int64_t band_rows(int64_t M) { return M <= 8 ? 8 : 32; }
constexpr int64_t kTokenChunk = 64;  // tokens whose accumulators a band pass updates
// Each row is prefetched this far ahead of the tile's loads, into L2 (the
// hardware prefetchers alone left a few-token call at ~50-70% of the read
// bandwidth: docs/kernels.md, "Dense MatMul").
constexpr int64_t kPrefetchBytes = 512;

// Vectors of columns per tile: fewer tokens, more columns (about 8-16
// accumulators either way).
constexpr int vectors_for(int MR) { return MR == 1 ? 8 : MR == 2 ? 6 : MR <= 4 ? 4 : 2; }

template <class V, DType DT, int MR, int NV>
KN_INLINE void tile(const typename Elem<DT>::T* w, int64_t ldw, int64_t rows, const float* x, int64_t ldx, float* y,
                    int64_t ldy, bool first) {
  constexpr int L = V::kLanes;
  typename V::Reg acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[m][v] = first ? V::zero() : V::loadf(y + m * ldy + v * L);
  for (int64_t k = 0; k < rows; ++k) {
    const typename Elem<DT>::T* wr = w + k * ldw;
    const char* pf = reinterpret_cast<const char*>(wr) + kPrefetchBytes;
    for (int64_t b = 0; b < int64_t(NV * L * sizeof(*wr)); b += 64) __builtin_prefetch(pf + b, 0, 2);
    typename V::Reg wv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) wv[v] = V::template load<DT>(wr + v * L);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const typename V::Reg b = V::set1(x[m * ldx + k]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[m][v] = V::fma(b, wv[v], acc[m][v]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) V::storef(y + m * ldy + v * L, acc[m][v]);
}

// The loops below, for any kind of tile: Tiles has the weight and token
// element types WT and XT, kLanes, tile<MR, NV>(w, ldw, rows, x, ldx, y,
// ldy, first) (tile() above, or the bfloat16 pair tiles of
// gemm_kn_bf16_avx512.cc) and w_at / x_at (one element as float, for the
// columns left over).
template <class V, DType DT>
struct FloatTiles {
  using WT = typename Elem<DT>::T;
  using XT = float;
  static constexpr int kLanes = V::kLanes;
  template <int MR, int NV>
  static KN_INLINE void tile(const WT* w, int64_t ldw, int64_t rows, const float* x, int64_t ldx, float* y,
                             int64_t ldy, bool first) {
    kn_impl::tile<V, DT, MR, NV>(w, ldw, rows, x, ldx, y, ldy, first);
  }
  static float w_at(const WT* w, int64_t i) { return load_as_f32(w, i, DT); }
  static float x_at(const float* x, int64_t i) { return x[i]; }
};

// One band of `rows` weight rows over columns [n0, n1) for MR tokens: wide
// tiles, then one vector at a time, then single columns.
template <class Tiles, int MR>
KN_INLINE void band(const typename Tiles::WT* w, int64_t ldw, int64_t rows, int64_t n0, int64_t n1,
                    const typename Tiles::XT* x, int64_t ldx, float* y, int64_t ldy, bool first) {
  constexpr int L = Tiles::kLanes, NV = vectors_for(MR);
  int64_t c = n0;
  for (; c + NV * L <= n1; c += NV * L)
    Tiles::template tile<MR, NV>(w + c, ldw, rows, x, ldx, y + (c - n0), ldy, first);
  for (; c + L <= n1; c += L) Tiles::template tile<MR, 1>(w + c, ldw, rows, x, ldx, y + (c - n0), ldy, first);
  for (; c < n1; ++c)
    for (int m = 0; m < MR; ++m) {
      float s = first ? 0.0f : y[m * ldy + (c - n0)];
      for (int64_t k = 0; k < rows; ++k) s += Tiles::x_at(x, m * ldx + k) * Tiles::w_at(w, k * ldw + c);
      y[m * ldy + (c - n0)] = s;
    }
}

// gemm_kn over chunks of tokens, bands of rows and tiles of MR tokens.
template <class Tiles>
KN_INLINE void gemm_kn_loops(const typename Tiles::WT* W, int64_t ldw, int64_t K, int64_t n0, int64_t n1,
                             const typename Tiles::XT* X, int64_t ldx, int64_t M, float* Y, int64_t ldy) {
  for (int64_t m0 = 0; m0 < M; m0 += kTokenChunk) {
    const int64_t mc = std::min(kTokenChunk, M - m0);
    const int64_t band_k = band_rows(M);
    for (int64_t k0 = 0; k0 < K; k0 += band_k) {
      const int64_t rows = std::min(band_k, K - k0);
      const bool first = k0 == 0;
      for (int64_t mb = m0; mb < m0 + mc; mb += kMaxTokens) {
        const auto* x = X + mb * ldx + k0;
        float* y = Y + mb * ldy;
        const auto* w = W + k0 * ldw;
        switch (std::min<int64_t>(kMaxTokens, m0 + mc - mb)) {
          case 1: band<Tiles, 1>(w, ldw, rows, n0, n1, x, ldx, y, ldy, first); break;
          case 2: band<Tiles, 2>(w, ldw, rows, n0, n1, x, ldx, y, ldy, first); break;
          case 3: band<Tiles, 3>(w, ldw, rows, n0, n1, x, ldx, y, ldy, first); break;
          case 4: band<Tiles, 4>(w, ldw, rows, n0, n1, x, ldx, y, ldy, first); break;
          case 5: band<Tiles, 5>(w, ldw, rows, n0, n1, x, ldx, y, ldy, first); break;
          case 6: band<Tiles, 6>(w, ldw, rows, n0, n1, x, ldx, y, ldy, first); break;
          case 7: band<Tiles, 7>(w, ldw, rows, n0, n1, x, ldx, y, ldy, first); break;
          default: band<Tiles, 8>(w, ldw, rows, n0, n1, x, ldx, y, ldy, first); break;
        }
      }
    }
  }
}

template <class V, DType DT>
KN_INLINE void gemm_kn(const void* W, int64_t ldw, int64_t K, int64_t n0, int64_t n1, const float* X, int64_t ldx,
                       int64_t M, float* Y, int64_t ldy) {
  gemm_kn_loops<FloatTiles<V, DT>>(static_cast<const typename Elem<DT>::T*>(W), ldw, K, n0, n1, X, ldx, M, Y, ldy);
}

}  // namespace kn_impl
}  // namespace hinamoe
