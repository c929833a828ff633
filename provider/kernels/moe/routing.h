// Top-k softmax routing, bit-compatible with ONNX Runtime's CPU
// com.microsoft::MoE, and grouping of the chosen routes per expert.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../dtype.h"
#include "../parallel.h"

namespace hinamoe {

// One token: float32 softmax over `experts` logits (max-subtracted, summed in
// order), then the k largest (p, index) pairs, ties toward the higher index.
// Writes k expert ids and weights (p, or p / sum of the k p's when normalize).
// `scratch` is reused between calls. Returns false if a probability is NaN
// (NaN or +inf logits); outputs are then unspecified.
bool route_token(const float* logits, int64_t experts, int64_t k, bool normalize,
                 int32_t* expert_ids, float* weights, std::vector<std::pair<float, int>>* scratch);

// The routes of a batch, grouped per expert and sorted by token within one.
struct Routes {
  std::vector<int64_t> expert_begin;  // [E + 1]: routes of expert e are [begin[e], begin[e+1])
  std::vector<int32_t> token;         // [routes]: token of each grouped route
  std::vector<float> weight;          // [routes]: its routing weight (> 0)
  std::vector<int64_t> slot_pos;      // [tokens * k]: grouped position of (token, slot), -1 if skipped
  int64_t count() const { return static_cast<int64_t>(token.size()); }
};

// Routes `tokens` rows of [tokens, experts] logits of type `dtype`. Routes
// whose weight is not > 0 are dropped (as ORT does). Returns "" or an error
// naming the first bad token (numbered from `token_base`).
std::string compute_routes(const void* logits, DType dtype, int64_t tokens, int64_t experts,
                           int64_t k, bool normalize, const Parallel& par, Routes* out,
                           int64_t token_base = 0);

}  // namespace hinamoe
