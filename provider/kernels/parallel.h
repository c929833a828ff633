// How the kernels borrow threads: the caller hands over a "parallel for".
// The EP passes ORT's intra-op pool (KernelContext_ParallelFor); tests and the
// C ABI pass a serial loop or a std::thread pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "tuning.h"

namespace hinamoe {

struct Parallel {
  // Calls fn(arg, i) for every i in [0, n), possibly concurrently; returns when all are done.
  // Each thread takes its items in increasing i (the MoE driver's phase-2
  // items wait on lower phase-1 items and rely on it).
  void (*run)(void* pool, size_t n, void (*fn)(void* arg, size_t i), void* arg) = nullptr;
  void* pool = nullptr;
  int threads = 1;  // how many run at once: used to size work items

  template <class F>
  void for_each(size_t n, F&& f) const {
    using Fn = std::remove_reference_t<F>;
    auto tramp = [](void* a, size_t i) { (*static_cast<Fn*>(a))(i); };
    if (run == nullptr || threads <= 1 || n <= 1) {
      for (size_t i = 0; i < n; ++i) f(i);
    } else {
      run(pool, n, tramp, const_cast<void*>(static_cast<const void*>(&f)));
    }
  }
};

// A Parallel that runs everything on the calling thread.
inline Parallel serial() { return Parallel{}; }

// f(i) for i in [0, n): on the pool when the phase touches at least
// tuning::kParallelMinElems elements, else on the calling thread (a parallel
// phase costs a few us).
template <class F>
void maybe_parallel(const Parallel& par, int64_t n, int64_t elems, F&& f) {
  if (elems < tuning::kParallelMinElems || par.threads <= 1) {
    for (int64_t i = 0; i < n; ++i) f(size_t(i));
  } else {
    par.for_each(size_t(n), f);
  }
}

}  // namespace hinamoe
