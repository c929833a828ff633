#include "matmul_nbits_support.h"

#include "matmul_nbits_attrs.h"

namespace hinamoe_ep {

std::string matmul_nbits_unsupported_reason(const Ort::ConstNode& node) {
  hinamoe::MatMulNBitsAttrs attrs;
  std::string why;
  if (read_matmul_nbits_attrs(node_attrs(node), &attrs, &why) == AttrVerdict::Unsupported) return why;

  const std::vector<Ort::ConstValueInfo> inputs = node.GetInputs();
  if (inputs.size() < 3 || inputs[0] == nullptr || inputs[1] == nullptr || inputs[2] == nullptr)
    return "node has fewer than 3 inputs";
  const auto a = tensor_elem_type(inputs[0]);
  if (a != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && a != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 &&
      a != ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16)
    return "A has element type " + std::to_string(a) + ", not float/float16/bfloat16";
  if (tensor_elem_type(inputs[1]) != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8) return "B is not uint8";
  if (inputs.size() > 3 && inputs[3] != nullptr && tensor_elem_type(inputs[3]) != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8)
    return "zero_points are not uint8 (float zero points are not implemented by HinaMoE)";
  if (inputs.size() > 4 && inputs[4] != nullptr) return "input g_idx is not implemented by HinaMoE";
  return "";
}

}  // namespace hinamoe_ep
