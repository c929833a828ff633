// Reading com.microsoft::MoE attributes into hinamoe::MoEAttrs, shared by
// GetCapability (graph node) and kernel creation (kernel info), so both
// agree on what is supported and on the defaults of ORT's schema.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "kernels/moe_ffn.h"

namespace hinamoe_ep {

// Attribute lookups; std::nullopt when the attribute is absent.
struct AttrSource {
  std::function<std::optional<int64_t>(const char*)> get_int;
  std::function<std::optional<float>(const char*)> get_float;
  std::function<std::optional<std::string>(const char*)> get_string;
};

enum class AttrVerdict {
  Ok,           // we run it
  Unsupported,  // a feature we do not implement: leave the node to another EP
  Invalid,      // a value the op does not allow: claim it and report the error
};

// Fills *out from the attributes (ORT's defaults where absent). *why says
// what is unsupported or invalid.
AttrVerdict read_moe_attrs(const AttrSource& src, hinamoe::MoEAttrs* out, std::string* why);

}  // namespace hinamoe_ep
