// hinamoe_numa_plan: the interleaved segment table over the C ABI.
#include "numa_c_api.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>

#include "segment_table.h"

namespace {

int fail(const std::string& msg, char* error, size_t error_size) {
  if (error != nullptr && error_size > 0) {
    const size_t n = std::min(msg.size(), error_size - 1);
    std::memcpy(error, msg.data(), n);
    error[n] = '\0';
  }
  return HINAMOE_NUMA_E_ARGS;
}

}  // namespace

extern "C" int hinamoe_numa_plan(int64_t rows, int64_t cols, const char* dtype, int nodes, int64_t page_size,
                                 int64_t offset, int64_t* period_rows, int64_t* counts, int64_t* segments,
                                 int64_t capacity, char* error, size_t error_size) {
  using namespace hinamoe::numa;
  try {
    if (dtype == nullptr) return fail("dtype is null", error, error_size);
    const int bits = dtype_bits(dtype);
    if (bits == 0)
      return fail(std::string("unknown dtype '") + dtype + "' (expected f32, f16, bf16, int8 or int4)", error,
                  error_size);
    if (period_rows == nullptr || counts == nullptr) return fail("period_rows and counts must not be null", error, error_size);
    SegmentTable t;
    const std::string err = build_interleaved_table(rows, cols, bits, nodes, page_size, offset, 0, &t);
    if (!err.empty()) return fail(err, error, error_size);
    *period_rows = t.period_rows;
    int64_t total = 0;
    for (int n = 0; n < nodes; ++n) {
      counts[n] = static_cast<int64_t>(t.segments[static_cast<size_t>(n)].size());
      total += counts[n];
    }
    if (segments == nullptr) return HINAMOE_NUMA_OK;
    if (capacity < total) {
      fail("segment capacity " + std::to_string(capacity) + " < " + std::to_string(total) + " needed", error,
           error_size);
      return HINAMOE_NUMA_E_CAPACITY;
    }
    int64_t* out = segments;
    for (const auto& list : t.segments)
      for (const Segment& s : list) {
        out[0] = s.row;
        out[1] = s.k_start;
        out[2] = s.k_end;
        out += 3;
      }
    return HINAMOE_NUMA_OK;
  } catch (const std::exception& e) {  // bad_alloc: never let exceptions cross the C ABI
    return fail(std::string("hinamoe_numa_plan: ") + e.what(), error, error_size);
  }
}
