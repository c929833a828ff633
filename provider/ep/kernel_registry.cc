#include "kernel_registry.h"

#include <limits>
#include <vector>

#include "gqa_kernel.h"
#include "matmul_kernel.h"
#include "matmul_nbits_kernel.h"
#include "moe_kernel.h"
#include "qmoe_kernel.h"

namespace hinamoe_ep {

namespace {

const OrtDataType* tensor_type(ONNXTensorElementDataType t) {
  const OrtDataType* dt = nullptr;
  Ort::ThrowOnError(Ort::GetEpApi().GetTensorDataType(t, &dt));
  return dt;
}

}  // namespace

OrtStatus* create_kernel_registry(const char* ep_name, OrtKernelRegistry** out) {
  *out = nullptr;
  HINA_API_BEGIN
  Ort::KernelRegistry registry;

  // com.microsoft::MoE, T in {float, float16, bfloat16}.
  std::vector<const OrtDataType*> moe_types = {tensor_type(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT),
                                               tensor_type(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16),
                                               tensor_type(ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16)};
  Ort::KernelDef moe_def = Ort::KernelDefBuilder()
                               .SetOperatorType("MoE")
                               .SetDomain("com.microsoft")
                               .SetSinceVersion(1, 1)
                               .SetExecutionProvider(ep_name)
                               .AddTypeConstraint("T", moe_types)
                               .Build();
  Ort::ThrowOnError(registry.AddKernel(moe_def, create_moe_kernel, nullptr));

  // com.microsoft::QMoE, T in {float, float16, bfloat16} (biases share T; the
  // scales are T2, float/float16/bfloat16, and weights and zero points uint8:
  // checked by GetCapability and at compute).
  Ort::KernelDef qmoe_def = Ort::KernelDefBuilder()
                                .SetOperatorType("QMoE")
                                .SetDomain("com.microsoft")
                                .SetSinceVersion(1, 1)
                                .SetExecutionProvider(ep_name)
                                .AddTypeConstraint("T", moe_types)
                                .Build();
  Ort::ThrowOnError(registry.AddKernel(qmoe_def, create_qmoe_kernel, nullptr));

  // com.microsoft::GroupQueryAttention, T in {float, float16, bfloat16}, M = int32
  // (GetCapability checks that the KV cache has T's type).
  Ort::KernelDef gqa_def = Ort::KernelDefBuilder()
                               .SetOperatorType("GroupQueryAttention")
                               .SetDomain("com.microsoft")
                               .SetSinceVersion(1, 1)
                               .SetExecutionProvider(ep_name)
                               .AddTypeConstraint("T", std::vector<const OrtDataType*>{
                                                           tensor_type(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT),
                                                           tensor_type(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16),
                                                           tensor_type(ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16)})
                               .AddTypeConstraint("M", tensor_type(ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32))
                               .Build();
  Ort::ThrowOnError(registry.AddKernel(gqa_def, create_gqa_kernel, nullptr));

  // com.microsoft::MatMulNBits, T1 in {float, float16, bfloat16}, B uint8
  // (zero points and g_idx are checked by GetCapability).
  Ort::KernelDef mmnb_def = Ort::KernelDefBuilder()
                                .SetOperatorType("MatMulNBits")
                                .SetDomain("com.microsoft")
                                .SetSinceVersion(1, 1)
                                .SetExecutionProvider(ep_name)
                                .AddTypeConstraint("T1", moe_types)
                                .AddTypeConstraint("T2", tensor_type(ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8))
                                .Build();
  Ort::ThrowOnError(registry.AddKernel(mmnb_def, create_matmul_nbits_kernel, nullptr));

  // ONNX MatMul at 16-bit float widths (GetCapability claims B of rank 2
  // only): float16 since opset 1, bfloat16 since opset 13.
  const OrtDataType* f16 = tensor_type(ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16);
  const OrtDataType* bf16 = tensor_type(ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16);
  Ort::KernelDef matmul_old_def = Ort::KernelDefBuilder()
                                      .SetOperatorType("MatMul")
                                      .SetDomain("")
                                      .SetSinceVersion(1, 12)
                                      .SetExecutionProvider(ep_name)
                                      .AddTypeConstraint("T", f16)
                                      .Build();
  Ort::ThrowOnError(registry.AddKernel(matmul_old_def, create_matmul_kernel, nullptr));
  Ort::KernelDef matmul_def = Ort::KernelDefBuilder()
                                  .SetOperatorType("MatMul")
                                  .SetDomain("")
                                  .SetSinceVersion(13, std::numeric_limits<int>::max())
                                  .SetExecutionProvider(ep_name)
                                  .AddTypeConstraint("T", std::vector<const OrtDataType*>{f16, bf16})
                                  .Build();
  Ort::ThrowOnError(registry.AddKernel(matmul_def, create_matmul_kernel, nullptr));

  *out = registry.release();
  return nullptr;
  HINA_API_END
}

}  // namespace hinamoe_ep
