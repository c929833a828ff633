#include "attr_sources.h"

namespace hinamoe_ep {

namespace {

// An OrtStatus we only test for failure (attribute absent).
bool failed(OrtStatus* st) {
  if (st == nullptr) return false;
  Ort::GetApi().ReleaseStatus(st);
  return true;
}

template <class T>
std::optional<T> node_attr(const Ort::ConstNode& node, const char* name) {
  Ort::ConstOpAttr attr{nullptr};
  Ort::Status st = node.GetAttributeByName(name, attr);
  if (!st.IsOK() || attr == nullptr) return std::nullopt;
  T value{};
  if (!attr.GetValue(value).IsOK()) return std::nullopt;
  return value;
}

}  // namespace

ONNXTensorElementDataType tensor_elem_type(const Ort::ConstValueInfo& v) {
  Ort::ConstTypeInfo type = v.TypeInfo();
  if (type.GetONNXType() != ONNX_TYPE_TENSOR) return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  return type.GetTensorTypeAndShapeInfo().GetElementType();
}

AttrSource node_attrs(const Ort::ConstNode& node) {
  return AttrSource{
      [node](const char* n) { return node_attr<int64_t>(node, n); },
      [node](const char* n) { return node_attr<float>(node, n); },
      [node](const char* n) { return node_attr<std::string>(node, n); },
  };
}

AttrSource kernel_info_attrs(const OrtKernelInfo* info) {
  AttrSource src;
  src.get_int = [info](const char* name) -> std::optional<int64_t> {
    int64_t v = 0;
    if (failed(Ort::GetApi().KernelInfoGetAttribute_int64(info, name, &v))) return std::nullopt;
    return v;
  };
  src.get_float = [info](const char* name) -> std::optional<float> {
    float v = 0;
    if (failed(Ort::GetApi().KernelInfoGetAttribute_float(info, name, &v))) return std::nullopt;
    return v;
  };
  src.get_string = [info](const char* name) -> std::optional<std::string> {
    size_t size = 0;
    if (failed(Ort::GetApi().KernelInfoGetAttribute_string(info, name, nullptr, &size))) return std::nullopt;
    std::string v(size, '\0');
    Ort::ThrowOnError(Ort::GetApi().KernelInfoGetAttribute_string(info, name, v.data(), &size));
    v.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
    return v;
  };
  return src;
}

}  // namespace hinamoe_ep
