// plan_for_weight (placement detection) and its cache.
#include "plan_cache.h"

#include <algorithm>
#include <vector>

#include "page_query.h"

namespace hinamoe {
namespace numa {

namespace {
constexpr size_t kMaxPlans = 4096;
}  // namespace

std::shared_ptr<const SegmentTable> plan_for_weight(const Topology& topo, const void* W, int64_t rows, int64_t cols,
                                                    int elem_bits, int64_t page_size, std::string* error) {
  if (page_size <= 0) page_size = system_page_size();
  const int nodes = topo.num_nodes();
  const uintptr_t addr = reinterpret_cast<uintptr_t>(W);
  const int64_t offset = static_cast<int64_t>(addr % static_cast<uintptr_t>(page_size));
  std::string err = validate_table_params(rows, cols, elem_bits, nodes, page_size, offset);
  if (W == nullptr) err = "weight pointer is null";
  if (!err.empty()) {
    if (error) *error = err;
    return nullptr;
  }
  auto table = std::make_shared<SegmentTable>();
  if (nodes == 1) {
    *table = single_node_table(rows, cols, elem_bits);
    return table;
  }
  if (topo.is_fake()) {
    const int first = static_cast<int>((addr / static_cast<uintptr_t>(page_size)) % static_cast<uintptr_t>(nodes));
    err = build_interleaved_table(rows, cols, elem_bits, nodes, page_size, offset, first, table.get());
  } else {
    const int64_t pages = pages_spanned(rows, cols, elem_bits, page_size, offset);
    std::vector<const void*> addrs(static_cast<size_t>(pages));
    const uintptr_t base = addr - static_cast<uintptr_t>(offset);
    for (int64_t p = 0; p < pages; ++p)
      addrs[static_cast<size_t>(p)] =
          reinterpret_cast<const void*>(base + static_cast<uintptr_t>(p) * static_cast<uintptr_t>(page_size));
    std::vector<int> os_nodes(static_cast<size_t>(pages), -1);
    page_nodes(addrs.data(), addrs.size(), os_nodes.data());
    for (int& n : os_nodes) n = n < 0 ? -1 : topo.node_index_of_os_id(n);
    int first = 0;
    const bool interleaved = is_interleaved([&](int64_t p) { return os_nodes[static_cast<size_t>(p)]; }, pages, nodes,
                                            &first, pages);
    err = interleaved ? build_interleaved_table(rows, cols, elem_bits, nodes, page_size, offset, first, table.get())
                      : build_page_map_table(rows, cols, elem_bits, nodes, page_size, offset, os_nodes, table.get());
  }
  if (!err.empty()) {
    if (error) *error = err;
    return nullptr;
  }
  return table;
}

std::shared_ptr<const SegmentTable> PlanCache::get(const Topology& topo, const void* W, int64_t rows, int64_t cols,
                                                   int elem_bits, int64_t page_size, std::string* error,
                                                   int64_t granule) {
  if (page_size <= 0) page_size = system_page_size();
  granule = std::max<int64_t>(1, granule);
  const Key key{&topo, W, rows, cols, elem_bits, page_size, granule};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
  }
  auto plan = plan_for_weight(topo, W, rows, cols, elem_bits, page_size, error);  // outside the lock
  if (!plan) return nullptr;
  if (granule > 1) plan = std::make_shared<const SegmentTable>(snap_segments(*plan, granule));
  std::lock_guard<std::mutex> lock(mu_);
  // Weights fed as graph inputs arrive at a new address every run: bound the
  // cache instead of growing it forever (a dropped plan is rebuilt on use).
  if (plans_.size() >= kMaxPlans) plans_.clear();
  return plans_.emplace(key, std::move(plan)).first->second;  // a racing insert wins; same content
}

void PlanCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  plans_.clear();
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

}  // namespace numa
}  // namespace hinamoe
