// GetCapability's verdict on an ONNX MatMul node. HinaMoE's MatMul is the
// dense linear of a 16-bit model: float16 or bfloat16, B of rank 2 (a
// weight [K, N]). Other MatMuls (float32, integers, batched products such
// as attention scores) are not HinaMoE's op at all: the CPU EP runs them
// and strict mode ignores them.
#pragma once

#include <string>

#include "ort_api.h"

namespace hinamoe_ep {

// True for a MatMul whose A or B is float16 or bfloat16 and whose B has rank 2.
bool matmul_is_dense_16_bit(const Ort::ConstNode& node);

// Empty when HinaMoE runs the node; otherwise why it leaves it to another EP.
std::string matmul_unsupported_reason(const Ort::ConstNode& node);

}  // namespace hinamoe_ep
