// Reading com.microsoft::MatMulNBits attributes, shared by GetCapability and
// kernel creation so that claiming and running agree.
#pragma once

#include <string>

#include "attr_sources.h"
#include "kernels/dense/matmul_nbits.h"

namespace hinamoe_ep {

// Fills *out (int8_activations from accuracy_level == 4). *why says what is
// unsupported (2/3-bit: left to the CPU EP) or invalid.
AttrVerdict read_matmul_nbits_attrs(const AttrSource& src, hinamoe::MatMulNBitsAttrs* out, std::string* why);

}  // namespace hinamoe_ep
