// The epilogues of the NUMA-partitioned AMX blocks (block_epilogue.h): the
// same bias/activation and layout transforms 2 and 3 as the one-node
// kernels, run once on the node-order sums of the per-node partials.
#include "block_epilogue.h"

#include <algorithm>
#include <vector>

#include "amx_layout.h"

namespace hinamoe {
namespace amx {

void amx_gate_up_finish(const MoEAttrs& at, int64_t I, const void* fc1_b, const void* fc3_b, DType bdt,
                        const float* h, int64_t M, int64_t j0, int64_t j1, uint16_t* actv) {
  if (j1 == I) vnni_zero_tail(I, M, actv);
  if (M <= 0 || j0 >= j1) return;
  const bool gated = is_gated(at.activation);
  const bool inter = gated && at.gate_layout == GateLayout::Interleaved;
  constexpr int kJ = 32;
  float bg[kJ], bu[kJ];
  std::vector<float> act(size_t(kJ * M));
  for (int64_t j = j0; j < j1; j += kJ) {
    const int jr = int(std::min<int64_t>(kJ, j1 - j));
    gate_up_biases(at, I, fc1_b, fc3_b, bdt, j, jr, bg, bu);
    const float* g = h + (inter ? 2 * j : j) * M;
    const float* u = inter ? g + M : h + (I + j) * M;
    const int64_t step = inter ? 2 * M : M;
    for (int64_t mb = 0; mb < M; mb += 1024) {  // activate_rows takes an int count
      const int mt = int(std::min<int64_t>(1024, M - mb));
      activate_rows(at, g + mb, step, u + mb, step, bg, bu, jr, mt, act.data() + mb, M);
    }
    store_vnni_block(act.data(), M, jr, M, j, 0, M, actv);
  }
}

void amx_down_finish(const void* fc2_b, DType bdt, const float* acc, int64_t M, int64_t h0, int64_t h1,
                     const float* route_weight, bool accumulate, float* y, int64_t ldy) {
  if (M <= 0 || h0 >= h1) return;
  constexpr int kH = 32;
  float bias[kH];
  for (int64_t h = h0; h < h1; h += kH) {
    const int hr = int(std::min<int64_t>(kH, h1 - h));
    for (int r = 0; r < hr; ++r) bias[r] = fc2_b ? load_as_f32(fc2_b, h + r, bdt) : 0.0f;
    store_transposed(acc + h * M, M, hr, M, fc2_b ? bias : nullptr, route_weight, h, 0, accumulate, y, ldy);
  }
}

}  // namespace amx
}  // namespace hinamoe
