// GetCapability's verdict on a com.microsoft::MatMulNBits node.
#pragma once

#include <string>

#include "ort_api.h"

namespace hinamoe_ep {

// Empty when HinaMoE runs the node; otherwise why it leaves it to another EP.
std::string matmul_nbits_unsupported_reason(const Ort::ConstNode& node);

}  // namespace hinamoe_ep
