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
#include <new>
#include <stdexcept>
#include <string>
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

inline void cpu_relax() {
#ifdef HINAMOE_X86
  _mm_pause();
#endif
}

}  // namespace

ReadProbe::ReadProbe(size_t bytes, int threads) {
  if (bytes == 0) throw std::invalid_argument("read probe: bytes must be > 0");
  if (threads < 1 || threads > kMaxThreads)
    throw std::invalid_argument("read probe: threads must be in [1, " + std::to_string(kMaxThreads) + "], got " +
                                std::to_string(threads));
  threads_ = threads;
  slice_ = std::max<size_t>(4096, (bytes / size_t(threads)) / 256 * 256);
  constexpr size_t kAlign = size_t(2) << 20;  // 2 MiB: lets the kernel back it with huge pages
  const size_t alloc = (size_t(threads) * slice_ + kAlign - 1) / kAlign * kAlign;
  buf_ = static_cast<char*>(std::aligned_alloc(kAlign, alloc));
  if (!buf_) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(buf_, alloc, MADV_HUGEPAGE);
#endif
  avx2_ = tier_unavailable_reason("avx2").empty();
  try {
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_main(i); });
  } catch (...) {
    stop_workers();
    std::free(buf_);
    throw;
  }
  std::memset(buf_, 1, slice_);  // slice 0: first touch by the thread that calls pass_gbs
  // Wait for the workers' first touch, so the first pass times reads only.
  for (int spins = 0; done_.load(std::memory_order_acquire) < threads_ - 1; ++spins) {
    if (spins < 4096) cpu_relax(); else std::this_thread::yield();
  }
}

ReadProbe::~ReadProbe() {
  stop_workers();
  std::free(buf_);
}

void ReadProbe::stop_workers() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  go_.notify_all();
  for (auto& w : workers_) w.join();
  workers_.clear();
}

uint64_t ReadProbe::read_slice(int id) const {
  const char* p = buf_ + size_t(id) * slice_;
#ifdef HINAMOE_X86
  return avx2_ ? read_avx2(p, slice_) : read_scalar(p, slice_);
#else
  return read_scalar(p, slice_);
#endif
}

void ReadProbe::worker_main(int id) {
  std::memset(buf_ + size_t(id) * slice_, id + 1, slice_);  // first touch by the reading thread
  done_.fetch_add(1, std::memory_order_acq_rel);
  uint64_t seen = 0, acc = 0;
  for (;;) {
    {
      // Asleep between passes: a probe interleaved with a benchmark must not
      // take CPU from the runs it is compared with.
      std::unique_lock<std::mutex> lk(mu_);
      go_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) break;
      seen = generation_;
    }
    acc ^= read_slice(id);
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
  sink_.fetch_xor(acc, std::memory_order_relaxed);
}

double ReadProbe::pass_gbs() {
  std::lock_guard<std::mutex> pass(pass_mu_);
  // Every worker checked in after the last pass (or its first touch), so the count can restart.
  done_.store(0, std::memory_order_relaxed);
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++generation_;
  }
  go_.notify_all();
  const uint64_t acc = read_slice(0);
  for (int spins = 0; done_.load(std::memory_order_acquire) < threads_ - 1; ++spins) {
    if (spins < 4096) cpu_relax(); else std::this_thread::yield();
  }
  const auto t1 = std::chrono::steady_clock::now();
  sink_.fetch_xor(acc, std::memory_order_relaxed);
  const double secs = std::chrono::duration<double>(t1 - t0).count();
  return secs > 0 ? double(bytes()) / secs / 1e9 : 0.0;
}

double read_bandwidth_gbs(size_t bytes, int threads, int repeats) {
  threads = std::max(1, std::min(threads, ReadProbe::kMaxThreads));
  repeats = std::max(1, repeats);
  try {
    ReadProbe probe(std::max<size_t>(bytes, 1), threads);
    probe.pass_gbs();  // warm-up
    std::vector<double> gbs;
    for (int r = 0; r < repeats; ++r) gbs.push_back(probe.pass_gbs());
    std::sort(gbs.begin(), gbs.end());
    return gbs[gbs.size() / 2];
  } catch (const std::bad_alloc&) {
    return 0.0;
  }
}

}  // namespace hinamoe
