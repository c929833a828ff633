// The segment table of a weight where it actually lies, computed once per
// weight and cached (the driver asks per expert weight per call).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "segment_table.h"
#include "topology.h"

namespace hinamoe {
namespace numa {

// Table of the weight [rows, cols] (elem_bits wide) at W under `topo`:
//   * one node: single_node_table (period 1, [0, cols) per row);
//   * fake topology: the interleaved model, offset = W mod P and first node
//     = (W / P) mod Nn (absolute page numbers, as real interleaving);
//   * real multi-node: every page queried once (page_nodes); if they cycle
//     over the nodes, the compact periodic table with the detected first
//     node, else a page-map table following the real placement
//     (first-touch, explicitly bound memory).
// page_size 0 = the system page size. Returns null and sets *error (when
// non-null) on bad parameters.
std::shared_ptr<const SegmentTable> plan_for_weight(const Topology& topo, const void* W, int64_t rows, int64_t cols,
                                                    int elem_bits, int64_t page_size = 0,
                                                    std::string* error = nullptr);

// Thread-safe cache of plan_for_weight keyed by (topology, W, rows, cols,
// elem_bits, page_size, granule). Placement is assumed fixed for a weight's lifetime:
// call clear() when weights are freed or migrated.
class PlanCache {
 public:
  // granule > 1: the table through snap_segments(granule).
  std::shared_ptr<const SegmentTable> get(const Topology& topo, const void* W, int64_t rows, int64_t cols,
                                          int elem_bits, int64_t page_size = 0, std::string* error = nullptr,
                                          int64_t granule = 1);
  void clear();
  size_t size() const;

 private:
  using Key = std::tuple<const Topology*, const void*, int64_t, int64_t, int, int64_t, int64_t>;
  mutable std::mutex mu_;
  std::map<Key, std::shared_ptr<const SegmentTable>> plans_;
};

}  // namespace numa
}  // namespace hinamoe
