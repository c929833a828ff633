#include "moe_support.h"

#include "moe_attrs.h"

namespace hinamoe_ep {

namespace {

template <class T>
std::optional<T> node_attr(const Ort::ConstNode& node, const char* name) {
  Ort::ConstOpAttr attr{nullptr};
  Ort::Status st = node.GetAttributeByName(name, attr);
  if (!st.IsOK() || attr == nullptr) return std::nullopt;
  T value{};
  if (!attr.GetValue(value).IsOK()) return std::nullopt;
  return value;
}

bool is_supported_elem(ONNXTensorElementDataType t) {
  return t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ||
         t == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
}

}  // namespace

std::string moe_unsupported_reason(const Ort::ConstNode& node) {
  AttrSource src{
      [&](const char* n) { return node_attr<int64_t>(node, n); },
      [&](const char* n) { return node_attr<float>(node, n); },
      [&](const char* n) { return node_attr<std::string>(node, n); },
  };
  hinamoe::MoEAttrs attrs;
  std::string why;
  if (read_moe_attrs(src, &attrs, &why) == AttrVerdict::Unsupported) return why;

  std::vector<Ort::ConstValueInfo> inputs = node.GetInputs();
  if (inputs.empty() || inputs[0] == nullptr) return "node has no input";
  Ort::ConstTypeInfo type = inputs[0].TypeInfo();
  if (type.GetONNXType() != ONNX_TYPE_TENSOR) return "input is not a tensor";
  const auto elem = type.GetTensorTypeAndShapeInfo().GetElementType();
  if (!is_supported_elem(elem)) return "element type " + std::to_string(elem) + " is not float/float16/bfloat16";
  return "";
}

}  // namespace hinamoe_ep
