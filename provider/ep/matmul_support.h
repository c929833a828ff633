// GetCapability's verdict on an ONNX MatMul node. HinaMoE takes MatMul only
// at 16-bit float widths (float16, bfloat16), where B is a weight of rank 2:
// the dense linears of a decoder layer stored at that width. Other MatMuls
// are not HinaMoE's op at all (the CPU EP runs them; strict mode ignores them).
#pragma once

#include <string>

#include "ort_api.h"

namespace hinamoe_ep {

// True for a MatMul whose A or B is float16 or bfloat16.
bool matmul_is_16_bit(const Ort::ConstNode& node);

// Empty when HinaMoE runs the node; otherwise why it leaves it to another EP.
std::string matmul_unsupported_reason(const Ort::ConstNode& node);

}  // namespace hinamoe_ep
