// Read-bandwidth probe. Wide unrolled loads with independent XOR chains keep
// enough lines in flight to saturate DRAM (numpy's sum on the same machine is
// FP-add bound and reads well below it).
#include "bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HINAMOE_X86 1
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "tier.h"

namespace hinamoe {
namespace {

#ifdef HINAMOE_X86
__attribute__((target("avx2"))) uint64_t read_avx2(const char* p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 256 <= n; i += 256) {
    const __m256i* v = reinterpret_cast<const __m256i*>(p + i);
    a0 = _mm256_xor_si256(a0, _mm256_load_si256(v + 0));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256(v + 1));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256(v + 2));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256(v + 3));
    a0 = _mm256_xor_si256(a0, _mm256_load_si256(v + 4));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256(v + 5));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256(v + 6));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256(v + 7));
  }
  const __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  return uint64_t(_mm256_extract_epi64(a, 0) ^ _mm256_extract_epi64(a, 3));
}
#endif

uint64_t read_scalar(const char* p, size_t n) {
  const uint64_t* v = reinterpret_cast<const uint64_t*>(p);
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (size_t i = 0; i + 4 <= n / 8; i += 4) {
    a0 ^= v[i];
    a1 ^= v[i + 1];
    a2 ^= v[i + 2];
    a3 ^= v[i + 3];
  }
  return a0 ^ a1 ^ a2 ^ a3;
}

}  // namespace

double read_bandwidth_gbs(size_t bytes, int threads, int repeats) {
  threads = std::max(1, std::min(threads, 256));
  repeats = std::max(1, repeats);
  constexpr size_t kAlign = size_t(2) << 20;  // 2 MiB: lets the kernel back it with huge pages
  const size_t slice = std::max<size_t>(4096, (bytes / size_t(threads)) / 256 * 256);
  const size_t total = slice * size_t(threads);
  const size_t alloc = (total + kAlign - 1) / kAlign * kAlign;
  char* buf = static_cast<char*>(std::aligned_alloc(kAlign, alloc));
  if (!buf) return 0.0;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(buf, alloc, MADV_HUGEPAGE);
#endif
  const bool avx2 = tier_unavailable_reason("avx2").empty();
  std::atomic<int> go{0}, done{0};
  std::atomic<uint64_t> sink{0};

  auto read_slice = [avx2](const char* p, size_t n) {
#ifdef HINAMOE_X86
    return avx2 ? read_avx2(p, n) : read_scalar(p, n);
#else
    (void)avx2;
    return read_scalar(p, n);
#endif
  };
  auto body = [&](int id) {
    char* p = buf + size_t(id) * slice;
    std::memset(p, id + 1, slice);  // first touch by the reading thread
    uint64_t acc = 0;
    for (int r = 0; r <= repeats; ++r) {  // pass 0 is the warm-up
      while (go.load(std::memory_order_acquire) <= r) std::this_thread::yield();
      acc ^= read_slice(p, slice);
      done.fetch_add(1, std::memory_order_acq_rel);
    }
    sink.fetch_xor(acc);
  };

  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(body, i);
  // The calling thread reads slice 0 and times each pass from release to the last finisher.
  std::vector<double> secs;
  {
    char* p = buf;
    std::memset(p, 1, slice);
    uint64_t acc = 0;
    for (int r = 0; r <= repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      go.store(r + 1, std::memory_order_release);
      acc ^= read_slice(p, slice);
      done.fetch_add(1, std::memory_order_acq_rel);
      while (done.load(std::memory_order_acquire) < threads * (r + 1)) {
      }
      const auto t1 = std::chrono::steady_clock::now();
      if (r > 0) secs.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
    sink.fetch_xor(acc);
  }
  for (auto& t : pool) t.join();
  std::free(buf);
  std::sort(secs.begin(), secs.end());
  const double med = secs[secs.size() / 2];
  return med > 0 ? double(total) / med / 1e9 : 0.0;
}

}  // namespace hinamoe
