// std::vector storage on 64-byte boundaries, for the token buffers the SIMD
// kernels read: with rows a multiple of 16 floats (padded_ld), every zmm load
// of a token then stays within one cache line. malloc gives 16-byte
// alignment (large blocks sit 16 bytes past a page start), so every 64-byte
// load split two lines; in-cache A/B on Zen 5 (the QMoE 4-bit kernel, 4-8
// tokens): about half the FMA rate.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace hinamoe {

template <class T>
struct Align64Allocator {
  using value_type = T;
  Align64Allocator() = default;
  template <class U>
  Align64Allocator(const Align64Allocator<U>&) {}
  T* allocate(size_t n) {
    const size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const Align64Allocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const Align64Allocator<U>&) const { return false; }
};

template <class T>
using AlignedVector = std::vector<T, Align64Allocator<T>>;

}  // namespace hinamoe
