#include "matmul_support.h"

#include "attr_sources.h"

namespace hinamoe_ep {

namespace {

bool is_16_bit(ONNXTensorElementDataType t) {
  return t == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 || t == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
}

// The rank of a tensor value, or -1 where the graph does not say.
int64_t rank_of(const Ort::ConstValueInfo& v) {
  Ort::ConstTypeInfo type = v.TypeInfo();
  if (type.GetONNXType() != ONNX_TYPE_TENSOR) return -1;
  auto info = type.GetTensorTypeAndShapeInfo();
  if (!info.HasShape()) return -1;
  return int64_t(info.GetDimensionsCount());
}

}  // namespace

bool matmul_is_dense_16_bit(const Ort::ConstNode& node) {
  const std::vector<Ort::ConstValueInfo> inputs = node.GetInputs();
  if (inputs.size() != 2 || inputs[0] == nullptr || inputs[1] == nullptr) return false;
  if (!is_16_bit(tensor_elem_type(inputs[0])) && !is_16_bit(tensor_elem_type(inputs[1]))) return false;
  return rank_of(inputs[1]) == 2;
}

std::string matmul_unsupported_reason(const Ort::ConstNode& node) {
  const std::vector<Ort::ConstValueInfo> inputs = node.GetInputs();
  const auto a = tensor_elem_type(inputs[0]), b = tensor_elem_type(inputs[1]);
  if (a != b || !is_16_bit(a))
    return "A and B have element types " + std::to_string(a) + " and " + std::to_string(b) +
           ", not both float16 or both bfloat16";
  if (rank_of(inputs[0]) == 0) return "A is a scalar";
  return "";
}

}  // namespace hinamoe_ep
