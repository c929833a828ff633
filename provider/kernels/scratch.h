// Scratch buffers the MoE, QMoE and MatMulNBits drivers borrow from a pool
// of the calling thread and give back when the call ends, so the next call
// reuses them: freed, glibc hands large blocks back to the kernel, and the
// next call faults in and zeroes fresh pages (at a 512-token prompt, a
// QMoE layer's ~130 MiB of token, activation and output rows; measurements
// in docs/kernels.md). A thread keeps at most kScratchKeepBytes in its
// pools (only threads that call session.run: the pool threads run items);
// larger buffers are freed as before.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace hinamoe {

constexpr size_t kScratchKeepBytes = size_t(256) << 20;

// Row stride for float scratch: a multiple of 16 floats, nudged off multiples
// of 2 KiB so the rows of a token tile do not share L1 sets (docs/kernels.md).
inline int64_t padded_ld(int64_t n) {
  int64_t ld = (n + 15) / 16 * 16;
  if (ld % 512 == 0) ld += 16;
  return ld;
}

// Bytes a pooled object holds on the heap: a vector's capacity; other types
// (the QMoE driver's per-operand buffers) define heap_bytes themselves.
template <class T, class A>
size_t heap_bytes(const std::vector<T, A>& v) {
  return v.capacity() * sizeof(T);
}

namespace detail {
inline size_t& scratch_kept_bytes() {  // this thread's pools, all types together
  thread_local size_t bytes = 0;
  return bytes;
}
}  // namespace detail

// One object of type V from this thread's pool (default-constructed when
// the pool is empty) for the lifetime of the Scratch. Its contents are
// whatever the last user left: callers size and fill it (assign, resize).
// Pools are last in, first out, so a repeated sequence of calls gets the
// same buffers back in the same roles.
template <class V>
class Scratch {
 public:
  Scratch() : v_(take()) {}
  ~Scratch() { give_back(std::move(v_)); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  V& operator*() { return v_; }
  V* operator->() { return &v_; }

 private:
  static std::vector<V>& pool() {
    thread_local std::vector<V> kept;
    return kept;
  }
  static V take() {
    std::vector<V>& p = pool();
    if (p.empty()) return V();
    V v = std::move(p.back());
    p.pop_back();
    detail::scratch_kept_bytes() -= heap_bytes(v);
    return v;
  }
  static void give_back(V&& v) {
    const size_t b = heap_bytes(v);
    if (b == 0 || detail::scratch_kept_bytes() + b > kScratchKeepBytes) return;  // freed with v
    detail::scratch_kept_bytes() += b;
    pool().push_back(std::move(v));
  }

  V v_;
};

}  // namespace hinamoe
