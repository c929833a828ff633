#include "matmul_nbits_kernel.h"

#include <memory>
#include <vector>

#include "ep.h"
#include "kernel_base.h"
#include "matmul_nbits_attrs.h"

namespace hinamoe_ep {

namespace {

constexpr int kInputs = 6;
const char* const kInputNames[kInputs] = {"A", "B", "scales", "zero_points", "g_idx", "bias"};

int64_t product(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

struct MatMulNBitsKernel : KernelBase<MatMulNBitsKernel> {
  hinamoe::MatMulNBitsAttrs attrs;
  const hinamoe::KernelTier* tier = nullptr;

  MatMulNBitsKernel() : KernelBase("MatMulNBits") {}

  OrtStatus* compute(OrtKernelContext* context) const;
};

OrtStatus* MatMulNBitsKernel::compute(OrtKernelContext* context) const {
  Ort::KernelContext ctx(context);
  KernelInputs inputs = read_inputs(ctx, kInputs);
  const auto& in = inputs.value;
  const auto& shape = inputs.shape;
  const auto& elem = inputs.elem;
  for (int i : {0, 1, 2})
    if (in[i] == nullptr) return error(kInputNames[i], "is required");
  if (in[4] != nullptr) return error(kInputNames[4], "is not implemented by HinaMoE");
  const ONNXTensorElementDataType T = elem[0];
  for (int i : {2, 5})
    if (in[i] != nullptr && elem[i] != T)
      return error(kInputNames[i], "has element type " + std::to_string(elem[i]) + " but A has " +
                                       std::to_string(T) + " (they must share T1)");
  for (int i : {1, 3})
    if (in[i] != nullptr && elem[i] != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8)
      return error(kInputNames[i], "has element type " + std::to_string(elem[i]) + "; expected uint8");

  const int64_t K = attrs.K, N = attrs.N, nb = (K + attrs.block - 1) / attrs.block;
  const int64_t blob = attrs.block * attrs.bits / 8, zp_row = (nb * attrs.bits + 7) / 8;
  const std::string kn = " (K=" + std::to_string(K) + ", N=" + std::to_string(N) + ", block_size=" +
                         std::to_string(attrs.block) + ", bits=" + std::to_string(attrs.bits) + ")";
  const auto& as = shape[0];
  if (as.empty() || as.back() != K)
    return error(kInputNames[0], "has shape " + shape_str(as) + "; its last dimension must be K" + kn);
  if (shape[1].empty() || shape[1][0] != N || product(shape[1]) != N * nb * blob)
    return error(kInputNames[1], "has shape " + shape_str(shape[1]) + "; expected " +
                                     shape_str({N, nb, blob}) + kn);
  if (product(shape[2]) != N * nb)
    return error(kInputNames[2], "has shape " + shape_str(shape[2]) + "; expected " + std::to_string(N * nb) +
                                     " elements, N * ceil(K/block_size)" + kn);
  if (in[3] != nullptr && product(shape[3]) != N * zp_row)
    return error(kInputNames[3], "has shape " + shape_str(shape[3]) + "; expected " + std::to_string(N * zp_row) +
                                     " bytes, N * ceil(ceil(K/block_size) * bits / 8)" + kn);
  if (in[5] != nullptr && product(shape[5]) != N)
    return error(kInputNames[5], "has shape " + shape_str(shape[5]) + "; expected [" + std::to_string(N) + "]" + kn);

  std::vector<int64_t> ys = as;
  ys.back() = N;
  Ort::UnownedValue out = ctx.GetOutput(0, ys);
  hinamoe::MatMulNBitsTensors t;
  t.dtype = to_dtype(T);
  t.M = product(as) / K;
  if (t.M == 0) return nullptr;
  auto data = [&](int i) { return in[i] == nullptr ? nullptr : in[i].GetTensorRawData(); };
  t.a = data(0);
  t.b = static_cast<const uint8_t*>(data(1));
  t.scales = data(2);
  t.zero_points = static_cast<const uint8_t*>(data(3));
  t.bias = data(5);
  t.y = out.GetTensorMutableRawData();
  const std::string why = hinamoe::matmul_nbits(attrs, t, *tier, ort_parallel(ctx));
  if (!why.empty()) return error("", why);
  return nullptr;
}

}  // namespace

OrtStatus* ORT_API_CALL create_matmul_nbits_kernel(void*, const OrtKernelInfo* info, OrtKernelImpl** out) noexcept {
  *out = nullptr;
  HINA_API_BEGIN
  auto kernel = std::make_unique<MatMulNBitsKernel>();
  const HinaEp* ep = nullptr;
  std::string why;
  HINA_RETURN_IF_ERROR(creating_ep(info, &kernel->node_name, &ep, &why));
  if (!why.empty()) return kernel->error("", why);
  if (read_matmul_nbits_attrs(kernel_info_attrs(info), &kernel->attrs, &why) != AttrVerdict::Ok)
    return kernel->error("", why);
  const HinaEp::Options& options = ep->options();
  kernel->tier = options.tier;
  kernel->attrs.bf16_tiles = kernel->attrs.bf16_tiles && options.bf16_tiles;
  *out = kernel.release();
  return nullptr;
  HINA_API_END
}

}  // namespace hinamoe_ep
