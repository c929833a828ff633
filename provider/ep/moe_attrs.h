// Reading com.microsoft::MoE attributes into hinamoe::MoEAttrs, shared by
// GetCapability (graph node) and kernel creation (kernel info), so both
// agree on what is supported and on the defaults of ORT's schema.
#pragma once

#include <string>

#include "attr_sources.h"
#include "kernels/moe/moe_ffn.h"

namespace hinamoe_ep {

// Fills *out from the attributes (ORT's defaults where absent). *why says
// what is unsupported or invalid.
AttrVerdict read_moe_attrs(const AttrSource& src, hinamoe::MoEAttrs* out, std::string* why);

}  // namespace hinamoe_ep
