// hinamoe_numa_plan over its C ABI: two-call protocol, layout, errors.
#include <cstring>
#include <string>
#include <vector>

#include "numa/numa_c_api.h"
#include "numa/segment_table.h"
#include "../test_util.h"

using namespace hinamoe::numa;

namespace {

struct Plan {
  int rc = -1;
  int64_t period = -1;
  std::vector<int64_t> counts;
  std::vector<std::vector<Segment>> segments;
  std::string error;
};

Plan plan(int64_t rows, int64_t cols, const char* dtype, int nodes, int64_t P = 4096, int64_t offset = 0) {
  Plan p;
  char err[256];
  std::memset(err, 'x', sizeof err);
  p.counts.assign(static_cast<size_t>(nodes > 0 ? nodes : 1), -1);
  p.rc = hinamoe_numa_plan(rows, cols, dtype, nodes, P, offset, &p.period, p.counts.data(), nullptr, 0, err,
                           sizeof err);
  if (p.rc != 0) {
    p.error = err;
    return p;
  }
  int64_t total = 0;
  for (int64_t c : p.counts) total += c;
  std::vector<int64_t> flat(static_cast<size_t>(3 * total + 3), -5);  // one spare triple: must stay untouched
  p.rc = hinamoe_numa_plan(rows, cols, dtype, nodes, P, offset, &p.period, p.counts.data(), flat.data(), total, err,
                           sizeof err);
  if (p.rc != 0) {
    p.error = err;
    return p;
  }
  CHECK(flat[static_cast<size_t>(3 * total)] == -5);
  size_t i = 0;
  p.segments.resize(static_cast<size_t>(nodes));
  for (int n = 0; n < nodes; ++n)
    for (int64_t j = 0; j < p.counts[static_cast<size_t>(n)]; ++j, i += 3)
      p.segments[static_cast<size_t>(n)].push_back(Segment{flat[i], flat[i + 1], flat[i + 2]});
  return p;
}

}  // namespace

TEST(c_api_paper_example) {
  const Plan p = plan(64, 6144, "bf16", 2);
  CHECK(p.rc == 0 && p.error.empty());
  CHECK(p.period == 2);
  CHECK((p.counts == std::vector<int64_t>{3, 3}));
  CHECK(p.segments.size() == 2);
  if (p.segments.size() == 2) {
    CHECK((p.segments[0] == std::vector<Segment>{{0, 0, 2048}, {0, 4096, 6144}, {1, 2048, 4096}}));
    CHECK((p.segments[1] == std::vector<Segment>{{0, 2048, 4096}, {1, 0, 2048}, {1, 4096, 6144}}));
  }
}

TEST(c_api_matches_table_for_every_dtype) {
  const char* names[] = {"f32", "f16", "bf16", "int8", "int4", "float32", "bfloat16"};
  for (const char* name : names)
    for (int nodes : {1, 2, 4, 8}) {
      const int bits = dtype_bits(name);
      const int64_t esize = bits >= 8 ? bits / 8 : 1;
      const int64_t rows = ht::randint(1, 100), cols = ht::randint(1, 9000);
      const int64_t offset = esize * ht::randint(0, 4096 / esize - 1);
      const Plan p = plan(rows, cols, name, nodes, 4096, offset);
      CHECK_MSG(p.rc == 0, name << ": " << p.error);
      SegmentTable t;
      CHECK(build_interleaved_table(rows, cols, bits, nodes, 4096, offset, 0, &t).empty());
      CHECK(p.period == t.period_rows && p.period <= rows);
      CHECK(p.segments == t.segments);
    }
}

TEST(c_api_errors) {
  struct Bad {
    int64_t rows, cols;
    const char* dtype;
    int nodes;
    int64_t P, offset;
    const char* needle;
  };
  const Bad bad[] = {
      {4, 4, "bf16", 0, 4096, 0, "nodes"},
      {4, 4, "bf16", -3, 4096, 0, "nodes"},
      {4, 4, "fp8", 2, 4096, 0, "dtype"},
      {4, 4, "", 2, 4096, 0, "dtype"},
      {4, 4, "f32", 2, 4094, 0, "page_size"},
      {4, 4, "bf16", 2, 0, 0, "page_size"},
      {4, 4, "bf16", 2, -4096, 0, "page_size"},
      {4, 4, "bf16", 2, 4096, 4096, "offset"},
      {4, 4, "bf16", 2, 4096, -2, "offset"},
      {4, 4, "f32", 2, 4096, 2, "offset"},
      {0, 4, "bf16", 2, 4096, 0, "rows"},
      {4, 0, "bf16", 2, 4096, 0, "cols"},
  };
  for (const Bad& b : bad) {
    const Plan p = plan(b.rows, b.cols, b.dtype, b.nodes, b.P, b.offset);
    CHECK_MSG(p.rc == HINAMOE_NUMA_E_ARGS, b.needle << " case returned " << p.rc);
    CHECK_MSG(p.error.find(b.needle) != std::string::npos, "message '" << p.error << "' lacks " << b.needle);
  }
  int64_t period = 0, counts[2] = {0, 0};
  char err[8];
  CHECK(hinamoe_numa_plan(4, 4, nullptr, 2, 4096, 0, &period, counts, nullptr, 0, err, sizeof err) ==
        HINAMOE_NUMA_E_ARGS);
  CHECK(std::strlen(err) < sizeof err);  // truncated, NUL-terminated
  CHECK(hinamoe_numa_plan(4, 4, "bf16", 2, 4096, 0, nullptr, counts, nullptr, 0, nullptr, 0) == HINAMOE_NUMA_E_ARGS);
  CHECK(hinamoe_numa_plan(4, 4, "bf16", 2, 4096, 0, &period, nullptr, nullptr, 0, err, 0) == HINAMOE_NUMA_E_ARGS);
  // Capacity too small: counts filled, segments untouched.
  int64_t segs[3] = {-1, -1, -1};
  char msg[128] = "";
  CHECK(hinamoe_numa_plan(64, 6144, "bf16", 2, 4096, 0, &period, counts, segs, 1, msg, sizeof msg) ==
        HINAMOE_NUMA_E_CAPACITY);
  CHECK(period == 2 && counts[0] == 3 && counts[1] == 3 && segs[0] == -1 && std::strlen(msg) > 0);
}
