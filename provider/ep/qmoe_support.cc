#include "qmoe_support.h"

#include "qmoe_attrs.h"

namespace hinamoe_ep {

std::string qmoe_unsupported_reason(const Ort::ConstNode& node) {
  hinamoe::QMoEAttrs attrs;
  std::string why;
  if (read_qmoe_attrs(node_attrs(node), &attrs, &why) == AttrVerdict::Unsupported) return why;

  const std::vector<Ort::ConstValueInfo> inputs = node.GetInputs();
  if (inputs.size() < 7 || inputs[0] == nullptr) return "node has fewer than 7 inputs";
  Ort::ConstTypeInfo type = inputs[0].TypeInfo();
  if (type.GetONNXType() != ONNX_TYPE_TENSOR) return "input is not a tensor";
  const auto elem = type.GetTensorTypeAndShapeInfo().GetElementType();
  if (elem != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && elem != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 &&
      elem != ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16)
    return "element type " + std::to_string(elem) + " is not float/float16/bfloat16";
  return "";
}

}  // namespace hinamoe_ep
