// GetCapability's verdict on a com.microsoft::GroupQueryAttention node.
#pragma once

#include <string>

#include "ort_api.h"

namespace hinamoe_ep {

// Empty when HinaMoE runs the node; otherwise why it leaves it to another EP
// (element types other than float32/float16/bfloat16, quantised KV cache inputs, q/k norm
// weights, query_seqlens, the output_qk output, unknown attributes/inputs).
// Nodes with invalid attribute values are claimed, so the user gets our
// error naming the problem.
std::string gqa_unsupported_reason(const Ort::ConstNode& node);

}  // namespace hinamoe_ep
