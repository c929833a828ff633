#include "moe_kernel.h"

#include <optional>
#include <vector>

#include "ep.h"
#include "kernel_base.h"
#include "kernels/moe/moe_ffn.h"
#include "kernels/numa/plan_cache.h"
#include "moe_attrs.h"

namespace hinamoe_ep {

namespace {

const char* const kInputNames[] = {"input",          "router_probs",        "fc1_experts_weights",
                                   "fc1_experts_bias", "fc2_experts_weights", "fc2_experts_bias",
                                   "fc3_experts_weights", "fc3_experts_bias"};

struct MoEKernel : KernelBase<MoEKernel> {
  hinamoe::MoEAttrs attrs;
  const hinamoe::KernelTier* tier = nullptr;
  std::shared_ptr<const hinamoe::numa::Topology> topology;  // null: one node
  // Segment tables of this node's weights, built on first use (thread-safe).
  mutable hinamoe::numa::PlanCache plans;

  MoEKernel() : KernelBase("MoE") {}

  OrtStatus* compute(OrtKernelContext* context) const;
};

OrtStatus* MoEKernel::compute(OrtKernelContext* context) const {
  Ort::KernelContext ctx(context);
  const size_t n_in = ctx.GetInputCount();
  std::vector<Ort::ConstValue> in(8, Ort::ConstValue{nullptr});
  std::vector<std::vector<int64_t>> shape(8);
  for (size_t i = 0; i < 8 && i < n_in; ++i) {
    in[i] = ctx.GetInput(i);
    if (in[i] != nullptr) shape[i] = in[i].GetTensorTypeAndShapeInfo().GetShape();
  }
  for (int i : {0, 1, 2, 4}) {
    if (in[i] == nullptr) return error(kInputNames[i], "is required");
  }

  // Shapes: input [T, H] or [B, S, H]; router [T, E]; fc1 [E, N1, H];
  // fc2 [E, H, I]; fc3 [E, I, H]; biases [E, rows].
  const auto& xs = shape[0];
  if (xs.size() != 2 && xs.size() != 3) {
    return error(kInputNames[0], "has shape " + shape_str(xs) + "; expected rank 2 [tokens, hidden] or 3 [batch, seq, hidden]");
  }
  hinamoe::MoEShape s;
  s.hidden = xs.back();
  s.tokens = xs.size() == 2 ? xs[0] : xs[0] * xs[1];
  if (s.hidden <= 0) return error(kInputNames[0], "has shape " + shape_str(xs) + "; hidden size must be positive");

  if (shape[1].size() != 2) return error(kInputNames[1], "has shape " + shape_str(shape[1]) + "; expected [tokens, num_experts]");
  s.experts = shape[1][1];
  if (shape[1][0] != s.tokens) {
    return error(kInputNames[1], "has " + std::to_string(shape[1][0]) + " rows but input has " +
                                     std::to_string(s.tokens) + " tokens");
  }
  if (s.experts <= 0) return error(kInputNames[1], "has no experts (shape " + shape_str(shape[1]) + ")");
  if (attrs.k > s.experts) {
    return error("", "attribute k=" + std::to_string(attrs.k) + " exceeds the number of experts (" +
                         std::to_string(s.experts) + ")");
  }
  if (shape[4].size() != 3) return error(kInputNames[4], "has shape " + shape_str(shape[4]) + "; expected [num_experts, hidden, inter]");
  s.inter = shape[4][2];
  const bool gated = hinamoe::is_gated(attrs.activation);
  const bool fused = gated && attrs.gate_layout != hinamoe::GateLayout::Separate;
  const int64_t n1 = fused ? 2 * s.inter : s.inter;

  auto expect = [&](int idx, const std::vector<int64_t>& want, const std::string& what) -> OrtStatus* {
    if (in[idx] == nullptr) return nullptr;
    if (shape[idx] != want) {
      return error(kInputNames[idx], "has shape " + shape_str(shape[idx]) + "; expected " + shape_str(want) + " (" + what + ")");
    }
    return nullptr;
  };
  const std::string e = "E=" + std::to_string(s.experts), h = "H=" + std::to_string(s.hidden),
                    i_ = "I=" + std::to_string(s.inter),
                    n1_ = (fused ? "2*I=" : "I=") + std::to_string(n1);
  HINA_RETURN_IF_ERROR(expect(2, {s.experts, n1, s.hidden}, e + ", " + n1_ + ", " + h));
  HINA_RETURN_IF_ERROR(expect(3, {s.experts, n1}, e + ", " + n1_));
  HINA_RETURN_IF_ERROR(expect(4, {s.experts, s.hidden, s.inter}, e + ", " + h + ", " + i_));
  HINA_RETURN_IF_ERROR(expect(5, {s.experts, s.hidden}, e + ", " + h));
  HINA_RETURN_IF_ERROR(expect(6, {s.experts, s.inter, s.hidden}, e + ", " + i_ + ", " + h));
  HINA_RETURN_IF_ERROR(expect(7, {s.experts, s.inter}, e + ", " + i_));
  if (s.inter <= 0) return error(kInputNames[4], "has an empty intermediate dimension");

  hinamoe::MoETensors t;
  t.dtype = to_dtype(in[0].GetTensorTypeAndShapeInfo().GetElementType());
  auto data = [&](int i) { return in[i] == nullptr ? nullptr : in[i].GetTensorRawData(); };
  t.input = data(0);
  t.router = data(1);
  t.fc1_w = data(2);
  t.fc1_b = data(3);
  t.fc2_w = data(4);
  t.fc2_b = data(5);
  t.fc3_w = data(6);
  t.fc3_b = data(7);

  Ort::UnownedValue out = ctx.GetOutput(0, xs);
  t.output = s.tokens > 0 ? out.GetTensorMutableRawData() : nullptr;

  const hinamoe::Parallel par = ort_parallel(ctx);
  // Validates attributes against the shapes, then runs (nothing for 0 tokens).
  hinamoe::MoEOptions opt;
  opt.topology = topology.get();
  opt.plans = &plans;
  const std::string why = hinamoe::moe_ffn(s, attrs, t, *tier, par, opt);
  if (!why.empty()) return error("", why);
  return nullptr;
}

}  // namespace

OrtStatus* ORT_API_CALL create_moe_kernel(void*, const OrtKernelInfo* info, OrtKernelImpl** out) noexcept {
  *out = nullptr;
  HINA_API_BEGIN
  auto kernel = std::make_unique<MoEKernel>();
  Ort::ConstKernelInfo ki{info};
  const HinaEp* ep = nullptr;
  std::string why;
  HINA_RETURN_IF_ERROR(creating_ep(info, &kernel->node_name, &ep, &why));
  if (!why.empty()) return kernel->error("", why);

  if (read_moe_attrs(kernel_info_attrs(info), &kernel->attrs, &why) != AttrVerdict::Ok) return kernel->error("", why);

  // E is usually static in the graph: report k > E when the session is created.
  why = k_exceeds_static_experts(ki, kernel->attrs.k);
  if (!why.empty()) return kernel->error("", why);

  const HinaEp::Options& options = ep->options();
  kernel->tier = options.tier;
  kernel->topology = options.topology;
  *out = kernel.release();
  return nullptr;
  HINA_API_END
}

}  // namespace hinamoe_ep
