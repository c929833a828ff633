// Attribute lookups (absent -> nullopt) from the two places ORT shows a
// node's attributes: the graph node in GetCapability and the kernel info at
// kernel creation. The op readers (moe_attrs, gqa_attrs) take either, so
// claiming and running agree.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "ort_api.h"

namespace hinamoe_ep {

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

AttrSource node_attrs(const Ort::ConstNode& node);

// The element type of a node input in GetCapability (UNDEFINED when it is not a tensor).
ONNXTensorElementDataType tensor_elem_type(const Ort::ConstValueInfo& v);
AttrSource kernel_info_attrs(const OrtKernelInfo* info);

}  // namespace hinamoe_ep
