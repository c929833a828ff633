// The MoE driver: route -> gather per expert -> gate/up GEMM + activation ->
// down GEMM -> weighted combine. All math in float32; T only at the edges.
//
// Work split: phase 1 items are (expert, block of intermediate indices j),
// phase 2 items are (expert, block of hidden rows). Every token routed to an
// expert shares one pass over each weight row (gemm_rows), so weights stream
// from memory once per call however many tokens hit the expert.
//
// NUMA (MoEOptions::topology with > 1 node, row-streaming path): each GEMM
// phase becomes (a) node-partitioned items (node, expert, row block): a
// worker claims the items of the node it runs on first, then steals the
// other nodes' (nodes without CPUs, fake topologies), and computes partial
// sums over that node's local segments of the expert weight (segment table
// from the plan cache) into the node's partial buffer (node 0's is the
// phase's output buffer itself); then (b) per (expert, row block) the
// partials of nodes 1.. are added in node order and the epilogue (bias,
// activation) runs. One node: a single branch, then the unchanged path.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "activation.h"
#include "moe_ffn.h"
#include "numa/plan_cache.h"
#include "numa/segment_table.h"
#include "numa/topology.h"
#include "routing.h"

namespace hinamoe {
namespace {

// Bound on per-call scratch; larger batches run in token chunks.
constexpr int64_t kScratchBudgetBytes = int64_t(256) << 20;
// Serial below this many float elements: a parallel phase costs a few us.
constexpr int64_t kParallelMinElems = int64_t(1) << 16;

struct Item {
  int32_t expert;
  int32_t b0, b1;  // block [b0, b1) of j (phase 1) or of hidden rows (phase 2)
};

// Splits each active expert's `rows` into blocks (multiples of 8) so that the
// items have about equal cost and there are >= ~8 per thread. Cost of an
// expert is rows * (kStream + tokens): the weight stream is paid once, the
// FMAs per token.
std::vector<Item> make_items(const Routes& routes, int64_t experts, int64_t rows, int threads,
                             int64_t align = 8) {
  constexpr int64_t kStream = 4;
  int64_t total = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t m = routes.expert_begin[e + 1] - routes.expert_begin[e];
    if (m > 0) total += rows * (kStream + m);
  }
  // 8 per thread: dynamic scheduling then evens out threads slowed by other load.
  const int64_t want_items = 8 * int64_t(std::max(threads, 1));
  const double target = double(total) / double(want_items);
  std::vector<Item> items;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t m = routes.expert_begin[e + 1] - routes.expert_begin[e];
    if (m == 0) continue;
    int64_t nblk = threads <= 1 ? 1 : int64_t(double(rows * (kStream + m)) / target + 0.999);
    nblk = std::max<int64_t>(1, nblk);
    int64_t blk = (rows + nblk - 1) / nblk;
    blk = (blk + align - 1) / align * align;
    for (int64_t b = 0; b < rows; b += blk)
      items.push_back({int32_t(e), int32_t(b), int32_t(std::min(rows, b + blk))});
  }
  return items;
}

// Row stride for float scratch: a multiple of 16 floats, nudged off multiples
// of 2 KiB so the rows of a token tile do not share L1 sets (measured ~5% on
// power-of-two hidden sizes).
int64_t padded_ld(int64_t n) {
  int64_t ld = (n + 15) / 16 * 16;
  if (ld % 512 == 0) ld += 16;
  return ld;
}

template <class F>
void maybe_parallel(const Parallel& par, int64_t n, int64_t elems, F&& f) {
  if (elems < kParallelMinElems || par.threads <= 1) {
    for (int64_t i = 0; i < n; ++i) f(size_t(i));
  } else {
    par.for_each(size_t(n), f);
  }
}

// ---- NUMA partitioning ----

// The state of one partitioned moe_ffn call.
struct NumaRun {
  const numa::Topology* topo = nullptr;
  numa::PlanCache* cache = nullptr;
  int64_t page_size = 0;
  int nodes = 1;
  std::atomic<int64_t> phases{0}, items{0}, stolen{0};
};

// Everything on node 0: the table used when a weight has no plan (cannot
// happen for valid shapes; kept so a planning failure costs locality only).
std::shared_ptr<const numa::SegmentTable> node0_table(int64_t rows, int64_t cols, int bits, int nodes) {
  auto t = std::make_shared<numa::SegmentTable>(numa::single_node_table(rows, cols, bits));
  t->nodes = nodes;
  t->segments.resize(size_t(nodes));
  t->row_begin.resize(size_t(nodes), std::vector<int64_t>{0, 0});
  return t;
}

std::shared_ptr<const numa::SegmentTable> weight_table(NumaRun& nr, const void* W, int64_t rows, int64_t cols,
                                                       DType dt) {
  const int bits = int(dtype_size(dt)) * 8;
  std::string err;
  auto t = nr.cache->get(*nr.topo, W, rows, cols, bits, nr.page_size, &err);
  if (!t || t->nodes != nr.nodes || t->rows != rows || t->cols != cols) return node0_table(rows, cols, bits, nr.nodes);
  return t;
}

// One node's partial of rows [r0, r1) of W [*, K]:
//   P[m*ldp + (r - r0)] = sum over the node's segments (r, k0, k1) of
//                         sum_{k in [k0, k1)} W[r*K + k] * X[m*ldx + k]
// (0 for rows without a local segment). Rows r and r + Tx (Tx = the table's
// period) have the same segments, so each segment of a residue row is one
// strided GEMM over the rows r, r + Tx, ... < r1 (ldw = Tx*K): straight into
// P when Tx == 1 and the row has one segment, else via tmp.
void node_partial(const numa::SegmentTable& tb, int node, const KernelTier& tier, DType dt, const void* W,
                  int64_t K, int64_t r0, int64_t r1, const float* X, int64_t ldx, int64_t M, float* P, int64_t ldp,
                  std::vector<float>& tmp) {
  if (M <= 0 || r1 <= r0) return;
  const size_t es = dtype_size(dt);
  const char* w = static_cast<const char*>(W);
  const GemmRowsStridedFn strided = tier.gemm_rows_strided[int(dt)];
  const GemmRowsFn rows = tier.gemm_rows[int(dt)];
  // out[m*ldo + i] = segment dot of row r + i*step, i < cnt.
  auto seg = [&](int64_t r, int64_t step, int64_t cnt, int64_t k0, int64_t k1, float* out, int64_t ldo) {
    const char* wp = w + size_t(r * K + k0) * es;
    if (strided != nullptr) {
      strided(wp, step * K, k1 - k0, 0, cnt, X + k0, ldx, M, out, ldo);
    } else {
      for (int64_t i = 0; i < cnt; ++i) rows(wp + size_t(i * step * K) * es, k1 - k0, 0, 1, X + k0, ldx, M, out + i, ldo);
    }
  };
  const int64_t Tx = std::max<int64_t>(1, tb.period_rows);
  const bool have = node < tb.nodes;
  const int64_t rlim = std::min(r1, r0 + Tx);  // one row per residue class present in [r0, r1)
  for (int64_t r = r0; r < rlim; ++r) {
    const int64_t rho = r % Tx;
    const int64_t s0 = have ? tb.row_begin[size_t(node)][size_t(rho)] : 0;
    const int64_t s1 = have ? tb.row_begin[size_t(node)][size_t(rho) + 1] : 0;
    const int64_t cnt = (r1 - r + Tx - 1) / Tx;
    if (Tx == 1 && s1 - s0 == 1) {
      const numa::Segment& sg = tb.segments[size_t(node)][size_t(s0)];
      seg(r, 1, cnt, sg.k_start, sg.k_end, P + (r - r0), ldp);
      continue;
    }
    if (s1 == s0) {
      for (int64_t m = 0; m < M; ++m)
        for (int64_t i = 0; i < cnt; ++i) P[m * ldp + (r - r0) + i * Tx] = 0.0f;
      continue;
    }
    if (tmp.size() < size_t(M * cnt)) tmp.resize(size_t(M * cnt));
    for (int64_t si = s0; si < s1; ++si) {
      const numa::Segment& sg = tb.segments[size_t(node)][size_t(si)];
      seg(r, Tx, cnt, sg.k_start, sg.k_end, tmp.data(), cnt);
      for (int64_t m = 0; m < M; ++m) {
        float* p = P + m * ldp + (r - r0);
        const float* q = tmp.data() + m * cnt;
        if (si == s0) {
          for (int64_t i = 0; i < cnt; ++i) p[i * Tx] = q[i];
        } else {
          for (int64_t i = 0; i < cnt; ++i) p[i * Tx] += q[i];
        }
      }
    }
  }
}

// Runs fn(node, item) for every node and item in [0, n_items): par.threads
// workers each start on the node they run on (topology->current_node()),
// claim that node's items, then steal the other nodes' in ring order, so
// every node's share is done even where no worker sits on it.
template <class F>
void run_node_items(const Parallel& par, NumaRun& nr, size_t n_items, F&& fn) {
  struct alignas(64) Counter {
    std::atomic<size_t> next{0};
  };
  std::vector<Counter> queue(size_t(nr.nodes));
  par.for_each(size_t(std::max(par.threads, 1)), [&](size_t) {
    const int home = nr.topo->current_node() % nr.nodes;
    int64_t done = 0, stolen = 0;
    std::vector<float> tmp;
    for (int d = 0; d < nr.nodes; ++d) {
      const int node = (home + d) % nr.nodes;
      for (;;) {
        const size_t i = queue[size_t(node)].next.fetch_add(1, std::memory_order_relaxed);
        if (i >= n_items) break;
        fn(node, i, tmp);
        ++done;
        stolen += d != 0;
      }
    }
    nr.items.fetch_add(done, std::memory_order_relaxed);
    nr.stolen.fetch_add(stolen, std::memory_order_relaxed);
  });
  nr.phases.fetch_add(1, std::memory_order_relaxed);
}

// dst[m*ld + c] += sum_{node=1..nodes-1} part[(node-1)*node_stride + m*ld + c] for c in [c0, c1).
void add_partials(float* dst, const float* part, int nodes, int64_t node_stride, int64_t M, int64_t ld, int64_t c0,
                  int64_t c1) {
  for (int n = 1; n < nodes; ++n) {
    const float* p = part + (n - 1) * node_stride;
    for (int64_t m = 0; m < M; ++m) {
      float* d = dst + m * ld;
      const float* q = p + m * ld;
      for (int64_t c = c0; c < c1; ++c) d[c] += q[c];
    }
  }
}

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

// Row-streaming tiers: per-route expert outputs y [R, H] (float) from
// gemm_rows over the weight rows in place.
std::vector<float> expert_outputs_rows(const MoEShape& shape, const MoEAttrs& at, const MoETensors& t,
                                       int64_t t0, const Routes& routes, const KernelTier& tier,
                                       const Parallel& par, NumaRun* nr) {
  const int64_t H = shape.hidden, I = shape.inter, E = shape.experts;
  const bool gated = is_gated(at.activation);
  const int64_t N1 = gated ? 2 * I : I;  // scratch row: [gate | up] or interleaved pairs
  // fc1 rows per expert: 2I when gate and up are fused in fc1, else I.
  const int64_t F1 = gated && at.gate_layout != GateLayout::Separate ? 2 * I : I;
  const DType dt = t.dtype;
  const size_t es = dtype_size(dt);
  const GemmRowsFn gemm = tier.gemm_rows[int(dt)];
  const int64_t R = routes.count();
  const int64_t* begin = routes.expert_begin.data();

  // xs: gathered inputs [R, ldx], reused as the per-route down outputs [R, H]
  // after phase 1; act: activations [R, lda].
  const int64_t ldx = padded_ld(H), lda = padded_ld(I);
  std::vector<float> xs(size_t(R * ldx)), h1(size_t(R * N1)), act(size_t(R * lda));

  // Gather each expert's tokens (grouped order) as float rows.
  {
    const int64_t chunk = 16;
    const char* in = static_cast<const char*>(t.input) + t0 * H * es;
    maybe_parallel(par, (R + chunk - 1) / chunk, R * H, [&](size_t c) {
      const int64_t p1 = std::min(R, int64_t(c) * chunk + chunk);
      for (int64_t p = int64_t(c) * chunk; p < p1; ++p) {
        const int64_t tok = routes.token[p];
        float* dst = &xs[p * ldx];
        if (dt == DType::F32) {
          std::memcpy(dst, in + tok * H * 4, size_t(H) * 4);
        } else {
          for (int64_t h = 0; h < H; ++h) dst[h] = load_as_f32(in, tok * H + h, dt);
        }
      }
    });
  }

  // Phase 1: gate/up GEMM, fc1/fc3 bias, activation -> act [R, I].
  {
    const std::vector<Item> items = make_items(routes, E, I, par.threads);
    const char* fc1 = static_cast<const char*>(t.fc1_w);
    const char* fc3 = static_cast<const char*>(t.fc3_w);
    // Epilogue of an item: bias (per fc1/fc3 row), then the activation.
    auto epilogue = [&](const Item& it) {
      const int64_t e = it.expert, j0 = it.b0, j1 = it.b1;
      const int64_t p0 = begin[e], M = begin[e + 1] - p0;
      const float* Y = &h1[p0 * N1];
      for (int64_t m = 0; m < M; ++m) {
        const float* y = Y + m * N1;
        float* a = &act[(p0 + m) * lda];
        if (!gated) {
          for (int64_t j = j0; j < j1; ++j) {
            const float b = t.fc1_b ? load_as_f32(t.fc1_b, e * F1 + j, dt) : 0.0f;
            a[j] = activate(at.activation, y[j] + b);
          }
          continue;
        }
        const bool inter = at.gate_layout == GateLayout::Interleaved;
        for (int64_t j = j0; j < j1; ++j) {
          const int64_t gi = inter ? 2 * j : j, ui = inter ? 2 * j + 1 : I + j;
          float g = y[gi], u = y[ui];
          if (t.fc1_b) g += load_as_f32(t.fc1_b, e * F1 + gi, dt);
          if (at.gate_layout == GateLayout::Separate) {
            if (t.fc3_b) u += load_as_f32(t.fc3_b, e * I + j, dt);
          } else if (t.fc1_b) {
            u += load_as_f32(t.fc1_b, e * F1 + ui, dt);
          }
          a[j] = activate_gated(at, g, u);
        }
      }
    };
    if (nr == nullptr) {
      par.for_each(items.size(), [&](size_t i) {
        const Item it = items[i];
        const int64_t e = it.expert, j0 = it.b0, j1 = it.b1;
        const int64_t p0 = begin[e], M = begin[e + 1] - p0;
        const float* X = &xs[p0 * ldx];
        float* Y = &h1[p0 * N1];
        const void* w1 = fc1 + e * F1 * H * es;
        if (!gated) {
          gemm(w1, H, j0, j1, X, ldx, M, Y + j0, N1);
        } else if (at.gate_layout == GateLayout::Interleaved) {
          gemm(w1, H, 2 * j0, 2 * j1, X, ldx, M, Y + 2 * j0, N1);
        } else if (at.gate_layout == GateLayout::Stacked) {
          gemm(w1, H, j0, j1, X, ldx, M, Y + j0, N1);
          gemm(w1, H, I + j0, I + j1, X, ldx, M, Y + I + j0, N1);
        } else {
          gemm(w1, H, j0, j1, X, ldx, M, Y + j0, N1);
          gemm(fc3 + e * I * H * es, H, j0, j1, X, ldx, M, Y + I + j0, N1);
        }
        epilogue(it);
      });
    } else {
      // (a) node partials: node 0 into h1, node n > 0 into part[n - 1].
      const int nodes = nr->nodes;
      std::vector<std::shared_ptr<const numa::SegmentTable>> tab1(static_cast<size_t>(E)), tab3(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        if (begin[e + 1] == begin[e]) continue;
        tab1[e] = weight_table(*nr, fc1 + e * F1 * H * es, F1, H, dt);
        if (gated && at.gate_layout == GateLayout::Separate) tab3[e] = weight_table(*nr, fc3 + e * I * H * es, I, H, dt);
      }
      const int64_t stride = R * N1;
      std::vector<float> part(size_t((nodes - 1) * stride));
      run_node_items(par, *nr, items.size(), [&](int node, size_t i, std::vector<float>& tmp) {
        const Item it = items[i];
        const int64_t e = it.expert, j0 = it.b0, j1 = it.b1;
        const int64_t p0 = begin[e], M = begin[e + 1] - p0;
        const float* X = &xs[p0 * ldx];
        float* Y = (node == 0 ? h1.data() : &part[(node - 1) * stride]) + p0 * N1;
        const void* w1 = fc1 + e * F1 * H * es;
        const numa::SegmentTable& t1 = *tab1[e];
        if (!gated) {
          node_partial(t1, node, tier, dt, w1, H, j0, j1, X, ldx, M, Y + j0, N1, tmp);
        } else if (at.gate_layout == GateLayout::Interleaved) {
          node_partial(t1, node, tier, dt, w1, H, 2 * j0, 2 * j1, X, ldx, M, Y + 2 * j0, N1, tmp);
        } else if (at.gate_layout == GateLayout::Stacked) {
          node_partial(t1, node, tier, dt, w1, H, j0, j1, X, ldx, M, Y + j0, N1, tmp);
          node_partial(t1, node, tier, dt, w1, H, I + j0, I + j1, X, ldx, M, Y + I + j0, N1, tmp);
        } else {
          node_partial(t1, node, tier, dt, w1, H, j0, j1, X, ldx, M, Y + j0, N1, tmp);
          node_partial(*tab3[e], node, tier, dt, fc3 + e * I * H * es, H, j0, j1, X, ldx, M, Y + I + j0, N1, tmp);
        }
      });
      // (b) reduction in node order, then the epilogue.
      par.for_each(items.size(), [&](size_t i) {
        const Item it = items[i];
        const int64_t e = it.expert, j0 = it.b0, j1 = it.b1;
        const int64_t p0 = begin[e], M = begin[e + 1] - p0;
        float* Y = &h1[p0 * N1];
        const float* Pp = part.data() + p0 * N1;
        if (!gated) {
          add_partials(Y, Pp, nodes, stride, M, N1, j0, j1);
        } else if (at.gate_layout == GateLayout::Interleaved) {
          add_partials(Y, Pp, nodes, stride, M, N1, 2 * j0, 2 * j1);
        } else {
          add_partials(Y, Pp, nodes, stride, M, N1, j0, j1);
          add_partials(Y, Pp, nodes, stride, M, N1, I + j0, I + j1);
        }
        epilogue(it);
      });
    }
  }

  // Phase 2: down GEMM + fc2 bias -> per-route rows (into xs).
  float* yr = xs.data();
  {
    const std::vector<Item> items = make_items(routes, E, H, par.threads);
    const char* fc2 = static_cast<const char*>(t.fc2_w);
    auto add_bias = [&](const Item& it) {
      if (!t.fc2_b) return;
      const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
      for (int64_t n = it.b0; n < it.b1; ++n) {
        const float b = load_as_f32(t.fc2_b, e * H + n, dt);
        for (int64_t m = 0; m < M; ++m) yr[(p0 + m) * H + n] += b;
      }
    };
    if (nr == nullptr) {
      par.for_each(items.size(), [&](size_t i) {
        const Item it = items[i];
        const int64_t e = it.expert, n0 = it.b0, n1 = it.b1;
        const int64_t p0 = begin[e], M = begin[e + 1] - p0;
        gemm(fc2 + e * H * I * es, I, n0, n1, &act[p0 * lda], lda, M, yr + p0 * H + n0, H);
        add_bias(it);
      });
    } else {
      const int nodes = nr->nodes;
      std::vector<std::shared_ptr<const numa::SegmentTable>> tab2(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e)
        if (begin[e + 1] > begin[e]) tab2[e] = weight_table(*nr, fc2 + e * H * I * es, H, I, dt);
      const int64_t stride = R * H;
      std::vector<float> part(size_t((nodes - 1) * stride));
      run_node_items(par, *nr, items.size(), [&](int node, size_t i, std::vector<float>& tmp) {
        const Item it = items[i];
        const int64_t e = it.expert, n0 = it.b0, n1 = it.b1;
        const int64_t p0 = begin[e], M = begin[e + 1] - p0;
        float* Y = (node == 0 ? yr : &part[(node - 1) * stride]) + p0 * H;
        node_partial(*tab2[e], node, tier, dt, fc2 + e * H * I * es, I, n0, n1, &act[p0 * lda], lda, M, Y + n0, H,
                     tmp);
      });
      par.for_each(items.size(), [&](size_t i) {
        const Item it = items[i];
        const int64_t p0 = begin[it.expert], M = begin[it.expert + 1] - p0;
        add_partials(yr + p0 * H, part.data() + p0 * H, nodes, stride, M, H, it.b0, it.b1);
        add_bias(it);
      });
    }
  }

  return xs;
}

// Token-transforming tiers (AMX): gather each expert's tokens into the VNNI
// layout once, then fused gate/up blocks and down blocks. Exceptions from a
// kernel (the emulator's TileError) are caught on the worker thread and
// returned as a message: they must not cross the thread pool.
std::string expert_outputs_blocks(const MoEShape& shape, const MoEAttrs& at, const MoETensors& t, int64_t t0,
                                  const Routes& routes, const ExpertBlockKernels& kb, const Parallel& par,
                                  std::vector<float>* y_out) {
  const int64_t H = shape.hidden, I = shape.inter, E = shape.experts;
  const bool gated = is_gated(at.activation);
  const int64_t F1 = gated && at.gate_layout != GateLayout::Separate ? 2 * I : I;
  const DType dt = t.dtype;  // bf16
  const int64_t R = routes.count();
  const int64_t* begin = routes.expert_begin.data();
  const char* in = static_cast<const char*>(t.input) + t0 * H * 2;

  // Per-expert offsets into the VNNI token and activation buffers.
  std::vector<int64_t> xoff(size_t(E + 1), 0), aoff(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t M = begin[e + 1] - begin[e];
    xoff[e + 1] = xoff[e] + (M ? kb.vnni_elems(H, M) : 0);
    aoff[e + 1] = aoff[e] + (M ? kb.vnni_elems(I, M) : 0);
  }
  std::vector<uint16_t> xv(size_t(xoff[E])), actv(size_t(aoff[E]));
  std::vector<int32_t> rows(static_cast<size_t>(R));
  for (int64_t p = 0; p < R; ++p) rows[p] = int32_t(routes.token[p]);
  y_out->assign(size_t(R * H), 0.0f);
  float* yr = y_out->data();

  std::mutex err_mu;
  std::string err;
  auto guarded = [&](auto&& fn) {
    return [&, fn](size_t i) {
      try {
        fn(i);
      } catch (const std::exception& ex) {
        std::lock_guard<std::mutex> lock(err_mu);
        if (err.empty()) err = ex.what();
      }
    };
  };
  auto w16 = [](const void* base, int64_t off) { return static_cast<const uint16_t*>(base) + off; };
  auto bias = [](const void* base, int64_t off) -> const void* {
    return base ? static_cast<const uint16_t*>(base) + off : nullptr;
  };

  std::vector<int64_t> active;
  for (int64_t e = 0; e < E; ++e)
    if (begin[e + 1] > begin[e]) active.push_back(e);
  par.for_each(active.size(), guarded([&](size_t i) {
    const int64_t e = active[i];
    kb.gather(in, dt, H, &rows[begin[e]], begin[e + 1] - begin[e], &xv[xoff[e]]);
  }));
  if (!err.empty()) return err;

  const std::vector<Item> up_items = make_items(routes, E, I, par.threads, kb.row_block);
  par.for_each(up_items.size(), guarded([&](size_t i) {
    const Item it = up_items[i];
    const int64_t e = it.expert, M = begin[e + 1] - begin[e];
    kb.gate_up(at, H, I, w16(t.fc1_w, e * F1 * H), bias(t.fc1_b, e * F1),
               t.fc3_w ? w16(t.fc3_w, e * I * H) : nullptr, bias(t.fc3_b, e * I), dt, &xv[xoff[e]], M, it.b0,
               it.b1, &actv[aoff[e]]);
  }));
  if (!err.empty()) return err;

  const std::vector<Item> down_items = make_items(routes, E, H, par.threads, kb.row_block);
  par.for_each(down_items.size(), guarded([&](size_t i) {
    const Item it = down_items[i];
    const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
    kb.down(H, I, w16(t.fc2_w, e * H * I), bias(t.fc2_b, e * H), dt, &actv[aoff[e]], M, it.b0, it.b1, nullptr,
            false, yr + p0 * H, H);
  }));
  return err;
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
  std::vector<float> y;
  if (tier.bf16_blocks != nullptr && dt == DType::BF16) {
    err = expert_outputs_blocks(shape, at, t, t0, routes, *tier.bf16_blocks, par, &y);
    if (!err.empty()) return err;
  } else {
    y = expert_outputs_rows(shape, at, t, t0, routes, tier, par, nr);
  }
  const float* yr = y.data();

  // Phase 3: out[t] = sum over its routes (slot order) of weight * y_route.
  {
    const int64_t chunk = 8;
    char* out = static_cast<char*>(t.output) + t0 * H * es;
    maybe_parallel(par, (tokens + chunk - 1) / chunk, tokens * H * k, [&](size_t c) {
      std::vector<float> acc(static_cast<size_t>(H));
      const int64_t q1 = std::min(tokens, int64_t(c) * chunk + chunk);
      for (int64_t q = int64_t(c) * chunk; q < q1; ++q) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t s = 0; s < k; ++s) {
          const int64_t p = routes.slot_pos[q * k + s];
          if (p < 0) continue;
          const float w = routes.weight[p];
          const float* y = yr + p * H;
          for (int64_t h = 0; h < H; ++h) acc[h] += w * y[h];
        }
        if (dt == DType::F32) {
          std::memcpy(out + q * H * 4, acc.data(), size_t(H) * 4);
        } else {
          for (int64_t h = 0; h < H; ++h) store_from_f32(out, q * H + h, dt, acc[h]);
        }
      }
    });
  }
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
  const int64_t N1 = is_gated(attrs.activation) ? 2 * shape.inter : shape.inter;
  int64_t route_bytes = (shape.hidden + N1 + shape.inter + 48) * int64_t(sizeof(float));

  // NUMA: partition only with > 1 node and on the row-streaming path.
  std::unique_ptr<NumaRun> nr;
  const bool blocks = tier.bf16_blocks != nullptr && t.dtype == DType::BF16;
  if (opt.topology != nullptr && opt.topology->num_nodes() > 1 && !blocks) {
    if (opt.page_size < 0 || opt.page_size % 4 != 0)
      return "NUMA page size " + std::to_string(opt.page_size) + " is not a non-negative multiple of 4";
    static numa::PlanCache* const process_plans = new numa::PlanCache();  // never destroyed: used at exit
    nr.reset(new NumaRun());
    nr->topo = opt.topology;
    nr->cache = opt.plans ? opt.plans : process_plans;
    nr->page_size = opt.page_size;
    nr->nodes = opt.topology->num_nodes();
    route_bytes += (nr->nodes - 1) * std::max(N1, shape.hidden) * int64_t(sizeof(float));  // partials
  }

  const int64_t chunk = std::max<int64_t>(1, kScratchBudgetBytes / (route_bytes * attrs.k));
  for (int64_t t0 = 0; t0 < shape.tokens; t0 += chunk) {
    err = run_chunk(shape, attrs, t, t0, std::min(chunk, shape.tokens - t0), tier, par, nr.get());
    if (!err.empty()) break;
  }
  if (opt.stats && nr) {
    opt.stats->partitioned_phases = nr->phases.load();
    opt.stats->partition_items = nr->items.load();
    opt.stats->stolen_items = nr->stolen.load();
  }
  return err;
}

}  // namespace hinamoe
