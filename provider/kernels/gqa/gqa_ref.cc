// The reference GQA chunk kernel: plain loops, one query row at a time.
// Defines the contract of GqaChunkFn (gqa.h) for the faster tiers.
#include <algorithm>
#include <cmath>
#include <limits>

#include "dtype.h"
#include "gqa/gqa.h"

namespace hinamoe {
namespace {

template <DType DT>
void chunk_ref(const GqaChunkArgs& a) {
  const int64_t d = a.d;
  float* sc = a.scratch;
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t j0 = std::max(a.k0, a.lo[r]), j1 = std::min(a.k1, a.hi[r]);
    if (j0 >= j1) continue;
    if (std::isnan(a.m[r])) continue;  // flagged before: the driver recomputes the row
    const float* q = a.q + r * d;
    float mx = a.m[r];
    bool bad = false;
    for (int64_t j = j0; j < j1; ++j) {
      float x = 0.0f;
      for (int64_t c = 0; c < d; ++c) x += q[c] * load_as_f32(a.k, j * a.kv_stride + c, DT);
      if (a.softcap > 0.0f) x = a.softcap * std::tanh(x / a.softcap);
      if (a.bias) x += a.bias[r][j];
      sc[j - j0] = x;
      bad |= !(x < std::numeric_limits<float>::infinity());  // NaN or +inf
      mx = std::max(mx, x);
    }
    if (bad) {
      a.m[r] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    if (mx == -std::numeric_limits<float>::infinity()) {
      // All masked by a -inf bias: weight 0, so only a non-finite V shows
      // (0 x Inf = NaN, as the other tiers' P.V gives); the rest stays as it was.
      float* acc = a.acc + r * d;
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t c = 0; c < d; ++c)
          if (!std::isfinite(load_as_f32(a.v, j * a.kv_stride + c, DT))) acc[c] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const float f = a.m[r] == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(a.m[r] - mx);
    float* acc = a.acc + r * d;
    float l = a.l[r] * f;
    for (int64_t c = 0; c < d; ++c) acc[c] *= f;
    for (int64_t j = j0; j < j1; ++j) {
      const float p = std::exp(sc[j - j0] - mx);
      l += p;
      for (int64_t c = 0; c < d; ++c) acc[c] += p * load_as_f32(a.v, j * a.kv_stride + c, DT);
    }
    a.m[r] = mx;
    a.l[r] = l;
  }
}

}  // namespace

const GqaTier& gqa_ref_tier() {
  static const GqaTier t = [] {
    GqaTier x;
    x.name = "ref";
    x.chunk = chunk_ref<DType::F32>;
    x.chunk_f16 = chunk_ref<DType::F16>;
    x.chunk_bf16 = chunk_ref<DType::BF16>;
    return x;
  }();
  return t;
}

}  // namespace hinamoe
