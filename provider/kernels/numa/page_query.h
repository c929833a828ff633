// Which NUMA node holds a page, and whether a buffer is page-interleaved.
//
// Real queries go through raw syscalls (no libnuma): move_pages(2) with no
// target nodes (reports the node of each page without moving it), falling
// back to get_mempolicy(2) with MPOL_F_NODE|MPOL_F_ADDR when move_pages is
// unavailable (ENOSYS / EPERM under seccomp). Node ids are the kernel's ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace hinamoe {
namespace numa {

// Node of the page holding `addr`; -1 when unknown (page not present, the
// syscalls unavailable, a bad address). Never faults: a bad address is -1.
int page_node(const void* addr);

// Nodes of `count` pages (any addresses inside them) in one batch of
// move_pages calls: out[i] = node of pages[i], or -1 when unknown.
void page_nodes(const void* const* pages, size_t count, int* out);

// The system page size (sysconf), 4096 when unknown.
int64_t system_page_size();

// Node of page `index` (pages numbered from the buffer's first page, 0-based);
// -1 = unknown.
using PageNodeFn = std::function<int(int64_t index)>;

// The test/simulation page map of an interleaved buffer: page p -> (p + first) mod nodes.
struct FakePageMap {
  int nodes = 1;
  int first = 0;
  int operator()(int64_t p) const { return static_cast<int>((p + first) % nodes); }
};

// True when the `num_pages` pages of a buffer, as reported by `node_of`,
// cycle over nodes 0..nodes-1: page i on node (i + first) mod nodes. Samples
// at most `max_samples` pages (consecutive runs spread over the buffer;
// every page when num_pages <= max_samples). Pages reported -1 are skipped;
// false when no sampled page is known. With nodes == 1 this is "every known
// page is on node 0". On true, *first_node (when non-null) receives `first`.
bool is_interleaved(const PageNodeFn& node_of, int64_t num_pages, int nodes, int* first_node = nullptr,
                    int64_t max_samples = 256);

// The same for real memory: pages of [buf, buf + bytes) at `page_size`
// (0 = system page size), nodes as kernel node ids 0..nodes-1.
bool is_interleaved(const void* buf, size_t bytes, int nodes, int* first_node = nullptr, int64_t page_size = 0);

}  // namespace numa
}  // namespace hinamoe
