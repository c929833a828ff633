// Reading com.microsoft::QMoE attributes into hinamoe::QMoEAttrs, shared by
// GetCapability and kernel creation (the MoE part through read_moe_attrs).
#pragma once

#include <string>

#include "attr_sources.h"
#include "kernels/qmoe/qmoe_ffn.h"

namespace hinamoe_ep {

// Fills *out (int8_activations from accuracy_level == 4; the provider
// option may override it at kernel creation). *why says what is unsupported
// (2-bit, fp4/fp8 quant types: left to the CPU EP) or invalid.
AttrVerdict read_qmoe_attrs(const AttrSource& src, hinamoe::QMoEAttrs* out, std::string* why);

}  // namespace hinamoe_ep
