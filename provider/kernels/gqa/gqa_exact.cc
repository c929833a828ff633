#include "gqa/gqa_exact.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace hinamoe {

void gqa_exact_row(const GqaExactRow& r, float* out) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const int64_t d = r.d;
  std::vector<float> x(size_t(std::max<int64_t>(0, r.hi - r.lo)));
  bool poisoned = r.has_sink && !(r.sink < inf);  // NaN or +inf sink
  float m = -inf;
  for (int64_t j = r.lo; j < r.hi; ++j) {
    float s = 0.0f;
    for (int64_t c = 0; c < d; ++c) s += r.q[c] * load_as_f32(r.k, j * d + c, r.dt);
    if (r.softcap > 0.0f) s = r.softcap * std::tanh(s / r.softcap);
    if (r.bias) s += r.bias[j];
    x[size_t(j - r.lo)] = s;
    if (!(s < inf)) poisoned = true;  // NaN, or +inf whose weight is exp(inf - inf)
    m = std::max(m, s);
  }
  if (poisoned) {
    std::fill(out, out + d, nan);
    return;
  }
  if (r.has_sink) m = std::max(m, r.sink);
  std::fill(out, out + d, 0.0f);
  if (m == -inf && r.dt != DType::F32) {  // all masked, no (finite) sink
    std::fill(out, out + d, nan);
    return;
  }
  // Weights: 0 for masked keys (and for all when m is -inf: ORT's float
  // softmax gives 0 there).
  double den = r.has_sink ? std::exp(double(r.sink) - m) : 0.0;
  for (float& s : x) {
    s = (m == -inf || s == -inf) ? 0.0f : std::exp(s - m);
    den += s;
  }
  const float inv = den > 0.0 ? float(1.0 / den) : 0.0f;
  for (int64_t j = r.lo; j < r.hi; ++j) {
    const float p = x[size_t(j - r.lo)] * inv;
    for (int64_t c = 0; c < d; ++c) out[c] += p * load_as_f32(r.v, j * d + c, r.dt);
  }
  // Hidden keys: weight 0 in ORT's P.V, so only their non-finite values
  // show: later keys of a prompt, and this step's rows before the window.
  for (int64_t j = r.fresh; j < r.lo; ++j)
    for (int64_t c = 0; c < d; ++c)
      if (!std::isfinite(load_as_f32(r.v, j * d + c, r.dt))) out[c] = nan;
  for (int64_t j = r.hi; j < r.total; ++j)
    for (int64_t c = 0; c < d; ++c)
      if (!std::isfinite(load_as_f32(r.v, j * d + c, r.dt))) out[c] = nan;
}

}  // namespace hinamoe
