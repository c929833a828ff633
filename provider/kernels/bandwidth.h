// Memory read-bandwidth probe: the roofline the weight stream is measured against.
#pragma once

#include <cstddef>

namespace hinamoe {

// Streams a `bytes` buffer with `threads` std::threads (each reads its own
// slice, touched first by that thread), `repeats` timed passes after one
// warm-up; returns the median pass as GB/s (bytes / seconds / 1e9), or 0 if
// the buffer cannot be allocated.
double read_bandwidth_gbs(size_t bytes, int threads, int repeats);

}  // namespace hinamoe
