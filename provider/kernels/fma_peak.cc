#include "fma_peak.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HINAMOE_X86 1
#endif

#include "tier.h"

namespace hinamoe {
namespace {

#ifdef HINAMOE_X86
// 10 independent chains cover the FMA latency (4-5 cycles) at 2 per cycle;
// the asm barrier keeps the compiler from folding the chains.
__attribute__((target("avx2,fma"))) void fma_chains(long iters, float* sink) {
  __m256 b = _mm256_set1_ps(0.9999f), c = _mm256_set1_ps(1e-4f);
  __m256 a0 = b, a1 = b, a2 = b, a3 = b, a4 = b, a5 = b, a6 = b, a7 = b, a8 = b, a9 = b;
  for (long i = 0; i < iters; ++i) {
    a0 = _mm256_fmadd_ps(a0, b, c); a1 = _mm256_fmadd_ps(a1, b, c);
    a2 = _mm256_fmadd_ps(a2, b, c); a3 = _mm256_fmadd_ps(a3, b, c);
    a4 = _mm256_fmadd_ps(a4, b, c); a5 = _mm256_fmadd_ps(a5, b, c);
    a6 = _mm256_fmadd_ps(a6, b, c); a7 = _mm256_fmadd_ps(a7, b, c);
    a8 = _mm256_fmadd_ps(a8, b, c); a9 = _mm256_fmadd_ps(a9, b, c);
    __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7),
                     "+x"(a8), "+x"(a9));
  }
  const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                 _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)),
                                               _mm256_add_ps(a8, a9)));
  *sink = _mm256_cvtss_f32(s);
}

// The same on 512-bit chains (the avx512 tier's kernels).
__attribute__((target("avx512f"))) void fma_chains512(long iters, float* sink) {
  __m512 b = _mm512_set1_ps(0.9999f), c = _mm512_set1_ps(1e-4f);
  __m512 a0 = b, a1 = b, a2 = b, a3 = b, a4 = b, a5 = b, a6 = b, a7 = b, a8 = b, a9 = b;
  for (long i = 0; i < iters; ++i) {
    a0 = _mm512_fmadd_ps(a0, b, c); a1 = _mm512_fmadd_ps(a1, b, c);
    a2 = _mm512_fmadd_ps(a2, b, c); a3 = _mm512_fmadd_ps(a3, b, c);
    a4 = _mm512_fmadd_ps(a4, b, c); a5 = _mm512_fmadd_ps(a5, b, c);
    a6 = _mm512_fmadd_ps(a6, b, c); a7 = _mm512_fmadd_ps(a7, b, c);
    a8 = _mm512_fmadd_ps(a8, b, c); a9 = _mm512_fmadd_ps(a9, b, c);
    __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7),
                     "+v"(a8), "+v"(a9));
  }
  const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                 _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)),
                                               _mm512_add_ps(a8, a9)));
  *sink = _mm512_cvtss_f32(s);
}
#endif

}  // namespace

double fma_peak_per_s(int threads, int bits) {
#ifdef HINAMOE_X86
  if (bits != 256 && bits != 512) return 0.0;
  if (!tier_unavailable_reason(bits == 512 ? "avx512" : "avx2").empty()) return 0.0;
  auto chains = bits == 512 ? fma_chains512 : fma_chains;
  threads = std::max(1, std::min(threads, 256));
  constexpr long kIters = 4000000;  // 40 M FMAs per thread per round: ~10 ms at 2 per cycle
  double best = 0.0;
  std::vector<float> sink(size_t(threads) * 16);
  for (int round = 0; round < 5; ++round) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> pool;
    for (int i = 1; i < threads; ++i) {
      pool.emplace_back([&, i] {
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        chains(kIters, &sink[size_t(i) * 16]);
      });
    }
    while (ready.load() < threads - 1) std::this_thread::yield();
    const auto t0 = std::chrono::steady_clock::now();
    go.store(true, std::memory_order_release);
    chains(kIters, &sink[0]);
    for (auto& t : pool) t.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, double(kIters) * 10 * (bits / 32) * threads / s);
  }
  return best;
#else
  (void)threads;
  (void)bits;
  return 0.0;
#endif
}

}  // namespace hinamoe
