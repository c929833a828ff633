// GetCapability's verdict on a com.microsoft::MoE node.
#pragma once

#include <string>

#include "ort_api.h"

namespace hinamoe_ep {

// Empty when HinaMoE runs the node; otherwise why it leaves it to another EP.
// Nodes with invalid attribute values are claimed, so the user gets our
// error naming the problem rather than another EP's behaviour.
std::string moe_unsupported_reason(const Ort::ConstNode& node);

}  // namespace hinamoe_ep
