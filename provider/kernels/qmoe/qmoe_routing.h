// QMoE's routing, which is not MoE's (ORT's QMoECPU::Compute): the top k
// of the raw logits (ties toward the higher expert index), then
//  * without router_weights: softmax over those k logits (always summing to
//    1; normalize_routing_weights has no effect);
//  * with router_weights [tokens, E]: the weights at the chosen experts,
//    divided by their sum when normalize_routing_weights (0 if the sum is 0);
// routes whose weight is not > 1e-8 are dropped.
#pragma once

#include <cstdint>
#include <string>

#include "../dtype.h"
#include "../parallel.h"
#include "../moe/routing.h"

namespace hinamoe {

// Fills *out like compute_routes (grouped per expert, token order within
// one). Returns "" or an error naming the first token with NaN logits.
std::string compute_qmoe_routes(const void* logits, const void* router_weights, DType dtype, int64_t tokens,
                                int64_t experts, int64_t k, bool normalize, const Parallel& par, Routes* out,
                                int64_t token_base = 0);

}  // namespace hinamoe
