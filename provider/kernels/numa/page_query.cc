// page_node / is_interleaved over raw move_pages / get_mempolicy syscalls.
#include "page_query.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <vector>

namespace hinamoe {
namespace numa {

namespace {

#ifndef MPOL_F_NODE
constexpr unsigned long kMpolFNode = 1u << 0;
#else
constexpr unsigned long kMpolFNode = MPOL_F_NODE;
#endif
#ifndef MPOL_F_ADDR
constexpr unsigned long kMpolFAddr = 1u << 1;
#else
constexpr unsigned long kMpolFAddr = MPOL_F_ADDR;
#endif

// 1 = works, 0 = unknown yet, -1 = unavailable (ENOSYS/EPERM): then skip it.
std::atomic<int> g_move_pages_state{0};

// Returns false when move_pages itself is unavailable.
bool move_pages_query(const void* const* pages, size_t count, int* out) {
#ifdef SYS_move_pages
  if (g_move_pages_state.load(std::memory_order_relaxed) < 0) return false;
  std::vector<int> status(count, -1);
  const long rc = syscall(SYS_move_pages, 0, static_cast<unsigned long>(count),
                          const_cast<void**>(reinterpret_cast<const void* const*>(pages)), nullptr,
                          status.data(), 0);
  if (rc < 0) {
    if (errno == ENOSYS || errno == EPERM) {
      g_move_pages_state.store(-1, std::memory_order_relaxed);
      return false;
    }
    std::fill(out, out + count, -1);
    return true;
  }
  g_move_pages_state.store(1, std::memory_order_relaxed);
  for (size_t i = 0; i < count; ++i) out[i] = status[i] >= 0 ? status[i] : -1;  // -ENOENT, -EFAULT ... -> -1
  return true;
#else
  (void)pages, (void)count, (void)out;
  return false;
#endif
}

int get_mempolicy_query(const void* addr) {
#ifdef SYS_get_mempolicy
  if (addr == nullptr) return -1;
  int node = -1;
  const long rc = syscall(SYS_get_mempolicy, &node, nullptr, 0UL, const_cast<void*>(addr), kMpolFNode | kMpolFAddr);
  return rc == 0 && node >= 0 ? node : -1;
#else
  (void)addr;
  return -1;
#endif
}

const void* page_base(const void* addr, int64_t page_size) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  return reinterpret_cast<const void*>(a - a % static_cast<uintptr_t>(page_size));
}

}  // namespace

int64_t system_page_size() {
  const long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<int64_t>(p) : 4096;
}

void page_nodes(const void* const* pages, size_t count, int* out) {
  constexpr size_t kBatch = 4096;
  for (size_t b = 0; b < count; b += kBatch) {
    const size_t n = std::min(kBatch, count - b);
    if (!move_pages_query(pages + b, n, out + b)) {
      // get_mempolicy(MPOL_F_ADDR) on an unmapped address fails with EFAULT: safe.
      for (size_t i = 0; i < n; ++i) out[b + i] = get_mempolicy_query(pages[b + i]);
    }
  }
}

int page_node(const void* addr) {
  if (addr == nullptr) return -1;
  const void* page = page_base(addr, system_page_size());
  int node = -1;
  page_nodes(&page, 1, &node);
  return node;
}

bool is_interleaved(const PageNodeFn& node_of, int64_t num_pages, int nodes, int* first_node, int64_t max_samples) {
  if (nodes < 1 || num_pages < 1) return false;
  if (max_samples < 1) max_samples = 1;
  // Sample indices: all pages, or `runs` runs of `run` consecutive pages spread evenly.
  std::vector<int64_t> idx;
  if (num_pages <= max_samples) {
    for (int64_t i = 0; i < num_pages; ++i) idx.push_back(i);
  } else {
    const int64_t run = std::min<int64_t>(std::max<int64_t>(2 * nodes, 2), max_samples);
    const int64_t runs = std::max<int64_t>(1, max_samples / run);
    for (int64_t r = 0; r < runs; ++r) {
      const int64_t start = runs == 1 ? 0 : r * (num_pages - run) / (runs - 1);
      for (int64_t i = start; i < start + run && i < num_pages; ++i)
        if (idx.empty() || i > idx.back()) idx.push_back(i);
    }
  }
  int first = -1;
  for (int64_t i : idx) {
    const int node = node_of(i);
    if (node < 0) continue;
    if (node >= nodes) return false;
    const int f = static_cast<int>(((node - i) % nodes + nodes) % nodes);
    if (first < 0) first = f;
    else if (f != first) return false;
  }
  if (first < 0) return false;
  if (first_node) *first_node = first;
  return true;
}

bool is_interleaved(const void* buf, size_t bytes, int nodes, int* first_node, int64_t page_size) {
  if (buf == nullptr || bytes == 0) return false;
  if (page_size <= 0) page_size = system_page_size();
  const uintptr_t a = reinterpret_cast<uintptr_t>(buf);
  const uintptr_t base = a - a % static_cast<uintptr_t>(page_size);
  const int64_t num_pages = static_cast<int64_t>((a + bytes - base + static_cast<uintptr_t>(page_size) - 1) /
                                                 static_cast<uintptr_t>(page_size));
  // Sampling asks one page at a time; this runs once per weight, not per call.
  return is_interleaved(
      [&](int64_t i) {
        const void* p = reinterpret_cast<const void*>(base + static_cast<uintptr_t>(i) * static_cast<uintptr_t>(page_size));
        int node = -1;
        page_nodes(&p, 1, &node);
        return node;
      },
      num_pages, nodes, first_node);
}

}  // namespace numa
}  // namespace hinamoe
