// How the expert pipeline's phases are cut into work items (expert, block
// of rows), and how gate/up and down items share one pass over the pool.
#pragma once

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "../parallel.h"
#include "routing.h"

namespace hinamoe {
namespace detail {

struct Item {
  int32_t expert;
  int32_t b0, b1;  // block [b0, b1) of j (phase 1) or of hidden rows (phase 2)
};

// Splits each active expert's `rows` into blocks (multiples of `align`) so
// that the items have about equal cost and there are about
// tuning::kItemsPerThread per thread. Cost of an expert is
// rows * (kItemStreamCost + tokens): the weight stream is paid once, the FMAs
// per token.
inline std::vector<Item> make_items(const Routes& routes, int64_t experts, int64_t rows, int threads,
                             int64_t align = 8) {
  constexpr int64_t kStream = tuning::kItemStreamCost;
  int64_t total = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t m = routes.expert_begin[e + 1] - routes.expert_begin[e];
    if (m > 0) total += rows * (kStream + m);
  }
  const int64_t want_items = tuning::kItemsPerThread * int64_t(std::max(threads, 1));
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
// starts streaming down weights at once rather than idling at a barrier
// (measured in docs/kernels.md, "Tuning knobs").
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

}  // namespace detail
}  // namespace hinamoe
