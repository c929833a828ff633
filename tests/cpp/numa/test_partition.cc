// Node-partitioned execution: segment enumeration, locality, GEMV results
// under fake 2/4/8-node topologies, the one-node fast path, plan caching.
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>
#include <vector>

#include "numa/numa_partition.h"
#include "numa/plan_cache.h"
#include "../test_util.h"
#include "numa/topology.h"

using namespace hinamoe;
using namespace hinamoe::numa;

namespace {

// A weight in one of the float types, with its exact values as float.
struct Weight {
  DType dt;
  int64_t N, K;
  std::vector<uint8_t> bytes;  // the buffer as the kernels see it
  std::vector<float> value;    // W[n*K + k] as float (exact)
  const void* data() const { return bytes.data(); }
};

Weight make_weight(DType dt, int64_t N, int64_t K) {
  Weight w{dt, N, K, std::vector<uint8_t>(static_cast<size_t>(N * K) * dtype_size(dt)),
           std::vector<float>(static_cast<size_t>(N * K))};
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t i = 0; i < N * K; ++i) {
    store_from_f32(w.bytes.data(), i, dt, u(ht::rng()));
    w.value[static_cast<size_t>(i)] = load_as_f32(w.bytes.data(), i, dt);
  }
  return w;
}

std::vector<float> make_x(int64_t M, int64_t ldx) {
  std::vector<float> x(static_cast<size_t>(M * ldx), std::numeric_limits<float>::quiet_NaN());  // padding poisoned
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < ldx; ++k) x[static_cast<size_t>(m * ldx + k)] = u(ht::rng());
  return x;
}

// Checks Y[m*ldy + (n-n0)] against the float64 product within fp32 tolerance.
bool check_against_f64(const Weight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M,
                       const float* Y, int64_t ldy, const std::string& what) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < w.K; ++k) {
        const double p = double(w.value[static_cast<size_t>(n * w.K + k)]) * double(X[m * ldx + k]);
        ref += p;
        mag += std::fabs(p);
      }
      const double got = Y[m * ldy + (n - n0)];
      const double tol = 64.0 * std::numeric_limits<float>::epsilon() * mag + 1e-30;
      if (!(std::fabs(got - ref) <= tol)) {
        CHECK_MSG(false, what << ": m=" << m << " n=" << n << " got " << got << " want " << ref << " tol " << tol);
        return false;
      }
    }
  return true;
}

// A Parallel that runs every index on its own std::thread.
void run_threads(void*, size_t n, void (*fn)(void*, size_t), void* arg) {
  std::vector<std::thread> th;
  for (size_t i = 0; i < n; ++i) th.emplace_back([=] { fn(arg, i); });
  for (auto& t : th) t.join();
}
Parallel threaded() {
  Parallel p;
  p.run = run_threads;
  p.threads = 4;
  return p;
}

const DType kTypes[] = {DType::F32, DType::F16, DType::BF16};

}  // namespace

TEST(local_segment_enumeration_of_row_ranges) {
  for (int i = 0; i < 100; ++i) {
    const int nodes = 1 << ht::randint(1, 3);
    const int64_t K = 128 * ht::randint(1, 16), N = ht::randint(1, 50);
    SegmentTable t;
    CHECK(build_interleaved_table(N, K, 16, nodes, 512, 2 * ht::randint(0, 255),
                                  static_cast<int>(ht::randint(0, nodes - 1)), &t)
              .empty());
    for (int n = 0; n < nodes; ++n) {
      std::vector<Segment> all, part, sub;
      local_segments(t, n, 0, N, &all);
      const int64_t r0 = ht::randint(0, N), r1 = ht::randint(r0, N);
      local_segments(t, n, r0, r1, &sub);
      for (const Segment& s : all)
        if (s.row >= r0 && s.row < r1) part.push_back(s);
      CHECK(sub == part);
    }
  }
}

TEST(node_partials_read_only_local_elements) {
  // Poison every element that is not on node n's pages with NaN: node n's
  // partial must be unchanged (finite and equal), so it never read them.
  for (int nodes : {2, 4, 8})
    for (DType dt : kTypes) {
      const int64_t N = ht::randint(1, 24), K = 64 * ht::randint(1, 40), M = ht::randint(1, 3);
      const int64_t P = 256, esize = static_cast<int64_t>(dtype_size(dt));
      const int64_t offset = esize * ht::randint(0, P / esize - 1);
      const int first = static_cast<int>(ht::randint(0, nodes - 1));
      SegmentTable t;
      CHECK(build_interleaved_table(N, K, int(esize * 8), nodes, P, offset, first, &t).empty());
      const Weight w = make_weight(dt, N, K);
      const std::vector<float> X = make_x(M, K);
      FakePageMap map{nodes, first};
      for (int n = 0; n < nodes; ++n) {
        Weight poisoned = w;
        for (int64_t r = 0; r < N; ++r)
          for (int64_t k = 0; k < K; ++k)
            if (map((offset + (r * K + k) * esize) / P) != n)
              store_from_f32(poisoned.bytes.data(), r * K + k, dt, std::numeric_limits<float>::quiet_NaN());
        std::vector<float> clean(static_cast<size_t>(M * N)), dirty(static_cast<size_t>(M * N));
        node_partial_gemv_rows(t, n, dt, w.data(), K, 0, N, X.data(), K, M, clean.data(), N);
        node_partial_gemv_rows(t, n, dt, poisoned.data(), K, 0, N, X.data(), K, M, dirty.data(), N);
        bool same = true;
        for (size_t i = 0; i < clean.size(); ++i) same = same && clean[i] == dirty[i];
        CHECK_MSG(same, "node " << n << " of " << nodes << " read a remote element (" << dtype_name(dt) << ")");
      }
    }
}

TEST(partitioned_gemv_fake_topologies_match_f64) {
  int runs = 0;
  for (int nodes : {2, 4, 8}) {
    std::string err;
    auto topo = select_topology("fake:" + std::to_string(nodes), &err);
    CHECK(topo != nullptr);
    if (!topo) continue;
    for (int i = 0; i < 12; ++i)
      for (DType dt : kTypes) {
        const int64_t K = ht::randint(0, 1) ? 128 * ht::randint(1, 24) : ht::randint(1, 3000);
        const int64_t N = ht::randint(1, 40), M = ht::randint(1, 4);
        const int64_t ldx = K + ht::randint(0, 3);
        const Weight w = make_weight(dt, N, K);
        const std::vector<float> X = make_x(M, ldx);
        // Three placements: the fake topology's model of the real address
        // (1 KiB "pages" so small weights span many), a random interleave,
        // and a random page map (bound / first-touch memory).
        std::vector<SegmentTable> tables;
        auto plan = plan_for_weight(*topo, w.data(), N, K, int(dtype_size(dt) * 8), 1024, &err);
        CHECK_MSG(plan != nullptr, err);
        if (plan) tables.push_back(*plan);
        const int64_t esize = static_cast<int64_t>(dtype_size(dt));
        SegmentTable il, pm;
        CHECK(build_interleaved_table(N, K, int(esize * 8), nodes, 512, esize * ht::randint(0, 512 / esize - 1),
                                      static_cast<int>(ht::randint(0, nodes - 1)), &il)
                  .empty());
        tables.push_back(il);
        CHECK(build_page_map_table(N, K, int(esize * 8), nodes, 256, 0,
                                   PageNodeFn([&](int64_t) { return int(ht::randint(-1, nodes - 1)); }), &pm)
                  .empty());
        tables.push_back(pm);
        for (size_t ti = 0; ti < tables.size(); ++ti) {
          const SegmentTable& t = tables[ti];
          CHECK(t.nodes == nodes);
          const int64_t n0 = ht::randint(0, N - 1), n1 = ht::randint(n0 + 1, N);
          const int64_t ldy = (n1 - n0) + ht::randint(0, 2);
          std::vector<float> Y(static_cast<size_t>(M * ldy), -7.0f);
          std::vector<float> scratch(partitioned_scratch_floats(t, M, n0, n1));
          CHECK(scratch.size() == static_cast<size_t>(nodes * M * (n1 - n0)));
          const bool use_threads = (i + int(ti)) % 2 == 0;
          partitioned_gemv_rows(t, dt, w.data(), K, n0, n1, X.data(), ldx, M, Y.data(), ldy,
                                ti == 2 ? nullptr : scratch.data(), use_threads ? threaded() : Parallel{});
          std::ostringstream what;
          what << topo->name() << " " << dtype_name(dt) << " table " << ti << " N=" << N << " K=" << K << " M=" << M
               << " rows [" << n0 << "," << n1 << ")";
          if (!check_against_f64(w, n0, n1, X.data(), ldx, M, Y.data(), ldy, what.str())) return;
          // Padding columns of Y untouched.
          for (int64_t m = 0; m < M; ++m)
            for (int64_t j = n1 - n0; j < ldy; ++j) CHECK(Y[static_cast<size_t>(m * ldy + j)] == -7.0f);
          ++runs;
        }
      }
  }
  std::printf("    %d partitioned GEMVs matched the float64 product\n", runs);
}

namespace {
std::atomic<int> g_fast_calls{0};
void fake_fast(const void*, int64_t K, int64_t n0, int64_t n1, const float*, int64_t, int64_t M, float* Y,
               int64_t ldy) {
  ++g_fast_calls;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) Y[m * ldy + (n - n0)] = float(K * 1000 + n);
}
}  // namespace

TEST(one_node_fast_path) {
  auto topo = make_sysfs_topology();
  const int64_t N = 33, K = 1000, M = 3;
  const Weight w = make_weight(DType::BF16, N, K);
  const std::vector<float> X = make_x(M, K);
  std::string err;
  auto t = plan_for_weight(*make_fake_topology(1, *topo), w.data(), N, K, 16, 0, &err);
  CHECK(t != nullptr && t->nodes == 1 && t->period_rows == 1);
  if (!t) return;
  CHECK(partitioned_scratch_floats(*t, M, 0, N) == 0);
  // With a tier kernel: exactly one call, no partial buffers.
  std::vector<float> Y(static_cast<size_t>(M * N), 0.0f);
  g_fast_calls = 0;
  partitioned_gemv_rows(*t, DType::BF16, w.data(), K, 3, 20, X.data(), K, M, Y.data(), N, nullptr, Parallel{},
                        fake_fast);
  CHECK(g_fast_calls == 1);
  CHECK(Y[0] == float(K * 1000 + 3) && Y[static_cast<size_t>(N + 16)] == float(K * 1000 + 19));
  // Without: the reference kernel straight into Y.
  partitioned_gemv_rows(*t, DType::BF16, w.data(), K, 0, N, X.data(), K, M, Y.data(), N);
  CHECK(check_against_f64(w, 0, N, X.data(), K, M, Y.data(), N, "one node"));
}

TEST(real_topology_plan_and_gemv) {
  // On this machine (one node): the real path, correct results; on a
  // multi-node machine the table follows the pages' real nodes.
  auto topo = make_sysfs_topology();
  for (DType dt : kTypes) {
    const int64_t N = 64, K = 3000, M = 2;
    const Weight w = make_weight(dt, N, K);  // touched: pages present
    const std::vector<float> X = make_x(M, K);
    std::string err;
    auto t = plan_for_weight(*topo, w.data(), N, K, int(dtype_size(dt) * 8), 0, &err);
    CHECK_MSG(t != nullptr, err);
    if (!t) continue;
    CHECK(t->nodes == topo->num_nodes());
    std::vector<float> Y(static_cast<size_t>(M * N));
    partitioned_gemv_rows(*t, dt, w.data(), K, 0, N, X.data(), K, M, Y.data(), N, nullptr, threaded());
    CHECK(check_against_f64(w, 0, N, X.data(), K, M, Y.data(), N, std::string("sysfs ") + dtype_name(dt)));
  }
  std::string err;
  CHECK(plan_for_weight(*topo, nullptr, 4, 4, 16, 0, &err) == nullptr && !err.empty());
  int dummy = 0;
  CHECK(plan_for_weight(*topo, &dummy, 0, 4, 16, 0, &err) == nullptr);
}

TEST(plan_cache) {
  auto topo = select_topology("fake:4", nullptr);
  CHECK(topo != nullptr);
  if (!topo) return;
  PlanCache cache;
  std::vector<uint16_t> a(4096 * 8), b(4096 * 8);
  auto pa = cache.get(*topo, a.data(), 8, 4096, 16);
  auto pa2 = cache.get(*topo, a.data(), 8, 4096, 16);
  auto pb = cache.get(*topo, b.data(), 8, 4096, 16);
  auto pa3 = cache.get(*topo, a.data(), 4, 8192, 16);
  CHECK(pa && pa == pa2 && pb && pb != pa && pa3 && pa3 != pa);
  CHECK(cache.size() == 3);
  std::string err;
  CHECK(cache.get(*topo, a.data(), 0, 4096, 16, 0, &err) == nullptr && !err.empty());
  CHECK(cache.size() == 3);
  // Concurrent lookups agree.
  std::vector<std::shared_ptr<const SegmentTable>> got(8);
  std::vector<std::thread> th;
  for (int i = 0; i < 8; ++i) th.emplace_back([&, i] { got[static_cast<size_t>(i)] = cache.get(*topo, b.data(), 16, 2048, 16); });
  for (auto& x : th) x.join();
  for (auto& g : got) CHECK(g && g == got[0]);
  cache.clear();
  CHECK(cache.size() == 0);
}
