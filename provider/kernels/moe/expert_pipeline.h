// One expert pipeline for every weight format: per-route expert outputs
//   y[p] = fc2 . act(fc1/fc3 . x[p] + biases) + fc2 bias
// as (expert, row block) items. The pipeline owns what all formats share:
// the gate/up layouts, the bias + activation epilogue, the work split, the
// NUMA partials and their node-order sums, and the weighted combine. A weight
// format (float rows in expert_rows.cc, quantised codes in qmoe/qmoe_ffn.cc)
// supplies only its GEMMs and where the activations go:
//
//   gemm(fc, e, r0, r1, p0, M, Y, ldy)
//       Y[m*ldy + (r - r0)] = row r of expert e's weight fc (1 or 3: against
//       the gathered tokens, 2: against the activations) for the M routes
//       from p0, r in [r0, r1).
//   prepare_numa(nr, e)                  segment tables of expert e's weights
//   node_gemm(node, fc, e, r0, r1, p0, M, Y, ldy, tmp)
//       gemm over the node's local segments of the rows (0 where none).
//   put(p, j, v)                         activation j of route p
//   activations_done(e)                  after expert e's last gate/up item,
//                                        before its down items (int8 codes,
//                                        tiles of the activations)
//
// The AMX tiers' token-transforming kernels (expert_blocks.cc) fuse the
// epilogues into their blocks and share only the row ranges and the combine.
#pragma once

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "activation.h"
#include "../tuning.h"
#include "numa_run.h"
#include "work_items.h"

namespace hinamoe {
namespace detail {

// The sizes every stage of one call needs.
struct ExpertDims {
  int64_t H, I, E;
  bool gated;
  int64_t N1;  // gate/up sums per route: 2I when gated ([gate | up] or interleaved pairs), else I
  int64_t F1;  // fc1 rows per expert: 2I when fc1 holds gate and up, else I
  ExpertDims(const MoEShape& s, const MoEAttrs& a)
      : H(s.hidden),
        I(s.inter),
        E(s.experts),
        gated(is_gated(a.activation)),
        N1(gated ? 2 * s.inter : s.inter),
        F1(gated && a.gate_layout != GateLayout::Separate ? 2 * s.inter : s.inter) {}
};

// Rows [a, b) of a gate/up weight for the block [j0, j1) of intermediate
// indices: fc3 (Separate layout) or fc1, and the column `out` of the route's
// N1 sums where row a lands.
struct RowRange {
  bool fc3;
  int64_t a, b, out;
};

inline int gate_up_ranges(const MoEAttrs& at, int64_t I, int64_t j0, int64_t j1, RowRange r[2]) {
  if (!is_gated(at.activation)) {
    r[0] = {false, j0, j1, j0};
    return 1;
  }
  switch (at.gate_layout) {
    case GateLayout::Interleaved:
      r[0] = {false, 2 * j0, 2 * j1, 2 * j0};
      return 1;
    case GateLayout::Stacked:
      r[0] = {false, j0, j1, j0};
      r[1] = {false, I + j0, I + j1, I + j0};
      return 2;
    default:
      r[0] = {false, j0, j1, j0};
      r[1] = {true, j0, j1, I + j0};
      return 2;
  }
}

// The experts' biases, each [E, rows] of dtype dt; null where absent.
struct ExpertBiases {
  const void* fc1 = nullptr;
  const void* fc3 = nullptr;
  const void* fc2 = nullptr;
  DType dt = DType::F32;
};

// Bias + activation of intermediate indices [j0, j1) for the M routes from
// p0 of expert e; h holds the routes' N1 sums (rows N1 apart, route p0 first).
template <class Put>
void gate_up_epilogue(const ExpertDims& d, const MoEAttrs& at, const ExpertBiases& b, int64_t e, int64_t p0,
                      int64_t M, const float* h, int64_t j0, int64_t j1, Put&& put) {
  const int64_t I = d.I, F1 = d.F1;
  const bool inter = at.gate_layout == GateLayout::Interleaved;
  for (int64_t m = 0; m < M; ++m) {
    const float* y = h + m * d.N1;
    const int64_t p = p0 + m;
    if (!d.gated) {
      for (int64_t j = j0; j < j1; ++j) {
        const float bias = b.fc1 ? load_as_f32(b.fc1, e * F1 + j, b.dt) : 0.0f;
        put(p, j, activate(at.activation, y[j] + bias));
      }
      continue;
    }
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t gi = inter ? 2 * j : j, ui = inter ? 2 * j + 1 : I + j;
      float g = y[gi], u = y[ui];
      if (b.fc1) g += load_as_f32(b.fc1, e * F1 + gi, b.dt);
      if (at.gate_layout == GateLayout::Separate) {
        if (b.fc3) u += load_as_f32(b.fc3, e * I + j, b.dt);
      } else if (b.fc1) {
        u += load_as_f32(b.fc1, e * F1 + ui, b.dt);
      }
      put(p, j, activate_gated(at, g, u));
    }
  }
}

// y[(p0 + m)*H + n] += fc2 bias of expert e, n in [n0, n1), m < M.
inline void add_down_bias(const ExpertDims& d, const ExpertBiases& b, int64_t e, int64_t p0, int64_t M, int64_t n0,
                          int64_t n1, float* y) {
  if (!b.fc2) return;
  for (int64_t n = n0; n < n1; ++n) {
    const float bias = load_as_f32(b.fc2, e * d.H + n, b.dt);
    for (int64_t m = 0; m < M; ++m) y[(p0 + m) * d.H + n] += bias;
  }
}

// The whole pipeline over scratch h1 [R, N1] (gate/up sums) and y [R, H]
// (the routes' outputs); F is the weight format (see the top of this file).
template <class F>
void run_expert_pipeline(const ExpertDims& d, const MoEAttrs& at, const ExpertBiases& b, const Routes& routes,
                         const Parallel& par, NumaRun* nr, F& f, float* h1, float* y) {
  const int64_t H = d.H, N1 = d.N1, E = d.E, R = routes.count();
  const int64_t* begin = routes.expert_begin.data();
  const std::vector<Item> up_items = make_items(routes, E, d.I, par.threads);
  const std::vector<Item> down_items = make_items(routes, E, H, par.threads);
  // gemm(fc, r0, r1, Y) for each weight row range of a gate/up item, Y in
  // the route rows of h (N1 apart).
  auto up_ranges = [&](const Item& it, float* h, auto&& gemm) {
    RowRange rr[2];
    const int n = gate_up_ranges(at, d.I, it.b0, it.b1, rr);
    for (int q = 0; q < n; ++q) gemm(rr[q].fc3 ? 3 : 1, rr[q].a, rr[q].b, h + begin[it.expert] * N1 + rr[q].out);
  };
  auto epilogue = [&](const Item& it) {
    const int64_t e = it.expert, p0 = begin[e];
    gate_up_epilogue(d, at, b, e, p0, begin[e + 1] - p0, h1 + p0 * N1, it.b0, it.b1,
                     [&](int64_t p, int64_t j, float v) { f.put(p, j, v); });
  };

  if (nr == nullptr) {
    run_up_then_down(
        par, up_items, down_items, E,
        [&](const Item& it) {
          const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
          up_ranges(it, h1, [&](int fc, int64_t r0, int64_t r1, float* Y) { f.gemm(fc, e, r0, r1, p0, M, Y, N1); });
          epilogue(it);
        },
        [&](const Item& it) {
          const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
          f.gemm(2, e, it.b0, it.b1, p0, M, y + p0 * H + it.b0, H);
          add_down_bias(d, b, e, p0, M, it.b0, it.b1, y);
        },
        [&](int64_t e) { f.activations_done(e); });
    return;
  }

  // NUMA: each phase as node-partitioned items (node 0 into h1 / y, node n
  // into part[n - 1]), then the partials added in node order and the epilogue.
  for (int64_t e = 0; e < E; ++e)
    if (begin[e + 1] > begin[e]) f.prepare_numa(*nr, e);
  const int nodes = nr->nodes;
  const int64_t stride1 = R * N1, stride2 = R * H;
  std::vector<float> part(size_t((nodes - 1) * std::max(stride1, stride2)));
  run_node_items(par, *nr, up_items.size(), [&](int node, size_t i, std::vector<float>& tmp) {
    const Item& it = up_items[i];
    const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
    float* h = node == 0 ? h1 : &part[size_t((node - 1) * stride1)];
    up_ranges(it, h, [&](int fc, int64_t r0, int64_t r1, float* Y) {
      f.node_gemm(node, fc, e, r0, r1, p0, M, Y, N1, tmp);
    });
  });
  par.for_each(up_items.size(), [&](size_t i) {
    const Item& it = up_items[i];
    const int64_t p0 = begin[it.expert], M = begin[it.expert + 1] - p0;
    RowRange rr[2];
    const int n = gate_up_ranges(at, d.I, it.b0, it.b1, rr);
    for (int q = 0; q < n; ++q)
      add_partials(h1 + p0 * N1, part.data() + p0 * N1, nodes, stride1, M, N1, rr[q].out,
                   rr[q].out + rr[q].b - rr[q].a);
    epilogue(it);
  });
  maybe_parallel(par, E, R * d.I, [&](size_t e) { f.activations_done(int64_t(e)); });
  run_node_items(par, *nr, down_items.size(), [&](int node, size_t i, std::vector<float>& tmp) {
    const Item& it = down_items[i];
    const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
    float* Y = (node == 0 ? y : &part[size_t((node - 1) * stride2)]) + p0 * H;
    f.node_gemm(node, 2, e, it.b0, it.b1, p0, M, Y + it.b0, H, tmp);
  });
  par.for_each(down_items.size(), [&](size_t i) {
    const Item& it = down_items[i];
    const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
    add_partials(y + p0 * H, part.data() + p0 * H, nodes, stride2, M, H, it.b0, it.b1);
    add_down_bias(d, b, e, p0, M, it.b0, it.b1, y);
  });
}

// out[q] = sum over token q's routes (slot order) of weight * y_route, for
// `tokens` tokens of H values, stored as dt.
inline void combine_routes(const Routes& routes, const float* y, int64_t tokens, int64_t k, int64_t H, DType dt,
                           void* out_v, const Parallel& par) {
  char* out = static_cast<char*>(out_v);
  const int64_t chunk = 8;
  maybe_parallel(par, (tokens + chunk - 1) / chunk, tokens * H * k, [&](size_t c) {
    std::vector<float> acc(static_cast<size_t>(H));
    const int64_t q1 = std::min(tokens, int64_t(c) * chunk + chunk);
    for (int64_t q = int64_t(c) * chunk; q < q1; ++q) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t s = 0; s < k; ++s) {
        const int64_t p = routes.slot_pos[size_t(q * k + s)];
        if (p < 0) continue;
        const float w = routes.weight[size_t(p)];
        const float* yr = y + p * H;
        for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += w * yr[h];
      }
      if (dt == DType::F32) {
        std::memcpy(out + q * H * 4, acc.data(), size_t(H) * 4);
      } else {
        for (int64_t h = 0; h < H; ++h) store_from_f32(out, q * H + h, dt, acc[size_t(h)]);
      }
    }
  });
}

// Runs chunk(t0, n, nr) over the tokens in chunks whose scratch fits
// tuning::kExpertScratchBytes: route_floats of float scratch per route (k
// routes a token; a function of the call's ExpertDims), plus the other
// nodes' partial sums when opt partitions by NUMA node. Fills opt.stats;
// returns "" or the first error.
template <class Chunk>
std::string run_token_chunks(const MoEShape& shape, const MoEAttrs& at, int64_t (*route_floats)(const ExpertDims&),
                             const MoEOptions& opt, Chunk&& chunk) {
  std::string err;
  std::unique_ptr<NumaRun> nr = make_numa_run(opt, &err);
  if (!err.empty()) return err;
  const ExpertDims d(shape, at);
  int64_t route_bytes = route_floats(d) * int64_t(sizeof(float));
  if (nr) route_bytes += (nr->nodes - 1) * std::max(d.N1, d.H) * int64_t(sizeof(float));  // partials
  const int64_t n = std::max<int64_t>(1, tuning::kExpertScratchBytes / (route_bytes * at.k));
  for (int64_t t0 = 0; t0 < shape.tokens && err.empty(); t0 += n)
    err = chunk(t0, std::min(n, shape.tokens - t0), nr.get());
  if (nr) nr->report(opt.stats);
  return err;
}

// Row-streaming tiers (expert_rows.cc): per-route expert outputs y [R, H]
// (float, into *y_out) from gemm_rows over the weight rows in place; with nr
// (more than one NUMA node) every GEMM is split by node.
void expert_outputs_rows(const MoEShape& shape, const MoEAttrs& at, const MoETensors& t, int64_t t0,
                         const Routes& routes, const KernelTier& tier, const Parallel& par, NumaRun* nr,
                         std::vector<float>* y_out);

// Token-transforming tiers (expert_blocks.cc, AMX): the same outputs from the
// tier's per-expert gather / gate-up / down blocks; with nr every weight's
// work is split by node (kb.node_partial, then node-order sums and the
// epilogues). Returns "" or an error.
std::string expert_outputs_blocks(const MoEShape& shape, const MoEAttrs& at, const MoETensors& t, int64_t t0,
                                  const Routes& routes, const ExpertBlockKernels& kb, const Parallel& par,
                                  NumaRun* nr, std::vector<float>* y_out);

}  // namespace detail
}  // namespace hinamoe
