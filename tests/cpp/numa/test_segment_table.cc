// Segment tables against a brute-force page map.
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <vector>

#include "numa/numa_partition.h"
#include "numa/segment_table.h"
#include "../test_util.h"

using namespace hinamoe::numa;

namespace {

// Page of element (x, y), counted from the buffer's first page, straight from the definition.
int64_t brute_page(int64_t x, int64_t y, int64_t K, int bits, int64_t P, int64_t offset) {
  return (offset * 8 + (x * K + y) * bits) / (P * 8);
}

// Smallest t >= 1 with t*K*bits a multiple of 8*P*Nn, capped at rows (by search).
int64_t brute_period(int64_t rows, int64_t K, int bits, int nodes, int64_t P) {
  const int64_t round = 8 * P * nodes;
  for (int64_t t = 1; t < rows; ++t)
    if ((t * K * bits) % round == 0) return t;
  return rows;
}

struct Case {
  int64_t N, K;
  int bits;
  int nodes;
  int64_t P, offset;
  int first;
};

std::string describe(const Case& c) {
  std::ostringstream os;
  os << "N=" << c.N << " K=" << c.K << " bits=" << c.bits << " nodes=" << c.nodes << " P=" << c.P
     << " offset=" << c.offset << " first=" << c.first;
  return os.str();
}

// Checks a table against node_of_page for every element of the weight.
// Returns false (after recording failures) on the first broken case.
template <class NodeOfPage>
bool verify_table(const SegmentTable& t, const Case& c, NodeOfPage node_of_page) {
  const std::string d = describe(c);
  bool ok = true;
  auto expect = [&](bool cond, const std::string& what) {
    if (!cond && ok) {
      ht::check_at(false, __FILE__, __LINE__, what.c_str(), d);
      ok = false;
    }
  };
  expect(t.rows == c.N && t.cols == c.K && t.nodes == c.nodes, "header");
  expect(static_cast<int>(t.segments.size()) == c.nodes && static_cast<int>(t.row_begin.size()) == c.nodes,
         "per-node lists");
  if (!ok) return false;
  // Table rows: ascending, non-empty, inside [0, K), maximal (no touching same-node neighbours).
  for (int n = 0; n < c.nodes && ok; ++n) {
    const auto& segs = t.segments[static_cast<size_t>(n)];
    const auto& rb = t.row_begin[static_cast<size_t>(n)];
    expect(static_cast<int64_t>(rb.size()) == t.period_rows + 1 && rb.front() == 0 &&
               rb.back() == static_cast<int64_t>(segs.size()),
           "row_begin bounds");
    if (!ok) break;
    for (int64_t r = 0; r < t.period_rows && ok; ++r)
      for (int64_t i = rb[static_cast<size_t>(r)]; i < rb[static_cast<size_t>(r) + 1]; ++i) {
        const Segment& s = segs[static_cast<size_t>(i)];
        expect(s.row == r && 0 <= s.k_start && s.k_start < s.k_end && s.k_end <= c.K, "segment in range");
        if (i > rb[static_cast<size_t>(r)]) expect(segs[static_cast<size_t>(i) - 1].k_end < s.k_start, "merged, ascending");
      }
  }
  // The whole weight through the periodic expansion: every element once, on its node.
  std::vector<uint8_t> seen(static_cast<size_t>(c.N * c.K), 0);
  for (int n = 0; n < c.nodes && ok; ++n)
    for_each_local_segment(t, n, 0, c.N, [&](int64_t r, int64_t k0, int64_t k1) {
      if (!ok) return;
      for (int64_t k = k0; k < k1; ++k) {
        uint8_t& s = seen[static_cast<size_t>(r * c.K + k)];
        expect(s == 0, "element covered twice");
        s = 1;
        const int want = node_of_page(brute_page(r, k, c.K, c.bits, c.P, c.offset));
        if (want != n) {
          expect(false, "segment element on another node's page");
          std::printf("      row %lld k %lld: table node %d, page map node %d\n", static_cast<long long>(r),
                      static_cast<long long>(k), n, want);
        }
      }
    });
  if (ok) expect(std::all_of(seen.begin(), seen.end(), [](uint8_t s) { return s == 1; }), "element not covered");
  return ok;
}

Case random_case(int64_t max_elems) {
  static const int kBits[] = {32, 16, 16, 8, 4};
  static const int kNodes[] = {1, 2, 2, 3, 4, 4, 8, 8};
  static const int64_t kPages[] = {16, 64, 128, 256, 512, 1024, 4096};
  Case c{};
  c.bits = kBits[ht::randint(0, 4)];
  c.nodes = kNodes[ht::randint(0, 7)];
  c.P = kPages[ht::randint(0, 6)];
  const int64_t esize = c.bits >= 8 ? c.bits / 8 : 1;
  if (c.P % esize != 0) c.P *= esize;
  switch (ht::randint(0, 2)) {
    case 0: c.K = 128 * ht::randint(1, 24); break;  // model-like
    case 1: c.K = ht::randint(1, 40); break;        // tiny rows, many per page
    default: c.K = ht::randint(1, 5000); break;     // anything, odd included
  }
  c.N = std::max<int64_t>(1, std::min<int64_t>(ht::randint(1, 64), max_elems / c.K));
  c.offset = ht::randint(0, 3) == 0 ? 0 : ht::randint(0, c.P / esize - 1) * esize;
  c.first = static_cast<int>(ht::randint(0, c.nodes - 1));
  return c;
}

}  // namespace

TEST(paper_example) {
  // K = 6144 bf16, 4 KiB pages, 2 nodes, offset 0: Tx = 2; node 0 holds
  // row 0: [0,2048) and [4096,6144), row 1: [2048,4096); node 1 the rest.
  SegmentTable t;
  CHECK(build_interleaved_table(64, 6144, 16, 2, 4096, 0, 0, &t).empty());
  CHECK(t.period_rows == 2);
  CHECK((t.segments[0] == std::vector<Segment>{{0, 0, 2048}, {0, 4096, 6144}, {1, 2048, 4096}}));
  CHECK((t.segments[1] == std::vector<Segment>{{0, 2048, 4096}, {1, 0, 2048}, {1, 4096, 6144}}));
  CHECK(verify_table(t, Case{64, 6144, 16, 2, 4096, 0, 0}, FakePageMap{2, 0}));
  // Rows 2 and 3 repeat rows 0 and 1.
  std::vector<Segment> s;
  local_segments(t, 0, 2, 4, &s);
  CHECK((s == std::vector<Segment>{{2, 0, 2048}, {2, 4096, 6144}, {3, 2048, 4096}}));
  // The paper's other periods (bf16, 4 KiB, 2 nodes): Mixtral K=4096 -> 1,
  // K=14336 -> 2; Qwen3-30B-A3B K=2048 -> 2, K=768 -> 16.
  CHECK(period_rows(1 << 20, 4096, 16, 2, 4096) == 1);
  CHECK(period_rows(1 << 20, 14336, 16, 2, 4096) == 2);
  CHECK(period_rows(1 << 20, 2048, 16, 2, 4096) == 2);
  CHECK(period_rows(1 << 20, 768, 16, 2, 4096) == 16);
  CHECK(period_rows(3, 768, 16, 2, 4096) == 3);  // capped at rows
  // Byte form P*Nn/gcd(row_bytes, P*Nn) for other element sizes.
  CHECK(period_rows(1 << 20, 768, 32, 2, 4096) == 8192 / std::gcd(int64_t(3072), int64_t(8192)));
  CHECK(period_rows(1 << 20, 768, 8, 4, 4096) == 16384 / std::gcd(int64_t(768), int64_t(16384)));
  CHECK(period_rows(1 << 20, 768, 4, 8, 4096) == 32768 / std::gcd(int64_t(384), int64_t(32768)));
  CHECK(period_rows(1 << 20, 7, 4, 2, 4096) == 65536 / std::gcd(int64_t(28), int64_t(65536)));  // odd int4 row
}

TEST(interleaved_tables_vs_brute_force) {
  int cases = 0;
  for (int i = 0; i < 400; ++i) {
    const Case c = random_case(40000);
    SegmentTable t;
    const std::string err = build_interleaved_table(c.N, c.K, c.bits, c.nodes, c.P, c.offset, c.first, &t);
    CHECK_MSG(err.empty(), describe(c) << ": " << err);
    if (!err.empty()) continue;
    CHECK_MSG(t.period_rows == brute_period(c.N, c.K, c.bits, c.nodes, c.P),
              describe(c) << ": period " << t.period_rows << " brute " << brute_period(c.N, c.K, c.bits, c.nodes, c.P));
    CHECK(t.periodic && t.first_node == c.first && t.offset == c.offset);
    if (!verify_table(t, c, FakePageMap{c.nodes, c.first})) break;
    ++cases;
  }
  std::printf("    %d random interleaved cases verified element by element\n", cases);
}

// snap_segments: the same exact cover, boundaries only at multiples of the
// granule, each original segment's snapped range on its node, and at most
// granule / 2 elements moved per original boundary.
TEST(snapped_tables_cut_only_at_the_granule) {
  int cases = 0;
  for (int i = 0; i < 300; ++i) {
    const Case c = random_case(40000);
    SegmentTable t;
    if (!build_interleaved_table(c.N, c.K, c.bits, c.nodes, c.P, c.offset, c.first, &t).empty()) continue;
    const int64_t g = std::vector<int64_t>{2, 32, 128, 256, c.K, 2 * c.K}[size_t(ht::randint(0, 5))];
    const SegmentTable s = snap_segments(t, g);
    const std::string d = describe(c) + " granule=" + std::to_string(g);
    CHECK_MSG(s.rows == t.rows && s.cols == t.cols && s.nodes == t.nodes && s.period_rows == t.period_rows, d);
    bool ok = true;
    for (int64_t r = 0; r < t.period_rows && ok; ++r) {
      std::vector<int> orig(size_t(c.K), -1), snapped(size_t(c.K), -1);
      int64_t boundaries = 0;
      for (int n = 0; n < c.nodes; ++n) {
        const auto& rb = t.row_begin[size_t(n)];
        for (int64_t j = rb[size_t(r)]; j < rb[size_t(r) + 1]; ++j) {
          const Segment& sg = t.segments[size_t(n)][size_t(j)];
          for (int64_t k = sg.k_start; k < sg.k_end; ++k) orig[size_t(k)] = n;
          boundaries += sg.k_start > 0;
        }
        const auto& sb = s.row_begin[size_t(n)];
        for (int64_t j = sb[size_t(r)]; j < sb[size_t(r) + 1]; ++j) {
          const Segment& sg = s.segments[size_t(n)][size_t(j)];
          ok &= ht::check_at(sg.row == r && sg.k_start < sg.k_end, __FILE__, __LINE__, "snap", d);
          ok &= ht::check_at(sg.k_start % g == 0 && (sg.k_end % g == 0 || sg.k_end == c.K), __FILE__, __LINE__, "snap", d);
          if (j > sb[size_t(r)]) ok &= ht::check_at(s.segments[size_t(n)][size_t(j) - 1].k_end < sg.k_start, __FILE__, __LINE__, "snap", d);
          for (int64_t k = sg.k_start; k < sg.k_end; ++k) {
            ok &= ht::check_at(snapped[size_t(k)] == -1, __FILE__, __LINE__, "snap", d + ": element covered twice");
            snapped[size_t(k)] = n;
          }
        }
      }
      int64_t moved = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        if (snapped[size_t(k)] < 0) {
          ok &= ht::check_at(false, __FILE__, __LINE__, "snap", d + ": element not covered");
          break;
        }
        moved += snapped[size_t(k)] != orig[size_t(k)];
      }
      ok &= ht::check_at(moved <= boundaries * ((g + 1) / 2), __FILE__, __LINE__, "snap", d + ": moved " + std::to_string(moved));
    }
    cases += ok;
    if (!ok) break;
  }
  std::printf("    %d random tables snapped and checked\n", cases);
  // A granule of K: each row wholly on the node of its middle element.
  SegmentTable t;
  CHECK(build_interleaved_table(64, 6144, 16, 2, 4096, 0, 0, &t).empty());
  const SegmentTable s = snap_segments(t, 6144);
  CHECK((s.segments[0] == std::vector<Segment>{{1, 0, 6144}}));
  CHECK((s.segments[1] == std::vector<Segment>{{0, 0, 6144}}));
}

TEST(every_dtype_node_count_and_offset) {
  // Systematic sweep: each element size x node count x a few offsets, 4 KiB pages.
  for (int bits : {32, 16, 8, 4})
    for (int nodes : {2, 4, 8})
      for (int64_t K : {int64_t(768), int64_t(2048), int64_t(6144), int64_t(1000), int64_t(129)}) {
        const int64_t esize = bits >= 8 ? bits / 8 : 1;
        for (int64_t offset : {int64_t(0), esize, int64_t(4096) - esize, int64_t(1024), int64_t(96) * esize}) {
          const int64_t period = period_rows(int64_t(1) << 30, K, bits, nodes, 4096);
          const int64_t N = std::min<int64_t>(std::max<int64_t>(period + 3, 2), std::max<int64_t>(2, 150000 / K));
          Case c{N, K, bits, nodes, 4096, offset, nodes - 1};
          SegmentTable t;
          const std::string err = build_interleaved_table(c.N, c.K, bits, nodes, 4096, offset, c.first, &t);
          CHECK_MSG(err.empty(), describe(c) << ": " << err);
          if (err.empty() && !verify_table(t, c, FakePageMap{nodes, c.first})) return;
        }
      }
}

TEST(int4_segments_are_whole_elements) {
  // int4: 8192 elements per 4 KiB page; an odd K makes rows start mid-byte.
  SegmentTable t;
  CHECK(build_interleaved_table(8, 8193, 4, 2, 4096, 1, 0, &t).empty());
  // Row 0 starts at byte 1 = element offset 2 in page 0: page 0 holds 8190 elements.
  CHECK(!t.segments[0].empty() && t.segments[0][0] == (Segment{0, 0, 8190}));
  CHECK(!t.segments[1].empty() && t.segments[1][0] == (Segment{0, 8190, 8193}));
  CHECK(verify_table(t, Case{8, 8193, 4, 2, 4096, 1, 0}, FakePageMap{2, 0}));
}

TEST(one_node_tables) {
  SegmentTable t;
  CHECK(build_interleaved_table(10, 6144, 16, 1, 4096, 256, 0, &t).empty());
  CHECK(t.period_rows == 1);
  CHECK((t.segments[0] == std::vector<Segment>{{0, 0, 6144}}));
  CHECK(build_interleaved_table(10, 100, 16, 1, 4096, 0, 0, &t).empty());  // period formula: 8*4096/gcd(1600, 32768) = 512 -> capped
  CHECK(t.period_rows == 10 && t.segments[0].size() == 10);
  for (const Segment& s : t.segments[0]) CHECK(s.k_start == 0 && s.k_end == 100);
  const SegmentTable s = single_node_table(1000, 77, 4);
  CHECK(s.nodes == 1 && s.period_rows == 1 && (s.segments[0] == std::vector<Segment>{{0, 0, 77}}));
  CHECK(verify_table(s, Case{1000, 77, 4, 1, 4096, 0, 0}, [](int64_t) { return 0; }));
}

TEST(page_map_tables_vs_brute_force) {
  int cases = 0;
  for (int i = 0; i < 200; ++i) {
    Case c = random_case(30000);
    c.first = 0;
    const int64_t pages = pages_spanned(c.N, c.K, c.bits, c.P, c.offset);
    CHECK(pages == brute_page(c.N - 1, c.K - 1, c.K, c.bits, c.P, c.offset) + 1);
    std::vector<int> map(static_cast<size_t>(pages));
    const int kind = static_cast<int>(ht::randint(0, 3));
    const int64_t block = ht::randint(1, 9);
    for (int64_t p = 0; p < pages; ++p) {
      int& m = map[static_cast<size_t>(p)];
      switch (kind) {
        case 0: m = static_cast<int>(ht::randint(0, c.nodes - 1)); break;        // anything
        case 1: m = static_cast<int>((p / block) % c.nodes); break;                      // bound chunks
        case 2: m = 0; break;                                                            // first touch on node 0
        default: m = ht::randint(0, 4) == 0 ? -1 : static_cast<int>(ht::randint(0, c.nodes)); break;
      }
    }
    // Unknown (-1) and out-of-range pages go round-robin.
    auto expected = [&](int64_t p) {
      const int m = map[static_cast<size_t>(p)];
      return (m >= 0 && m < c.nodes) ? m : static_cast<int>(p % c.nodes);
    };
    std::vector<int> calls(static_cast<size_t>(pages), 0);
    SegmentTable t;
    const std::string err = build_page_map_table(
        c.N, c.K, c.bits, c.nodes, c.P, c.offset,
        PageNodeFn([&](int64_t p) {
          ++calls[static_cast<size_t>(p)];
          return map[static_cast<size_t>(p)];
        }),
        &t);
    CHECK_MSG(err.empty(), describe(c) << ": " << err);
    if (!err.empty()) continue;
    CHECK_MSG(std::all_of(calls.begin(), calls.end(), [](int n) { return n == 1; }), "one query per page");
    CHECK(!t.periodic && t.period_rows == c.N);
    if (!verify_table(t, c, expected)) break;
    ++cases;
  }
  std::printf("    %d random page-map cases verified element by element\n", cases);
  // A short map is an error, not an overrun.
  SegmentTable t;
  CHECK(!build_page_map_table(4, 4096, 16, 2, 4096, 0, std::vector<int>(3, 0), &t).empty());
}

TEST(parameter_validation) {
  SegmentTable t;
  auto bad = [&](int64_t rows, int64_t cols, int bits, int nodes, int64_t P, int64_t off, int first) {
    const std::string e = build_interleaved_table(rows, cols, bits, nodes, P, off, first, &t);
    CHECK_MSG(!e.empty(), "accepted rows=" << rows << " cols=" << cols << " bits=" << bits << " nodes=" << nodes
                                           << " P=" << P << " off=" << off << " first=" << first);
  };
  bad(0, 10, 16, 2, 4096, 0, 0);
  bad(10, 0, 16, 2, 4096, 0, 0);
  bad(10, 10, 12, 2, 4096, 0, 0);
  bad(10, 10, 16, 0, 4096, 0, 0);
  bad(10, 10, 16, 1025, 4096, 0, 0);
  bad(10, 10, 16, 2, 0, 0, 0);
  bad(10, 10, 16, 2, -4096, 0, 0);
  bad(10, 10, 32, 2, 4094, 0, 0);  // not a multiple of 4 bytes
  bad(10, 10, 16, 2, 4095, 0, 0);
  bad(10, 10, 16, 2, 4096, -2, 0);
  bad(10, 10, 16, 2, 4096, 4096, 0);
  bad(10, 10, 32, 2, 4096, 2, 0);  // element would straddle pages
  bad(10, 10, 16, 2, 4096, 0, 2);
  bad(10, 10, 16, 2, 4096, 0, -1);
  bad(int64_t(1) << 30, 1, 4, 8, int64_t(1) << 20, 0, 0);  // period 2^24 rows: too large, refused before allocating
  CHECK(build_interleaved_table(10, 10, 4, 2, 4095, 4094, 0, &t).empty());  // int4: any byte page size / offset
  CHECK(build_interleaved_table(10, 10, 8, 3, 100, 99, 2, &t).empty());
  CHECK(dtype_bits("f32") == 32 && dtype_bits("bf16") == 16 && dtype_bits("f16") == 16 && dtype_bits("int8") == 8 &&
        dtype_bits("int4") == 4 && dtype_bits("float32") == 32 && dtype_bits("q4") == 0 && dtype_bits("") == 0);
}
