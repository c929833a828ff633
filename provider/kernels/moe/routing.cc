// Routing. The float32 softmax and the partial_sort tie order reproduce ORT's
// CPU MoE exactly, so the same experts are picked even for near-ties.
#include "routing.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>

namespace hinamoe {

bool route_token(const float* logits, int64_t experts, int64_t k, bool normalize,
                 int32_t* expert_ids, float* weights, std::vector<std::pair<float, int>>* scratch) {
  auto& pairs = *scratch;
  pairs.resize(static_cast<size_t>(experts));
  float mx = logits[0];
  for (int64_t j = 0; j < experts; ++j) mx = std::max(mx, logits[j]);
  float sum = 0.0f;
  for (int64_t j = 0; j < experts; ++j) {
    const float e = std::exp(logits[j] - mx);
    pairs[j] = {e, static_cast<int>(j)};
    sum += e;
  }
  for (int64_t j = 0; j < experts; ++j) {
    pairs[j].first = pairs[j].first / sum;
    if (std::isnan(pairs[j].first)) return false;  // also keeps NaN out of the sort below
  }
  // Pairs compare by p, then by index: std::greater puts the higher index first on ties.
  std::partial_sort(pairs.begin(), pairs.begin() + k, pairs.end(), std::greater<>());
  float denom = 1.0f;
  if (normalize) {
    denom = 0.0f;
    for (int64_t s = 0; s < k; ++s) denom += pairs[s].first;
  }
  for (int64_t s = 0; s < k; ++s) {
    expert_ids[s] = pairs[s].second;
    weights[s] = normalize ? pairs[s].first / denom : pairs[s].first;
  }
  return true;
}

std::string compute_routes(const void* logits, DType dtype, int64_t tokens, int64_t experts,
                           int64_t k, bool normalize, const Parallel& par, Routes* out,
                           int64_t token_base) {
  std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
  std::vector<float> w(static_cast<size_t>(tokens * k));
  // Chunks of tokens; the first token with NaN probabilities wins the error.
  const int64_t chunk = 64;
  const int64_t nchunks = (tokens + chunk - 1) / chunk;
  std::atomic<int64_t> bad{tokens};
  auto body = [&](size_t c) {
    std::vector<std::pair<float, int>> scratch;
    std::vector<float> row(static_cast<size_t>(experts));
    const int64_t t0 = static_cast<int64_t>(c) * chunk, t1 = std::min(tokens, t0 + chunk);
    for (int64_t t = t0; t < t1; ++t) {
      bool has_nan = false;
      for (int64_t j = 0; j < experts; ++j) {
        row[j] = load_as_f32(logits, t * experts + j, dtype);
        has_nan |= std::isnan(row[j]);
      }
      if (has_nan || !route_token(row.data(), experts, k, normalize, &ids[t * k], &w[t * k], &scratch)) {
        int64_t cur = bad.load();
        while (t < cur && !bad.compare_exchange_weak(cur, t)) {
        }
        return;  // later tokens of this chunk cannot be the first bad one
      }
    }
  };
  if (tokens * experts < 16384) {
    for (int64_t c = 0; c < nchunks; ++c) body(static_cast<size_t>(c));
  } else {
    par.for_each(static_cast<size_t>(nchunks), body);
  }
  if (bad.load() < tokens) {
    // Re-derive the kind of problem for the first bad token.
    const int64_t t = bad.load();
    bool has_nan = false;
    for (int64_t j = 0; j < experts; ++j) has_nan |= std::isnan(load_as_f32(logits, t * experts + j, dtype));
    return has_nan ? "router logits contain NaN at token " + std::to_string(t + token_base)
                   : "router logits at token " + std::to_string(t + token_base) +
                         " give NaN softmax probabilities (infinite logits)";
  }

  // Counting sort by expert; scanning tokens in order keeps each group sorted by token.
  out->expert_begin.assign(static_cast<size_t>(experts + 1), 0);
  out->slot_pos.assign(static_cast<size_t>(tokens * k), -1);
  for (int64_t r = 0; r < tokens * k; ++r)
    if (w[r] > 0.0f) ++out->expert_begin[ids[r] + 1];
  for (int64_t e = 0; e < experts; ++e) out->expert_begin[e + 1] += out->expert_begin[e];
  const int64_t n = out->expert_begin[experts];
  out->token.resize(static_cast<size_t>(n));
  out->weight.resize(static_cast<size_t>(n));
  std::vector<int64_t> fill(out->expert_begin.begin(), out->expert_begin.end() - 1);
  for (int64_t r = 0; r < tokens * k; ++r) {
    if (!(w[r] > 0.0f)) continue;
    const int64_t p = fill[ids[r]]++;
    out->token[p] = static_cast<int32_t>(r / k);
    out->weight[p] = w[r];
    out->slot_pos[r] = p;
  }
  return "";
}

}  // namespace hinamoe
