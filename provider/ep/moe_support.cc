#include "moe_support.h"

#include "moe_attrs.h"

namespace hinamoe_ep {

namespace {

bool is_supported_elem(ONNXTensorElementDataType t) {
  return t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT || t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ||
         t == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
}

}  // namespace

std::string moe_unsupported_reason(const Ort::ConstNode& node) {
  const AttrSource src = node_attrs(node);
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
