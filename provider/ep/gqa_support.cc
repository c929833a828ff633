#include "gqa_support.h"

#include "gqa_attrs.h"

namespace hinamoe_ep {

namespace {

// Inputs 12.. of the schema: what each would need that HinaMoE lacks.
const char* const kUnclaimedInputs[] = {
    "k_scale (quantised KV cache)", "v_scale (quantised KV cache)", "q_norm_weight (per-head Q RMS norm)",
    "k_norm_weight (per-head K RMS norm)", "query_seqlens (right-padded query chunks)"};
constexpr size_t kFirstUnclaimedInput = 12;
constexpr size_t kSchemaInputs = kFirstUnclaimedInput + sizeof(kUnclaimedInputs) / sizeof(kUnclaimedInputs[0]);

}  // namespace

std::string gqa_unsupported_reason(const Ort::ConstNode& node) {
  for (const Ort::ConstOpAttr& attr : node.GetAttributes()) {
    const std::string name = attr.GetName();
    if (!is_known_gqa_attr(name)) return "attribute '" + name + "' is not known to HinaMoE";
  }
  const AttrSource src = node_attrs(node);
  GqaNodeAttrs attrs;
  std::string why;
  if (read_gqa_attrs(src, &attrs, &why) == AttrVerdict::Unsupported) return why;

  const std::vector<Ort::ConstValueInfo> inputs = node.GetInputs();
  if (inputs.size() > kSchemaInputs) return "node has " + std::to_string(inputs.size()) + " inputs; the schema HinaMoE knows has " + std::to_string(kSchemaInputs);
  for (size_t i = kFirstUnclaimedInput; i < inputs.size(); ++i) {
    if (inputs[i] != nullptr) return std::string("input ") + kUnclaimedInputs[i - kFirstUnclaimedInput] + " is not supported";
  }
  const std::vector<Ort::ConstValueInfo> outputs = node.GetOutputs();
  if (outputs.size() > 3 && outputs[3] != nullptr) return "output 'output_qk' is not supported";
  if (outputs.size() > 4) return "node has " + std::to_string(outputs.size()) + " outputs; the schema HinaMoE knows has 4";

  if (inputs.empty() || inputs[0] == nullptr) return "node has no query input";
  const auto t = tensor_elem_type(inputs[0]);
  if (t != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && t != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 &&
      t != ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16) {
    return "element type " + std::to_string(t) +
           " of 'query': HinaMoE runs float32, float16 and bfloat16 GroupQueryAttention";
  }
  // The KV cache may have its own type (T_CACHE): it must be the query's.
  for (size_t i : {3, 4}) {
    if (i < inputs.size() && inputs[i] != nullptr && tensor_elem_type(inputs[i]) != t) {
      return std::string("input '") + (i == 3 ? "past_key" : "past_value") + "' has another element type than 'query' (quantised KV cache)";
    }
  }
  for (size_t i : {1, 2}) {
    if (i < outputs.size() && outputs[i] != nullptr && tensor_elem_type(outputs[i]) != t) {
      return std::string("output '") + (i == 1 ? "present_key" : "present_value") + "' has another element type than 'query'";
    }
  }
  return "";
}

}  // namespace hinamoe_ep
