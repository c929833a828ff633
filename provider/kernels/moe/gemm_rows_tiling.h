// The blocking the SIMD tiers' gemm_rows share (avx2, avx512): token tiles
// of 1..4, row blocks kept cache-resident while every tile passes over
// them, and long rows cut into K slices when there are several tiles. Each
// tier supplies its own rows_loop (its micro-kernels and row counts); this
// holds no ISA code.
#pragma once

#include <algorithm>
#include <cstdint>

namespace hinamoe {

// Rows [n0, n1) of W (K columns; rows_loop knows their stride) against the M
// tokens of X (float, or bfloat16 for the pair kernels): rows_loop(T, w, kc, nb, nbe, x, y, acc) runs rows [nb, nbe)
// against the T tokens at x over the kc columns w and x point at, writing
// (acc: adding to) y. Row blocks are multiples of row_multiple.
template <class E, class XT, class RowsLoop>
inline void tile_gemm_rows(const E* W, int64_t K, int64_t n0, int64_t n1, const XT* X, int64_t ldx,
                           int64_t M, float* Y, int64_t ldy, int64_t row_multiple, RowsLoop&& rows_loop) {
  if (n1 <= n0 || M <= 0) return;
  // Token tiles of 1..4, as even as possible (M=5 -> 3+2, M=7 -> 4+3, M=9 -> 3+3+3):
  // small tiles waste loads, so avoid a lone 1-token tile.
  const int64_t ntiles = (M + 3) / 4;
  // Rows per block: their weights stay cache-resident while all token tiles
  // pass over them, so DRAM sees each weight row once per call.
  const int64_t row_bytes = K * int64_t(sizeof(E));
  const int64_t block_rows =
      ntiles == 1 ? (n1 - n0)
                  : std::max<int64_t>(row_multiple,
                                      ((96 * 1024) / std::max<int64_t>(row_bytes, 1)) / row_multiple * row_multiple);
  // With several token tiles, split long rows into K slices of <= ~1024 so a
  // tile of x (4 x 4 KiB) and the current rows stay in L1 while the tiles
  // and rows of the block cycle; partial sums accumulate in Y.
  const int64_t nk = ntiles == 1 || K <= 1536 ? 1 : (K + 1023) / 1024;
  const int64_t kstep = nk == 1 ? K : ((K + nk - 1) / nk + 15) / 16 * 16;
  for (int64_t nb = n0; nb < n1; nb += block_rows) {
    const int64_t nbe = std::min(n1, nb + block_rows);
    for (int64_t k0 = 0; k0 < K; k0 += kstep) {
      const int64_t kc = std::min(kstep, K - k0);
      int64_t m = 0;
      for (int64_t tile = 0; tile < ntiles; ++tile) {
        const int64_t T = (M - m) / (ntiles - tile) + (((M - m) % (ntiles - tile)) ? 1 : 0);
        rows_loop(T, W + k0, kc, nb, nbe, X + m * ldx + k0, Y + m * ldy, k0 > 0);
        m += T;
      }
    }
  }
}

}  // namespace hinamoe
