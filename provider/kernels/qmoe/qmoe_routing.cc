#include "qmoe_routing.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

namespace hinamoe {

namespace {
constexpr float kMinRouteWeight = 1e-8f;  // ORT drops routes at or below this
}

std::string compute_qmoe_routes(const void* logits, const void* router_weights, DType dtype, int64_t tokens,
                                int64_t experts, int64_t k, bool normalize, const Parallel& par, Routes* out,
                                int64_t token_base) {
  std::vector<int32_t> ids(size_t(tokens * k));
  std::vector<float> w(size_t(tokens * k));
  std::atomic<int64_t> bad{tokens};
  const int64_t chunk = 64;
  auto body = [&](size_t c) {
    std::vector<std::pair<float, int>> pairs(static_cast<size_t>(experts));
    std::vector<float> top(static_cast<size_t>(k));
    const int64_t t0 = int64_t(c) * chunk, t1 = std::min(tokens, t0 + chunk);
    for (int64_t t = t0; t < t1; ++t) {
      bool nan = false;
      for (int64_t j = 0; j < experts; ++j) {
        const float v = load_as_f32(logits, t * experts + j, dtype);
        nan |= std::isnan(v);
        pairs[size_t(j)] = {v, int(j)};
      }
      if (nan) {
        int64_t cur = bad.load();
        while (t < cur && !bad.compare_exchange_weak(cur, t)) {
        }
        return;
      }
      std::partial_sort(pairs.begin(), pairs.begin() + k, pairs.end(), std::greater<>());
      int32_t* id = &ids[size_t(t * k)];
      float* wt = &w[size_t(t * k)];
      for (int64_t s = 0; s < k; ++s) id[s] = pairs[size_t(s)].second;
      if (router_weights != nullptr) {
        float sum = 0.0f;
        for (int64_t s = 0; s < k; ++s) {
          top[size_t(s)] = load_as_f32(router_weights, t * experts + id[s], dtype);
          sum += top[size_t(s)];
        }
        const float inv = normalize ? (sum == 0.0f ? 0.0f : 1.0f / sum) : 1.0f;
        for (int64_t s = 0; s < k; ++s) wt[s] = normalize ? top[size_t(s)] * inv : top[size_t(s)];
      } else {
        const float mx = pairs[0].first;
        float sum = 0.0f;
        for (int64_t s = 0; s < k; ++s) {
          top[size_t(s)] = std::exp(pairs[size_t(s)].first - mx);
          sum += top[size_t(s)];
        }
        const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
        for (int64_t s = 0; s < k; ++s) wt[s] = top[size_t(s)] * inv;
      }
    }
  };
  const int64_t nchunks = (tokens + chunk - 1) / chunk;
  if (tokens * experts < 16384) {
    for (int64_t c = 0; c < nchunks; ++c) body(size_t(c));
  } else {
    par.for_each(size_t(nchunks), body);
  }
  if (bad.load() < tokens) return "router logits contain NaN at token " + std::to_string(bad.load() + token_base);

  // Counting sort by expert, tokens in order within one.
  out->expert_begin.assign(size_t(experts + 1), 0);
  out->slot_pos.assign(size_t(tokens * k), -1);
  auto keep = [](float v) { return v > kMinRouteWeight; };
  for (int64_t r = 0; r < tokens * k; ++r)
    if (keep(w[size_t(r)])) ++out->expert_begin[size_t(ids[size_t(r)]) + 1];
  for (int64_t e = 0; e < experts; ++e) out->expert_begin[size_t(e + 1)] += out->expert_begin[size_t(e)];
  const int64_t n = out->expert_begin[size_t(experts)];
  out->token.resize(size_t(n));
  out->weight.resize(size_t(n));
  std::vector<int64_t> fill(out->expert_begin.begin(), out->expert_begin.end() - 1);
  for (int64_t r = 0; r < tokens * k; ++r) {
    if (!keep(w[size_t(r)])) continue;
    const int64_t p = fill[size_t(ids[size_t(r)])]++;
    out->token[size_t(p)] = int32_t(r / k);
    out->weight[size_t(p)] = w[size_t(r)];
    out->slot_pos[size_t(r)] = p;
  }
  return "";
}

}  // namespace hinamoe
