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
  // Scales are T2 (float, float16 or bfloat16 here; ORT also allows float8
  // types), free of T; the codes uint8 (not float8).
  auto elem_of = [&](size_t i) -> int {
    if (i >= inputs.size() || inputs[i] == nullptr) return -1;
    Ort::ConstTypeInfo t = inputs[i].TypeInfo();
    return t.GetONNXType() == ONNX_TYPE_TENSOR ? int(t.GetTensorTypeAndShapeInfo().GetElementType()) : 0;
  };
  for (size_t i : {2, 5, 8}) {
    const int e = elem_of(i);
    if (e != -1 && e != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8)
      return "expert weights (input " + std::to_string(i) + ") of element type " + std::to_string(e) + " are not uint8";
  }
  for (size_t i : {3, 6, 9}) {
    const int e = elem_of(i);
    if (e != -1 && e != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && e != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 &&
        e != ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16)
      return "scales (input " + std::to_string(i) + ") of element type " + std::to_string(e) +
             " are not float/float16/bfloat16";
  }
  // Inputs 15 on (global and activation scales of float8/FP4 experts).
  for (size_t i = 15; i < inputs.size(); ++i)
    if (inputs[i] != nullptr) return "input " + std::to_string(i) + " (global/activation scales) is not supported";
  return "";
}

}  // namespace hinamoe_ep
