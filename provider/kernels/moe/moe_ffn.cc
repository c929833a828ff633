// The MoE driver: route -> per-route expert outputs (expert_rows.cc on the
// expert pipeline, or expert_blocks.cc) -> weighted combine. All math in float32; T only at the
// edges.
//
// Work split: phase 1 items are (expert, block of intermediate indices j),
// phase 2 items are (expert, block of hidden rows). Every token routed to an
// expert shares one pass over each weight row, so weights stream from memory
// once per call however many tokens hit the expert.
#include <algorithm>
#include <cstring>
#include <vector>

#include "../scratch.h"
#include "expert_pipeline.h"
#include "moe_ffn.h"
#include "routing.h"

namespace hinamoe {
namespace {

using namespace detail;

const char* act_name(Activation a) {
  switch (a) {
    case Activation::Relu: return "relu";
    case Activation::Gelu: return "gelu";
    case Activation::Silu: return "silu";
    case Activation::Identity: return "identity";
    case Activation::SwiGLU: return "swiglu";
    case Activation::GeGLU: return "geglu";
    case Activation::Relu2: return "relu2";
  }
  return "?";
}

const char* layout_name(GateLayout g) {
  switch (g) {
    case GateLayout::Separate: return "separate";
    case GateLayout::Interleaved: return "interleaved";
    case GateLayout::Stacked: return "stacked";
  }
  return "?";
}

// One chunk of tokens [t0, t0 + tokens): the whole pipeline.
std::string run_chunk(const MoEShape& shape, const MoEAttrs& at, const MoETensors& t, int64_t t0,
                      int64_t tokens, const KernelTier& tier, const Parallel& par, NumaRun* nr) {
  const int64_t H = shape.hidden, E = shape.experts, k = at.k;
  const DType dt = t.dtype;
  const size_t es = dtype_size(dt);

  Routes routes;
  std::string err = compute_routes(static_cast<const char*>(t.router) + t0 * E * es, dt, tokens, E, k,
                                   at.normalize_routing_weights, par, &routes, t0);
  if (!err.empty()) return err;

  // Per-route expert outputs y [R, H] (float), then the weighted combine.
  Scratch<std::vector<float>> y;
  if (tier.bf16_blocks != nullptr && dt == DType::BF16) {
    err = expert_outputs_blocks(shape, at, t, t0, routes, *tier.bf16_blocks, par, nr, &*y);
    if (!err.empty()) return err;
  } else {
    expert_outputs_rows(shape, at, t, t0, routes, tier, par, nr, &*y);
  }
  combine_routes(routes, y->data(), tokens, k, H, dt, static_cast<char*>(t.output) + t0 * H * es, par);
  return "";
}

}  // namespace

std::string validate_moe(const MoEShape& s, const MoEAttrs& a, const MoETensors& t) {
  if (s.tokens < 0) return "tokens=" + std::to_string(s.tokens) + " is negative";
  if (s.tokens > int64_t(0x7fffffff)) return "tokens=" + std::to_string(s.tokens) + " exceeds 2^31-1";
  if (s.hidden <= 0) return "hidden size must be > 0 (got " + std::to_string(s.hidden) + ")";
  if (s.inter <= 0) return "inter size must be > 0 (got " + std::to_string(s.inter) + ")";
  if (s.experts <= 0) return "number of experts must be > 0 (got " + std::to_string(s.experts) + ")";
  if (s.experts > int64_t(0x7fffffff)) return "number of experts exceeds 2^31-1";
  if (a.k < 1) return "k=" + std::to_string(a.k) + " must be at least 1";
  if (a.k > s.experts)
    return "k=" + std::to_string(a.k) + " exceeds the number of experts (" + std::to_string(s.experts) + ")";
  if (int(a.activation) < 0 || int(a.activation) > int(Activation::Relu2))
    return "unknown activation " + std::to_string(int(a.activation));
  if (int(a.gate_layout) < 0 || int(a.gate_layout) > int(GateLayout::Stacked))
    return "unknown gate layout " + std::to_string(int(a.gate_layout));
  if (int(t.dtype) < 0 || int(t.dtype) >= kNumDTypes) return "unknown dtype " + std::to_string(int(t.dtype));
  const bool gated = is_gated(a.activation);
  if (gated && a.gate_layout == GateLayout::Separate && t.fc3_w == nullptr)
    return std::string("activation ") + act_name(a.activation) + " with gate layout separate needs fc3 weights";
  if (t.fc3_w != nullptr && !gated)
    return std::string("fc3 weights given but activation ") + act_name(a.activation) + " is not gated";
  if (t.fc3_w != nullptr && a.gate_layout != GateLayout::Separate)
    return std::string("fc3 weights given but gate layout is ") + layout_name(a.gate_layout) +
           " (fc1 holds gate and up)";
  if (t.fc3_b != nullptr && t.fc3_w == nullptr) return "fc3 bias given without fc3 weights";
  if (s.tokens > 0) {
    if (!t.input) return "input is null";
    if (!t.router) return "router logits are null";
    if (!t.fc1_w) return "fc1 weights are null";
    if (!t.fc2_w) return "fc2 weights are null";
    if (!t.output) return "output is null";
  }
  return "";
}

std::string moe_ffn(const MoEShape& shape, const MoEAttrs& attrs, const MoETensors& t, const KernelTier& tier,
                    const Parallel& par) {
  return moe_ffn(shape, attrs, t, tier, par, MoEOptions{});
}

std::string moe_ffn(const MoEShape& shape, const MoEAttrs& attrs, const MoETensors& t, const KernelTier& tier,
                    const Parallel& par, const MoEOptions& opt) {
  if (opt.stats) *opt.stats = MoEStats{};
  std::string err = validate_moe(shape, attrs, t);
  if (!err.empty()) return err;
  if (shape.tokens == 0) return "";
  if (tier.gemm_rows[int(t.dtype)] == nullptr)
    return std::string("kernel tier '") + tier.name + "' has no " + dtype_name(t.dtype) + " kernel";
  // Per route: gathered tokens, gate/up sums, activations (and the output row).
  auto route_floats = [](const ExpertDims& d) { return d.H + d.N1 + d.I + 48; };
  return run_token_chunks(shape, attrs, route_floats, opt, [&](int64_t t0, int64_t n, NumaRun* nr) {
    return run_chunk(shape, attrs, t, t0, n, tier, par, nr);
  });
}

}  // namespace hinamoe
