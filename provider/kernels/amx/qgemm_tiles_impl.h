// The tile GEMM over quantised weights (qgemm_tiles.h), written once over a
// TileOps policy like the HiNa kernel it drives: per panel of 32 weight rows,
// dequantise into bf16 (the Dequant function), then one micro-kernel run per
// block of 32 tokens, the accumulators stored transposed into Y.
#pragma once

#include <algorithm>
#include <cstdint>

#include "../qmoe/qmoe_ffn.h"
#include "amx_layout.h"
#include "hina_microkernel_impl.h"
#include "qgemm_tiles.h"

namespace hinamoe {
namespace amx {

using DequantRowsFn = void (*)(const QWeight& w, int64_t n, int rows, int64_t ldp, uint16_t* panel);

template <class Ops>
void qgemm_tiles(Ops& ops, DequantRowsFn dequant, const QWeight& w, int64_t n0, int64_t n1, const uint16_t* xv,
                 int64_t M, float* Y, int64_t ldy) {
  if (M <= 0 || n0 >= n1) return;
  const int64_t Kp = round_up32(w.K);
  uint16_t* panel = tile_panel(Kp);
  HinaMicroKernel<Ops> mk(ops);
  alignas(64) float C[32 * kAccLd];
  const int64_t nmb = (M + 31) / 32;
  for (int64_t n = n0, pi = 0; n < n1; n += 32, ++pi) {
    const int rows = int(std::min<int64_t>(32, n1 - n));
    dequant(w, n, rows, Kp, panel);
    ops.staged(panel);
    const int ra0 = std::min(rows, 16), ra1 = rows - ra0;
    for (int64_t ib = 0; ib < nmb; ++ib) {
      const int64_t mb = 32 * zigzag<Ops>(ib, nmb, pi);
      const int mt = int(std::min<int64_t>(32, M - mb));
      // Tile-major panel: a 32-column block of all 32 rows is 2 KiB apart
      // from the next, rows 64 bytes apart. Tokens blocked by 32 (below).
      mk.run(panel, ra0, panel + 16 * 32, ra1, Kp, xv + mb * Kp, mt, 0, mt, false, C, 32, 32 * 32);
      store_transposed(C, kAccLd, rows, mt, nullptr, nullptr, n - n0, mb, false, Y, ldy);
    }
  }
}

}  // namespace amx
}  // namespace hinamoe
