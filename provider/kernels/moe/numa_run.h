// The NUMA-partitioned run of one expert pipeline call (more than one node):
// the segment tables of its weights, items claimed node by node, and the
// node-order sums of the partials.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "../numa/plan_cache.h"
#include "../numa/segment_table.h"
#include "../numa/topology.h"
#include "../parallel.h"
#include "moe_ffn.h"

namespace hinamoe {
namespace detail {

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

}  // namespace detail
}  // namespace hinamoe
