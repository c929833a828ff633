#include "qmoe_kernel.h"

#include <memory>
#include <vector>

#include "ep.h"
#include "kernel_base.h"
#include "kernels/numa/plan_cache.h"
#include "kernels/qmoe/qmoe_ffn.h"
#include "qmoe_attrs.h"

namespace hinamoe_ep {

namespace {

constexpr int kInputs = 15;
const char* const kInputNames[kInputs] = {
    "input",           "router_probs",   "fc1_experts_weights", "fc1_scales",       "fc1_experts_bias",
    "fc2_experts_weights", "fc2_scales", "fc2_experts_bias",    "fc3_experts_weights", "fc3_scales",
    "fc3_experts_bias", "fc1_zero_points", "fc2_zero_points",   "fc3_zero_points",  "router_weights"};

struct QMoEKernel : KernelBase<QMoEKernel> {
  hinamoe::QMoEAttrs attrs;
  const hinamoe::KernelTier* tier = nullptr;
  std::shared_ptr<const hinamoe::numa::Topology> topology;  // null: one node
  // Segment tables of this node's expert weights (cleared with the kernel).
  mutable hinamoe::numa::PlanCache plans;

  QMoEKernel() : KernelBase("QMoE") {}

  OrtStatus* compute(OrtKernelContext* context) const;
};

OrtStatus* QMoEKernel::compute(OrtKernelContext* context) const {
  Ort::KernelContext ctx(context);
  KernelInputs inputs = read_inputs(ctx, kInputs);
  const auto& in = inputs.value;
  const auto& shape = inputs.shape;
  const auto& elem = inputs.elem;
  for (int i : {0, 1, 2, 3, 5, 6}) {
    if (in[i] == nullptr) return error(kInputNames[i], "is required");
  }
  const ONNXTensorElementDataType T = elem[0];
  for (int i : {1, 4, 7, 10, 14}) {
    if (in[i] != nullptr && elem[i] != T) {
      return error(kInputNames[i], "has element type " + std::to_string(elem[i]) + " but input has " +
                                       std::to_string(T) + " (they must share T)");
    }
  }
  // The scales are T2: one type of their own (float, float16 or bfloat16).
  const ONNXTensorElementDataType T2 = elem[3];
  if (T2 != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT && T2 != ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 &&
      T2 != ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16)
    return error(kInputNames[3], "has element type " + std::to_string(T2) + "; expected float, float16 or bfloat16");
  for (int i : {6, 9}) {
    if (in[i] != nullptr && elem[i] != T2) {
      return error(kInputNames[i], "has element type " + std::to_string(elem[i]) + " but fc1_scales has " +
                                       std::to_string(T2) + " (the scales share T2)");
    }
  }
  for (int i : {2, 5, 8, 11, 12, 13}) {
    if (in[i] != nullptr && elem[i] != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8)
      return error(kInputNames[i], "has element type " + std::to_string(elem[i]) + "; expected uint8");
  }

  const auto& xs = shape[0];
  if (xs.size() != 2 && xs.size() != 3)
    return error(kInputNames[0], "has shape " + shape_str(xs) + "; expected [tokens, hidden] or [batch, seq, hidden]");
  hinamoe::MoEShape s;
  s.hidden = xs.back();
  s.tokens = xs.size() == 2 ? xs[0] : xs[0] * xs[1];
  if (s.hidden <= 0) return error(kInputNames[0], "has shape " + shape_str(xs) + "; hidden size must be positive");
  if (shape[1].size() != 2) return error(kInputNames[1], "has shape " + shape_str(shape[1]) + "; expected [tokens, num_experts]");
  s.experts = shape[1][1];
  if (shape[1][0] != s.tokens)
    return error(kInputNames[1], "has " + std::to_string(shape[1][0]) + " rows but input has " +
                                     std::to_string(s.tokens) + " tokens");
  if (s.experts <= 0) return error(kInputNames[1], "has no experts (shape " + shape_str(shape[1]) + ")");
  if (attrs.moe.k > s.experts)
    return error("", "attribute k=" + std::to_string(attrs.moe.k) + " exceeds the number of experts (" +
                         std::to_string(s.experts) + ")");

  const int64_t pack = 8 / attrs.bits;
  if (shape[5].size() != 3 || shape[5][0] != s.experts || shape[5][1] != s.hidden)
    return error(kInputNames[5], "has shape " + shape_str(shape[5]) + "; expected [" + std::to_string(s.experts) +
                                     ", " + std::to_string(s.hidden) + ", inter*bits/8]");
  s.inter = shape[5][2] * pack;
  if (s.inter <= 0) return error(kInputNames[5], "has an empty intermediate dimension");
  const bool gated = hinamoe::is_gated(attrs.moe.activation);
  const bool fused = gated && attrs.moe.gate_layout != hinamoe::GateLayout::Separate;
  const int64_t n1 = fused ? 2 * s.inter : s.inter;
  if (s.hidden % pack != 0)
    return error(kInputNames[0], "hidden size " + std::to_string(s.hidden) + " is odd; 4-bit rows need whole bytes");

  auto expect = [&](int idx, const std::vector<int64_t>& want, const std::string& what) -> OrtStatus* {
    if (in[idx] == nullptr || shape[idx] == want) return nullptr;
    return error(kInputNames[idx], "has shape " + shape_str(shape[idx]) + "; expected " + shape_str(want) + " (" + what + ")");
  };
  const std::string e = "E=" + std::to_string(s.experts), h = "H=" + std::to_string(s.hidden),
                    i_ = "I=" + std::to_string(s.inter), n1_ = (fused ? "2*I=" : "I=") + std::to_string(n1);
  HINA_RETURN_IF_ERROR(expect(2, {s.experts, n1, s.hidden / pack}, e + ", " + n1_ + ", H*bits/8"));
  HINA_RETURN_IF_ERROR(expect(8, {s.experts, s.inter, s.hidden / pack}, e + ", " + i_ + ", H*bits/8"));
  HINA_RETURN_IF_ERROR(expect(4, {s.experts, n1}, e + ", " + n1_));
  HINA_RETURN_IF_ERROR(expect(7, {s.experts, s.hidden}, e + ", " + h));
  HINA_RETURN_IF_ERROR(expect(10, {s.experts, s.inter}, e + ", " + i_));
  HINA_RETURN_IF_ERROR(expect(14, {s.tokens, s.experts}, "tokens, " + e));

  // Scales: [E, N] row-wise, or [E, N, ceil(K/block_size)] (the last block
  // partial when block_size does not divide K, as ORT's CPU EP takes it);
  // [E, N, 1] is row-wise.
  // Zero points: [E, ceil(N/pack)] row-wise, [E, N, ceil(blocks/pack)] block-wise.
  auto blocks = [&](int w, int sc, int zp, int64_t N, int64_t K, int64_t* nb) -> OrtStatus* {
    if (in[w] == nullptr) return nullptr;
    if (in[sc] == nullptr) return error(kInputNames[sc], "is required with " + std::string(kInputNames[w]));
    const auto& ss = shape[sc];
    if (attrs.block_size > 0) {
      *nb = (K + attrs.block_size - 1) / attrs.block_size;
      HINA_RETURN_IF_ERROR(expect(sc, {s.experts, N, *nb}, e + ", N=" + std::to_string(N) + ", ceil(K/block_size)"));
    } else {
      *nb = 1;
      if (!(ss == std::vector<int64_t>{s.experts, N} || ss == std::vector<int64_t>{s.experts, N, 1}))
        return error(kInputNames[sc], "has shape " + shape_str(ss) + "; expected " + shape_str({s.experts, N}) +
                                          " (row-wise: block_size is 0)");
    }
    if (in[zp] != nullptr) {
      const std::vector<int64_t> want = *nb == 1 ? std::vector<int64_t>{s.experts, (N + pack - 1) / pack}
                                                 : std::vector<int64_t>{s.experts, N, (*nb + pack - 1) / pack};
      HINA_RETURN_IF_ERROR(expect(zp, want, *nb == 1 ? "row-wise, packed" : "block-wise, packed"));
    }
    return nullptr;
  };
  hinamoe::QMoETensors t;
  HINA_RETURN_IF_ERROR(blocks(2, 3, 11, n1, s.hidden, &t.fc1_nb));
  HINA_RETURN_IF_ERROR(blocks(5, 6, 12, s.hidden, s.inter, &t.fc2_nb));
  HINA_RETURN_IF_ERROR(blocks(8, 9, 13, s.inter, s.hidden, &t.fc3_nb));

  t.dtype = to_dtype(T);
  t.scale_dtype = to_dtype(T2);
  auto data = [&](int i) { return in[i] == nullptr ? nullptr : in[i].GetTensorRawData(); };
  auto bytes = [&](int i) { return static_cast<const uint8_t*>(data(i)); };
  t.input = data(0);
  t.router = data(1);
  t.fc1_w = bytes(2);
  t.fc1_s = data(3);
  t.fc1_b = data(4);
  t.fc2_w = bytes(5);
  t.fc2_s = data(6);
  t.fc2_b = data(7);
  t.fc3_w = bytes(8);
  t.fc3_s = data(9);
  t.fc3_b = data(10);
  t.fc1_zp = bytes(11);
  t.fc2_zp = bytes(12);
  t.fc3_zp = bytes(13);
  t.router_weights = data(14);

  Ort::UnownedValue out = ctx.GetOutput(0, xs);
  t.output = s.tokens > 0 ? out.GetTensorMutableRawData() : nullptr;
  hinamoe::MoEOptions opt;
  opt.topology = topology.get();
  opt.plans = &plans;
  const std::string why = hinamoe::qmoe_ffn(s, attrs, t, *tier, ort_parallel(ctx), opt);
  if (!why.empty()) return error("", why);
  return nullptr;
}

}  // namespace

OrtStatus* ORT_API_CALL create_qmoe_kernel(void*, const OrtKernelInfo* info, OrtKernelImpl** out) noexcept {
  *out = nullptr;
  HINA_API_BEGIN
  auto kernel = std::make_unique<QMoEKernel>();
  Ort::ConstKernelInfo ki{info};
  const HinaEp* ep = nullptr;
  std::string why;
  HINA_RETURN_IF_ERROR(creating_ep(info, &kernel->node_name, &ep, &why));
  if (!why.empty()) return kernel->error("", why);
  if (read_qmoe_attrs(kernel_info_attrs(info), &kernel->attrs, &why) != AttrVerdict::Ok) return kernel->error("", why);
  why = k_exceeds_static_experts(ki, kernel->attrs.moe.k);
  if (!why.empty()) return kernel->error("", why);
  const HinaEp::Options& options = ep->options();
  kernel->tier = options.tier;
  kernel->topology = options.topology;
  if (options.qmoe_int8_activations >= 0) kernel->attrs.int8_activations = options.qmoe_int8_activations == 1;
  kernel->attrs.bf16_tiles = kernel->attrs.bf16_tiles && options.bf16_tiles;
  *out = kernel.release();
  return nullptr;
  HINA_API_END
}

}  // namespace hinamoe_ep
