// Internal to the MoE driver: how its phases are cut into work items, and
// the two ways of computing the per-route expert outputs (row-streaming
// tiers, with optional NUMA partitioning; token-transforming AMX tiers).
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "moe_ffn.h"
#include "numa/plan_cache.h"
#include "numa/segment_table.h"
#include "numa/topology.h"
#include "routing.h"

namespace hinamoe {
namespace detail {
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
inline std::vector<Item> make_items(const Routes& routes, int64_t experts, int64_t rows, int threads,
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

// Runs up(item) for every gate/up item, then down(item) for every down item,
// in ONE pass over the pool instead of two: the down items come after all
// gate/up items in claim order, and each waits only until the gate/up items
// of its own expert are done. A thread that finishes its last gate/up item
// starts streaming down weights at once rather than idling at a barrier while
// another thread finishes its item (MoE with small experts, e.g. Qwen3 at one
// token per expert: +10-15% by in-process A/B on this machine; neutral on
// DeepSeek-V3-sized experts).
// Deadlock-free because Parallel claims items in increasing index order
// (parallel.h): a waiting thread waits only on lower items that running
// threads have claimed. up must not throw. finish(e), when given, runs once
// per expert after its last gate/up item and before its down items start
// (the QMoE driver quantises the expert's activations there).
template <class Up, class Down, class Finish>
void run_up_then_down(const Parallel& par, const std::vector<Item>& up_items, const std::vector<Item>& down_items,
                      int64_t experts, Up&& up, Down&& down, Finish&& finish) {
  // pending[e] = e's gate/up items not done + 1 while finish(e) has not run.
  std::vector<std::atomic<int>> pending(static_cast<size_t>(experts));
  for (auto& p : pending) p.store(1, std::memory_order_relaxed);
  for (const Item& it : up_items) pending[size_t(it.expert)].fetch_add(1, std::memory_order_relaxed);
  const size_t n_up = up_items.size();
  par.for_each(n_up + down_items.size(), [&](size_t i) {
    if (i < n_up) {
      const int64_t e = up_items[i].expert;
      up(up_items[i]);
      if (pending[size_t(e)].fetch_sub(1, std::memory_order_acq_rel) == 2) {  // e's last gate/up item
        finish(e);
        pending[size_t(e)].fetch_sub(1, std::memory_order_release);
      }
      return;
    }
    const Item& it = down_items[i - n_up];
    for (int spins = 0; pending[size_t(it.expert)].load(std::memory_order_acquire) > 0; ++spins) {
      if (spins >= 64) std::this_thread::yield();
    }
    down(it);
  });
}

template <class Up, class Down>
void run_up_then_down(const Parallel& par, const std::vector<Item>& up_items, const std::vector<Item>& down_items,
                      int64_t experts, Up&& up, Down&& down) {
  run_up_then_down(par, up_items, down_items, experts, up, down, [](int64_t) {});
}

// Row stride for float scratch: a multiple of 16 floats, nudged off multiples
// of 2 KiB so the rows of a token tile do not share L1 sets (measured ~5% on
// power-of-two hidden sizes).
inline int64_t padded_ld(int64_t n) {
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

// The state of one partitioned moe_ffn call.
struct NumaRun {
  const numa::Topology* topo = nullptr;
  numa::PlanCache* cache = nullptr;
  int64_t page_size = 0;
  int nodes = 1;
  std::atomic<int64_t> phases{0}, items{0}, stolen{0};

  void report(MoEStats* stats) const {
    if (stats == nullptr) return;
    stats->partitioned_phases = phases.load();
    stats->partition_items = items.load();
    stats->stolen_items = stolen.load();
  }
};

// The partitioned run of opt's topology: null with one node or none (the
// plain path: one branch, nothing else), or on a bad page size (*err set).
inline std::unique_ptr<NumaRun> make_numa_run(const MoEOptions& opt, std::string* err) {
  if (opt.topology == nullptr || opt.topology->num_nodes() <= 1) return nullptr;
  if (opt.page_size < 0 || opt.page_size % 4 != 0) {
    *err = "NUMA page size " + std::to_string(opt.page_size) + " is not a non-negative multiple of 4";
    return nullptr;
  }
  static numa::PlanCache* const process_plans = new numa::PlanCache();  // never destroyed: used at exit
  std::unique_ptr<NumaRun> nr(new NumaRun());
  nr->topo = opt.topology;
  nr->cache = opt.plans ? opt.plans : process_plans;
  nr->page_size = opt.page_size;
  nr->nodes = opt.topology->num_nodes();
  return nr;
}

// Everything on node 0: the table used when a weight has no plan (cannot
// happen for valid shapes; kept so a planning failure costs locality only).
inline std::shared_ptr<const numa::SegmentTable> node0_table(int64_t rows, int64_t cols, int bits, int nodes) {
  auto t = std::make_shared<numa::SegmentTable>(numa::single_node_table(rows, cols, bits));
  t->nodes = nodes;
  t->segments.resize(size_t(nodes));
  t->row_begin.resize(size_t(nodes), std::vector<int64_t>{0, 0});
  return t;
}

// The (cached) segment table of weight W [rows, cols] of `bits`-wide
// elements, boundaries snapped to `granule` elements (numa::snap_segments).
inline std::shared_ptr<const numa::SegmentTable> weight_table(NumaRun& nr, const void* W, int64_t rows, int64_t cols,
                                                              int bits, int64_t granule = 1) {
  std::string err;
  auto t = nr.cache->get(*nr.topo, W, rows, cols, bits, nr.page_size, &err, granule);
  if (!t || t->nodes != nr.nodes || t->rows != rows || t->cols != cols) return node0_table(rows, cols, bits, nr.nodes);
  return t;
}

inline std::shared_ptr<const numa::SegmentTable> weight_table(NumaRun& nr, const void* W, int64_t rows, int64_t cols,
                                                              DType dt) {
  return weight_table(nr, W, rows, cols, int(dtype_size(dt)) * 8);
}

// Runs fn(node, item, tmp) for every node and item in [0, n_items):
// par.threads workers each start on the node they run on
// (topology->current_node()), claim that node's items, then steal the other
// nodes' in ring order, so every node's share is done even where no worker
// sits on it. tmp is a per-worker scratch vector. Counts the phase and its
// items in nr.
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

// dst[m*ld + c] += sum_{node=1..nodes-1} part[(node-1)*node_stride + m*ld + c]
// for m < M, c in [c0, c1): the partials of nodes 1.. added in node order.
inline void add_partials(float* dst, const float* part, int nodes, int64_t node_stride, int64_t M, int64_t ld,
                         int64_t c0, int64_t c1) {
  for (int n = 1; n < nodes; ++n) {
    const float* p = part + (n - 1) * node_stride;
    for (int64_t m = 0; m < M; ++m) {
      float* d = dst + m * ld;
      const float* q = p + m * ld;
      for (int64_t c = c0; c < c1; ++c) d[c] += q[c];
    }
  }
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
