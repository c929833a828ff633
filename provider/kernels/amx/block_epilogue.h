// The fused epilogues of the HiNa expert blocks, shared by the one-node
// kernels (hina_microkernel_impl.h, on the accumulator tiles) and the
// NUMA-partitioned path (on node-order sums of the per-node partials):
// gate/up biases + activation before transform 2, and the finishes that
// run those epilogues once on reduced sums.
#pragma once

#include <cstdint>

#include "../moe/activation.h"
#include "../dtype.h"
#include "../moe/moe_ffn.h"

namespace hinamoe {
namespace amx {

// Biases of intermediate indices j .. j+jr-1 as float (0 when absent): bg of
// the gate (or the only projection), bu of the up projection (gated only).
// Row layout as in amx_gate_up_block_*: Interleaved fc1 rows 2j / 2j+1;
// Stacked fc1 rows j / I+j; Separate fc1 row j / fc3 row j.
inline void gate_up_biases(const MoEAttrs& at, int64_t I, const void* fc1_b, const void* fc3_b, DType bdt,
                           int64_t j, int jr, float* bg, float* bu) {
  const bool gated = is_gated(at.activation);
  const bool inter = gated && at.gate_layout == GateLayout::Interleaved;
  const bool stacked = gated && at.gate_layout == GateLayout::Stacked;
  const void* upb = stacked ? fc1_b : fc3_b;
  const int64_t upb_off = stacked ? I : 0;
  for (int q = 0; q < jr; ++q) {
    if (!gated) {
      bg[q] = fc1_b ? load_as_f32(fc1_b, j + q, bdt) : 0.0f;
    } else if (inter) {
      bg[q] = fc1_b ? load_as_f32(fc1_b, 2 * (j + q), bdt) : 0.0f;
      bu[q] = fc1_b ? load_as_f32(fc1_b, 2 * (j + q) + 1, bdt) : 0.0f;
    } else {
      bg[q] = fc1_b ? load_as_f32(fc1_b, j + q, bdt) : 0.0f;
      bu[q] = upb ? load_as_f32(upb, upb_off + j + q, bdt) : 0.0f;
    }
  }
}

// a[q*lda + m] = act(g_q[m] + bg[q]) (or act(g_q[m] + bg[q], u_q[m] + bu[q])
// when gated) for q < jr, m < mt, with g_q = g + q*gs and u_q = u + q*us.
inline void activate_rows(const MoEAttrs& at, const float* g, int64_t gs, const float* u, int64_t us,
                          const float* bg, const float* bu, int jr, int mt, float* a, int64_t lda) {
  const bool gated = is_gated(at.activation);
  for (int q = 0; q < jr; ++q) {
    float* aq = a + q * lda;
    const float* gq = g + q * gs;
    if (!gated) {
      for (int m = 0; m < mt; ++m) aq[m] = activate(at.activation, gq[m] + bg[q]);
    } else {
      const float* uq = u + q * us;
      for (int m = 0; m < mt; ++m) aq[m] = activate_gated(at, gq[m] + bg[q], uq[m] + bu[q]);
    }
  }
}

// Gate/up epilogue on reduced sums: h holds an expert's projections as rows
// [N1][M] (row stride M), row o = fc1 row o, and for Separate gated the fc3
// rows at I + j (so gate/up of j are rows 2j / 2j+1 when Interleaved, else
// j / I+j). For j in [j0, j1): bias + activation, bf16 into actv (VNNI,
// K = I), as amx_gate_up_block_* does; the call with j1 == I also zeroes
// actv's padding.
void amx_gate_up_finish(const MoEAttrs& attrs, int64_t I, const void* fc1_b, const void* fc3_b, DType bias_dtype,
                        const float* h, int64_t M, int64_t j0, int64_t j1, uint16_t* actv);

// Down epilogue on reduced sums: acc holds W2 . a as rows [H][M] (row h at
// acc + h*M). For h in [h0, h1), as amx_down_block_*:
//   v = route_weight[m] * (acc[h][m] + b2[h]);  y[m*ldy + h] = v, or += v.
void amx_down_finish(const void* fc2_b, DType bias_dtype, const float* acc, int64_t M, int64_t h0, int64_t h1,
                     const float* route_weight, bool accumulate, float* y, int64_t ldy);

}  // namespace amx
}  // namespace hinamoe
