#include "matmul_kernel.h"

#include <memory>
#include <vector>

#include "ep.h"
#include "kernel_base.h"
#include "kernels/dense/matmul.h"

namespace hinamoe_ep {

namespace {

const char* const kInputNames[2] = {"A", "B"};

struct MatMulKernel : KernelBase<MatMulKernel> {
  const hinamoe::KernelTier* tier = nullptr;

  MatMulKernel() : KernelBase("MatMul") {}

  OrtStatus* compute(OrtKernelContext* context) const;
};

OrtStatus* MatMulKernel::compute(OrtKernelContext* context) const {
  Ort::KernelContext ctx(context);
  KernelInputs inputs = read_inputs(ctx, 2);
  const auto& in = inputs.value;
  const auto& shape = inputs.shape;
  const auto& elem = inputs.elem;
  for (int i : {0, 1})
    if (in[i] == nullptr) return error(kInputNames[i], "is required");
  const ONNXTensorElementDataType T = elem[0];
  if (T != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 && T != ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16)
    return error(kInputNames[0], "has element type " + std::to_string(T) + "; HinaMoE runs float16 and bfloat16");
  if (elem[1] != T)
    return error(kInputNames[1], "has element type " + std::to_string(elem[1]) + " but A has " + std::to_string(T));
  const auto& as = shape[0];
  const auto& bs = shape[1];
  if (bs.size() != 2) return error(kInputNames[1], "has shape " + shape_str(bs) + "; HinaMoE runs B of rank 2");
  if (as.empty()) return error(kInputNames[0], "is a scalar");
  const int64_t K = bs[0], N = bs[1];
  if (as.back() != K)
    return error(kInputNames[0], "has shape " + shape_str(as) + "; its last dimension must be B's first, " +
                                     std::to_string(K) + " (B has shape " + shape_str(bs) + ")");
  std::vector<int64_t> ys(as.begin(), as.end() - 1);  // A [K] gives Y [N]
  ys.push_back(N);
  int64_t M = 1;
  for (size_t i = 0; i + 1 < as.size(); ++i) M *= as[i];
  Ort::UnownedValue out = ctx.GetOutput(0, ys);
  hinamoe::MatMulTensors t;
  t.dtype = to_dtype(T);
  t.M = M;
  t.K = K;
  t.N = N;
  if (M == 0 || N == 0) return nullptr;
  t.a = in[0].GetTensorRawData();
  t.b = in[1].GetTensorRawData();
  t.y = out.GetTensorMutableRawData();
  const std::string why = hinamoe::matmul(t, *tier, ort_parallel(ctx));
  if (!why.empty()) return error("", why);
  return nullptr;
}

}  // namespace

OrtStatus* ORT_API_CALL create_matmul_kernel(void*, const OrtKernelInfo* info, OrtKernelImpl** out) noexcept {
  *out = nullptr;
  HINA_API_BEGIN
  auto kernel = std::make_unique<MatMulKernel>();
  const HinaEp* ep = nullptr;
  std::string why;
  HINA_RETURN_IF_ERROR(creating_ep(info, &kernel->node_name, &ep, &why));
  if (!why.empty()) return kernel->error("", why);
  kernel->tier = ep->options().tier;
  *out = kernel.release();
  return nullptr;
  HINA_API_END
}

}  // namespace hinamoe_ep
