// Reading com.microsoft::GroupQueryAttention attributes, shared by
// GetCapability (graph node) and kernel creation (kernel info), so both
// agree on what is supported and on the defaults of ORT's schema.
#pragma once

#include <string>

#include "kernels/gqa/gqa.h"
#include "attr_sources.h"

namespace hinamoe_ep {

struct GqaNodeAttrs {
  int64_t num_heads = 0;
  int64_t kv_num_heads = 0;
  hinamoe::GqaAttrs op;
};

// Fills *out (ORT's defaults where absent). Unsupported: features HinaMoE
// leaves to another EP (causal=0, a windowed or quantised KV cache,
// qk_output, odd local_window_size values). Invalid: head counts that are
// missing, not positive or do not divide, non-finite scale/softcap.
AttrVerdict read_gqa_attrs(const AttrSource& src, GqaNodeAttrs* out, std::string* why);

// Whether `name` is an attribute of the op that HinaMoE knows what to do
// with (a newer schema may add ones we would silently ignore otherwise).
bool is_known_gqa_attr(const std::string& name);

}  // namespace hinamoe_ep
