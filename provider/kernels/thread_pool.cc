// Workers spin briefly after each job (back-to-back phases of one MoE call
// then start in microseconds) and sleep on a condition variable otherwise.
#include "thread_pool.h"

#include <chrono>

namespace hinamoe {
namespace {
thread_local bool tl_in_item = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_main(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

Parallel ThreadPool::parallel() {
  Parallel p;
  p.run = &ThreadPool::run;
  p.pool = this;
  p.threads = threads();
  return p;
}

void ThreadPool::run(void* self, size_t n, void (*fn)(void*, size_t), void* arg) {
  static_cast<ThreadPool*>(self)->run_items(n, fn, arg);
}

void ThreadPool::drain() {
  const bool was = tl_in_item;
  tl_in_item = true;
  for (size_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < n_;) fn_(arg_, i);
  tl_in_item = was;
}

void ThreadPool::run_items(size_t n, void (*fn)(void*, size_t), void* arg) {
  if (workers_.empty() || tl_in_item || n <= 1) {
    for (size_t i = 0; i < n; ++i) fn(arg, i);
    return;
  }
  std::lock_guard<std::mutex> job(run_mu_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    n_ = n;
    fn_ = fn;
    arg_ = arg;
    next_.store(0, std::memory_order_relaxed);
    checked_in_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  drain();
  // Every worker must check in before the job fields can be reused.
  const int want = static_cast<int>(workers_.size());
  for (int spins = 0; checked_in_.load(std::memory_order_acquire) < want; ++spins) {
    if (spins < 4096) cpu_relax(); else std::this_thread::yield();
  }
}

void ThreadPool::worker_main() {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    // Spin ~0.2 ms for the next job before going to sleep.
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
    for (int i = 0; g == seen; ++i) {
      cpu_relax();
      g = generation_.load(std::memory_order_acquire);
      if ((i & 255) == 255 && std::chrono::steady_clock::now() > spin_until) break;
    }
    if (g == seen) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || generation_.load(std::memory_order_acquire) != seen; });
      if (stop_) return;
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;  // the acquire above makes the job fields visible
    drain();
    checked_in_.fetch_add(1, std::memory_order_acq_rel);
  }
}

}  // namespace hinamoe
