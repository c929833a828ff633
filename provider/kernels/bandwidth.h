// Memory read-bandwidth probe: the roofline the weight stream is measured against.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace hinamoe {

// A read-bandwidth probe that can be sampled many times: its buffer is
// allocated and first touched once, its reader threads stay alive (asleep
// between passes, so they take no CPU from whatever runs between two passes).
// A benchmark can then take one pass right after each timed run and compare
// the run with the bandwidth of the same moment.
class ReadProbe {
 public:
  // About `bytes` (at least 4 KiB per thread, rounded down to 256 B per
  // thread) split into one slice per thread; each slice is first touched by
  // the thread that reads it. Throws std::invalid_argument when bytes == 0 or
  // threads is outside [1, kMaxThreads], std::bad_alloc when the buffer
  // cannot be allocated.
  ReadProbe(size_t bytes, int threads);
  ~ReadProbe();
  ReadProbe(const ReadProbe&) = delete;
  ReadProbe& operator=(const ReadProbe&) = delete;

  // One pass over the whole buffer by all threads, timed from their release
  // to the last finisher; returns bytes() / seconds / 1e9. Calls from several
  // threads are serialized.
  double pass_gbs();

  size_t bytes() const { return slice_ * size_t(threads_); }  // streamed per pass
  int threads() const { return threads_; }

  static constexpr int kMaxThreads = 256;

 private:
  void worker_main(int id);
  uint64_t read_slice(int id) const;
  void stop_workers();

  char* buf_ = nullptr;
  size_t slice_ = 0;
  int threads_ = 1;
  bool avx2_ = false;
  std::vector<std::thread> workers_;  // slices 1..threads-1; the caller of pass_gbs reads slice 0
  std::mutex pass_mu_;                // one pass at a time
  std::mutex mu_;
  std::condition_variable go_;
  uint64_t generation_ = 0;  // under mu_: bumped to release the workers for one pass
  bool stop_ = false;        // under mu_
  std::atomic<int> done_{0};  // workers finished with the current pass (or with first touch)
  std::atomic<uint64_t> sink_{0};  // keeps the reads observable
};

// Streams a `bytes` buffer with `threads` threads (a ReadProbe), `repeats`
// timed passes after one warm-up; returns the median pass as GB/s
// (bytes / seconds / 1e9), or 0 if the buffer cannot be allocated.
// threads is clamped to [1, ReadProbe::kMaxThreads], repeats to >= 1.
double read_bandwidth_gbs(size_t bytes, int threads, int repeats);

}  // namespace hinamoe
