// A small std::thread pool that implements Parallel, for the C ABI, the
// tests and the benchmark (the EP uses ORT's own pool instead).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "parallel.h"

namespace hinamoe {

class ThreadPool {
 public:
  // `threads` runners in total: the calling thread plus threads-1 workers.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  // A Parallel that runs on this pool. Calls from several threads are
  // serialized; a call from inside a running item runs serially.
  Parallel parallel();

 private:
  static void run(void* self, size_t n, void (*fn)(void*, size_t), void* arg);
  void run_items(size_t n, void (*fn)(void*, size_t), void* arg);
  void worker_main();
  void drain();

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one job at a time
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  // The current job; published by bumping generation_.
  size_t n_ = 0;
  void (*fn_)(void*, size_t) = nullptr;
  void* arg_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<size_t> next_{0};
  std::atomic<int> checked_in_{0};  // workers finished with the current job
};

}  // namespace hinamoe
