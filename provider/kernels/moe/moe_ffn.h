// MoE feed-forward block (route -> group per expert -> gate/up -> activation
// -> down -> weighted combine) over expert weights kept in their general
// [out, in] row-major layout. Plain C++17: no ONNX Runtime types, so the EP,
// the C ABI and the C++ tests all call the same entry point.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "../dtype.h"
#include "../parallel.h"
#include "../tier.h"

namespace hinamoe {

namespace numa {
class Topology;
class PlanCache;
}  // namespace numa

enum class Activation : int {
  Relu = 0,
  Gelu = 1,      // tanh approximation, as ORT's CPU MoE
  Silu = 2,
  Identity = 3,
  SwiGLU = 4,    // G*sigmoid(alpha*G)*(L+beta), G=min(g,limit), L=clamp(l,+-limit)
  GeGLU = 5,     // gelu_tanh(g) * l
  Relu2 = 6,     // relu(x)^2
};

// Where gate and up rows live for gated activations (SwiGLU, GeGLU).
enum class GateLayout : int {
  Separate = 0,     // gate = fc1 [E, I, H], up = fc3 [E, I, H]
  Interleaved = 1,  // fc1 [E, 2I, H]: row 2j = gate j, row 2j+1 = up j
  Stacked = 2,      // fc1 [E, 2I, H]: rows [0,I) gate, [I,2I) up
};

struct MoEAttrs {
  int64_t k = 1;
  Activation activation = Activation::Relu;
  GateLayout gate_layout = GateLayout::Separate;
  bool normalize_routing_weights = false;
  float alpha = 1.0f;
  float beta = 0.0f;
  float limit = INFINITY_F;          // swiglu_limit; +inf = no clamp
  bool limit_after_activation = false;  // clamp the activated gate instead of g
};

struct MoEShape {
  int64_t tokens = 0;   // rows of input (B*S for 3-D input)
  int64_t hidden = 0;   // H
  int64_t inter = 0;    // I
  int64_t experts = 0;  // E
};

// All tensors share one element type (the op's T). Biases and fc3 may be null.
struct MoETensors {
  DType dtype = DType::F32;
  const void* input = nullptr;   // [tokens, H]
  const void* router = nullptr;  // [tokens, E] logits
  const void* fc1_w = nullptr;   // [E, N1, H]; N1 = 2I gated+fused, else I
  const void* fc1_b = nullptr;   // [E, N1]
  const void* fc2_w = nullptr;   // [E, H, I]
  const void* fc2_b = nullptr;   // [E, H]
  const void* fc3_w = nullptr;   // [E, I, H] (GateLayout::Separate only)
  const void* fc3_b = nullptr;   // [E, I]
  void* output = nullptr;        // [tokens, H]
};

// True when the activation takes a gate and an up projection.
inline bool is_gated(Activation a) { return a == Activation::SwiGLU || a == Activation::GeGLU; }

// Checks attributes against the shape (k in [1, E], gate layout vs activation,
// fc3 presence). Returns an empty string when valid, else the reason.
std::string validate_moe(const MoEShape& shape, const MoEAttrs& attrs, const MoETensors& t);

// Counters of one moe_ffn call (for tests and benchmarks).
struct MoEStats {
  int64_t partitioned_phases = 0;  // node-partitioned GEMM phases run (0 on the one-node path)
  int64_t partition_items = 0;     // (node, expert, row block) items computed
  int64_t stolen_items = 0;        // of those, items of a node other than the worker's own
};

// How moe_ffn runs beyond the math: NUMA partitioning (DESIGN.md §4, paper §5).
struct MoEOptions {
  // The NUMA topology (numa/topology.h, e.g. from numa::select_topology):
  // null or one node = the plain path (one branch, nothing else). With more
  // nodes, every weight GEMM of every tier and dtype is split by node: a
  // worker computes, preferably for the node it runs on
  // (topology->current_node()), partial sums over that node's local segments
  // of each expert weight; the partials are added in node order before
  // bias/activation. The AMX tiers' bf16 blocks do the same with the tile
  // micro-kernel (ExpertBlockKernels::node_partial, paper Algorithm 2) and
  // run their fused epilogues (activation into the VNNI layout, down bias)
  // once on the sums. The topology must outlive the call.
  const numa::Topology* topology = nullptr;
  // Where segment tables are cached (one per expert weight, keyed by
  // topology, address and shape; see numa/plan_cache.h). Null = a
  // process-wide cache. An owner of weights that frees or moves them should
  // pass its own cache and clear() it then (stale entries cost locality,
  // never correctness: every table covers each weight element exactly once).
  numa::PlanCache* plans = nullptr;
  // Page size the plans model; 0 = the system's. (Simulation: small pages
  // give small test weights many segments.) A positive multiple of 4.
  int64_t page_size = 0;
  // When non-null, receives the counters of this call (overwritten).
  MoEStats* stats = nullptr;
};

// Runs the block. Returns an empty string on success, else a message naming
// the problem (e.g. NaN in router logits at a given token). `tier` selects
// the micro-kernels; `par` splits work over the caller's threads.
std::string moe_ffn(const MoEShape& shape, const MoEAttrs& attrs, const MoETensors& t,
                    const KernelTier& tier, const Parallel& par);
std::string moe_ffn(const MoEShape& shape, const MoEAttrs& attrs, const MoETensors& t,
                    const KernelTier& tier, const Parallel& par, const MoEOptions& options);

}  // namespace hinamoe
