#include "tile_peak.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "amx_detect.h"
#include "tile_ops.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,amx-int8")

#include "tile_ops_amx.h"

namespace hinamoe {
namespace {

// tmm0-1 and tmm2-3 the operands, tmm4-7 the accumulators (as the HiNa
// micro-kernel uses them); the values do not change the rate.
void tile_chains(long iters, bool int8) {
  amx::AmxTileOps ops;
  amx::TileConfig c = amx::blank_palette1();
  for (int t = 0; t < 8; ++t) amx::set_tile(&c, t, 16, 64);
  ops.configure(c);  // zeroes every tile
  if (int8) {
    for (long i = 0; i < iters; ++i) {
      ops.dp_usd<4, 2, 0>();
      ops.dp_usd<5, 2, 1>();
      ops.dp_usd<6, 3, 0>();
      ops.dp_usd<7, 3, 1>();
    }
  } else {
    for (long i = 0; i < iters; ++i) {
      ops.dp_bf16<4, 2, 0>();
      ops.dp_bf16<5, 2, 1>();
      ops.dp_bf16<6, 3, 0>();
      ops.dp_bf16<7, 3, 1>();
    }
  }
  ops.release();
}

}  // namespace

double tile_peak_per_s(int threads, bool int8) {
  if (!(int8 ? amx_int8_unavailable_reason() : amx_unavailable_reason()).empty()) return 0.0;
  threads = std::max(1, std::min(threads, 256));
  constexpr long kIters = 100000;  // 400 k instructions per thread per round: ~10-20 ms
  const double macs_per_op = int8 ? 16.0 * 16 * 64 : 16.0 * 16 * 32;
  double best = 0.0;
  for (int round = 0; round < 5; ++round) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (int i = 1; i < threads; ++i) {
      pool.emplace_back([&] {
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        tile_chains(kIters, int8);
      });
    }
    while (ready.load() < threads - 1) std::this_thread::yield();
    const auto t0 = std::chrono::steady_clock::now();
    go.store(true, std::memory_order_release);
    tile_chains(kIters, int8);
    for (auto& t : pool) t.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 4.0 * kIters * macs_per_op * threads / s);
  }
  return best;
}

}  // namespace hinamoe

#pragma GCC pop_options
