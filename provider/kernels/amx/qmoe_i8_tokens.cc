// Token side of the AMX-INT8 QMoE path: per-block symmetric int8
// quantisation written straight into the VNNI B layout, and the checks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "qmoe_i8.h"

namespace hinamoe {

std::string amx_i8_unsupported_reason(const AmxI8Weight& w, const AmxI8Tokens& x) {
  const auto s = [](int64_t v) { return std::to_string(v); };
  if (w.bits != 4 && w.bits != 8) return "expert_weight_bits " + s(w.bits) + " (only 4 and 8)";
  // Above 65536 codes a block's int32 tile sum could wrap (255 * 128 each).
  if (w.block < 16 || w.block > 65536 || (w.block & (w.block - 1)) != 0)
    return "block_size " + s(w.block) + " (needs a power of two in [16, 65536])";
  if (w.K <= 0 || w.K % w.block != 0) return "K " + s(w.K) + " is not a positive multiple of block_size " + s(w.block);
  if (w.N < 0) return "N " + s(w.N) + " is negative";
  if (w.codes == nullptr || w.scales == nullptr) return "weight codes or scales missing";
  if (x.K != w.K || x.block != w.block)
    return "tokens (K " + s(x.K) + ", block " + s(x.block) + ") do not match the weight (K " + s(w.K) + ", block " +
           s(w.block) + ")";
  if (x.M < 0) return "M " + s(x.M) + " is negative";
  if (x.M > 0 && (x.q == nullptr || x.scale == nullptr || x.sum == nullptr)) return "token codes, scales or sums missing";
  return "";
}

void amx_i8_gather_tokens(const void* x, DType dtype, int64_t K, const int32_t* rows, int64_t M, int64_t block,
                          int8_t* q, float* scale, int32_t* sum) {
  const int64_t nb = K / block;
  std::vector<float> v(static_cast<size_t>(block));
  for (int64_t m = 0; m < M; ++m) {
    const int64_t row = rows ? rows[m] : m;
    for (int64_t b = 0; b < nb; ++b) {
      float amax = 0.0f;
      bool finite = true;
      for (int64_t i = 0; i < block; ++i) {
        v[size_t(i)] = load_as_f32(x, row * K + b * block + i, dtype);
        finite &= std::isfinite(v[size_t(i)]);
        amax = std::max(amax, std::fabs(v[size_t(i)]));
      }
      const float inv = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
      int32_t s = 0;
      for (int64_t i = 0; i < block; ++i) {
        // |v * inv| <= 127 up to rounding: the clamp keeps the cast defined.
        const float r = !finite ? 0.0f : std::nearbyint(std::min(127.0f, std::max(-127.0f, v[size_t(i)] * inv)));
        const int8_t c = int8_t(r);
        q[vnni_i8_index(b * block + i, m, M)] = c;
        s += c;
      }
      scale[m * nb + b] = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
      sum[m * nb + b] = s;
    }
  }
}

void amx_i8_tokens_to_vnni(const int8_t* src, int64_t ld, int64_t M, int64_t K, int8_t* q) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) q[vnni_i8_index(k, m, M)] = src[m * ld + k];
}

}  // namespace hinamoe
