// NUMA-partitioned MoE execution (issue 6 "Execution", DESIGN.md §4):
// moe_ffn under fake 2/4/8-node topologies equals the float64 reference
// (same tolerance as test_moe_ffn.cc) and the unpartitioned result, for every
// tier (the AMX tiers' bf16 block path included), dtype, activation and gate
// layout, odd sizes, weights that do not
// start on a page boundary; the one-node path makes no partitioned calls;
// the strided tier kernel; the topology/C-ABI entry points the EP uses.
#include <algorithm>
#include <memory>

#include "c_api.h"
#include "moe/moe_ffn.h"
#include "numa/plan_cache.h"
#include "numa/topology.h"
#include "ref_moe.h"
#include "test_util.h"
#include "moe_test_helpers.h"
#include "thread_pool.h"

using namespace hinamoe;

namespace {

// A copy of a buffer's bytes at a chosen byte offset from a 4 KiB boundary,
// so weights start mid-page (plans see offset = address mod page size).
struct Placed {
  std::vector<uint8_t> store;
  void* p = nullptr;
  Placed() = default;
  Placed(const ht::Buf& b, size_t offset) {
    if (b.raw.empty()) return;
    store.resize(b.raw.size() + offset + 4096);
    const uintptr_t base = (reinterpret_cast<uintptr_t>(store.data()) + 4095) & ~uintptr_t(4095);
    p = reinterpret_cast<void*>(base + offset);
    std::memcpy(p, b.raw.data(), b.raw.size());
  }
};

struct Shape {
  int64_t T, H, I, E, k;
};

const numa::Topology& fake(int nodes) {
  static std::unique_ptr<numa::Topology> t[9];
  if (!t[nodes]) t[nodes] = numa::select_topology("fake:" + std::to_string(nodes), nullptr);
  return *t[nodes];
}

double tolerance(int dtype, const std::vector<double>& want) {
  double scale = 1e-3;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  return (dtype == 0 ? 1e-4 : dtype == 1 ? 2e-3 : 1e-2) * scale;
}

double max_diff(const std::vector<uint8_t>& out, int dtype, const std::vector<double>& want) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = ht::read_raw(out.data(), i, dtype);
    worst = std::max(worst, std::isnan(g) ? INFINITY : std::fabs(g - want[i]));
  }
  return worst;
}

// One configuration under `nodes` fake nodes: against the reference and the
// unpartitioned run of the same tier.
void run_case(const KernelTier& tier, const Parallel& par, int dtype, const Shape& sh, int act, int layout, bool bias,
              int nodes, int64_t page_size) {
  const bool gated = act == 4 || act == 5;
  const int64_t T = sh.T, H = sh.H, I = sh.I, E = sh.E, k = sh.k;
  const int64_t N1 = gated && layout != 0 ? 2 * I : I;
  const size_t es = dtype == 0 ? 4 : 2;
  ht::Buf x = ht::random_buf(dtype, size_t(T * H), 1.0), lg = ht::random_buf(dtype, size_t(T * E), 2.0);
  ht::Buf w1 = ht::random_buf(dtype, size_t(E * N1 * H), 0.125), w2 = ht::random_buf(dtype, size_t(E * H * I), 0.125);
  ht::Buf w3, b1, b2, b3;
  if (gated && layout == 0) w3 = ht::random_buf(dtype, size_t(E * I * H), 0.125);
  if (bias) {
    b1 = ht::random_buf(dtype, size_t(E * N1), 0.25);
    b2 = ht::random_buf(dtype, size_t(E * H), 0.25);
    if (gated && layout == 0) b3 = ht::random_buf(dtype, size_t(E * I), 0.25);
  }
  // Weights mid-page: offsets in elements, odd ones included.
  Placed pw1(w1, es * size_t(ht::randint(1, 1500))), pw2(w2, es * size_t(ht::randint(0, 1500))),
      pw3(w3, es * size_t(ht::randint(1, 1500)));
  ref::Params P;
  P.act = act;
  P.layout = layout;
  P.alpha = double(1.702f);
  P.beta = 1.0;
  P.limit = 7.0;
  const std::vector<double> want = ref::moe(T, H, I, E, k, P, x.val, lg.val, w1.val, b1.val, w2.val, b2.val, w3.val, b3.val);

  MoEShape s{T, H, I, E};
  MoEAttrs a;
  a.k = k;
  a.activation = Activation(act);
  a.gate_layout = GateLayout(layout);
  a.alpha = 1.702f;
  a.beta = 1.0f;
  a.limit = 7.0f;
  MoETensors t;
  t.dtype = DType(dtype);
  t.input = x.data();
  t.router = lg.data();
  t.fc1_w = pw1.p;
  t.fc1_b = b1.data();
  t.fc2_w = pw2.p;
  t.fc2_b = b2.data();
  t.fc3_w = pw3.p;
  t.fc3_b = b3.data();
  std::vector<uint8_t> plain(size_t(T * H) * es), part(size_t(T * H) * es);
  ht::poison(plain);
  ht::poison(part);
  t.output = plain.data();
  const std::string e0 = moe_ffn(s, a, t, tier, par);
  numa::PlanCache plans;
  MoEStats stats;
  MoEOptions opt;
  opt.topology = &fake(nodes);
  opt.plans = &plans;
  opt.page_size = page_size;
  opt.stats = &stats;
  t.output = part.data();
  const std::string e1 = moe_ffn(s, a, t, tier, par, opt);
  const std::string what = ht::fmt("%s %s act=%d layout=%d T=%lld H=%lld I=%lld E=%lld k=%lld bias=%d nodes=%d "
                                   "page=%lld threads=%d",
                                   tier.name, ht::dtype_str(dtype), act, layout, (long long)T, (long long)H,
                                   (long long)I, (long long)E, (long long)k, int(bias), nodes, (long long)page_size,
                                   par.threads);
  if (!ht::check(e0.empty() && e1.empty(), what + ": errors '" + e0 + "' '" + e1 + "'")) return;
  const double tol = tolerance(dtype, want);
  const double d_ref = max_diff(part, dtype, want);
  ht::check(d_ref <= tol, what + ht::fmt(": partitioned vs reference max error %.3g > %.3g", d_ref, tol));
  std::vector<double> plain_v(want.size());
  for (size_t i = 0; i < plain_v.size(); ++i) plain_v[i] = ht::read_raw(plain.data(), i, dtype);
  const double d_plain = max_diff(part, dtype, plain_v);
  ht::check(d_plain <= tol, what + ht::fmt(": partitioned vs unpartitioned max diff %.3g > %.3g", d_plain, tol));
  // Every path is partitioned (the AMX tiers' bf16 blocks included): both
  // GEMM phases of every token chunk, with node items computed.
  ht::check(stats.partitioned_phases >= 2 && stats.partitioned_phases % 2 == 0 && stats.partition_items > 0,
            what + ht::fmt(": partitioned phases %lld items %lld", (long long)stats.partitioned_phases,
                           (long long)stats.partition_items));
}


}  // namespace

TEST(moe_numa_fake_topologies_match_reference) {
  // Sizes off multiples of 8/16/32; small simulated pages give small weights
  // many segments (rows split mid-row, several segments per row and node).
  const std::vector<Shape> shapes = {{5, 100, 37, 4, 2}, {1, 77, 45, 3, 3}, {13, 130, 29, 6, 2},
                                     {33, 61, 70, 5, 1}, {9, 257, 19, 8, 4}};
  const int combos[][2] = {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {6, 0}, {4, 0}, {4, 1}, {4, 2}, {5, 0}, {5, 1}, {5, 2}};
  const int64_t pages[] = {64, 256, 4096, 96};
  ThreadPool pool3(3);
  size_t n = 0;
  for (const KernelTier* tier : tiers_here())
    for (int dtype = 0; dtype < 3; ++dtype)
      for (const auto& c : combos) {
        const int nodes = 2 << (n % 3);
        run_case(*tier, n % 2 ? pool3.parallel() : serial(), dtype, shapes[n % shapes.size()], c[0], c[1],
                 (n / 2) % 2 == 0, nodes, pages[(n / 3) % 4]);
        ++n;
      }
}

TEST(moe_numa_system_pages_and_large_rows) {
  // Real page size, rows longer than a page (K = 2100 f32 = 8400 bytes) and
  // the paper's kind of shape for bf16/f16 (K = 6144 -> periodic tables).
  ThreadPool pool2(2);
  for (const KernelTier* tier : tiers_here()) {
    run_case(*tier, pool2.parallel(), 0, {3, 2100, 24, 2, 1}, 2, 0, true, 2, 0);
    run_case(*tier, serial(), 2, {2, 6144, 16, 2, 2}, 4, 2, false, 2, 0);
    run_case(*tier, pool2.parallel(), 1, {4, 1024, 40, 3, 2}, 5, 1, true, 8, 0);
  }
}

TEST(moe_numa_one_node_makes_no_partitioned_calls) {
  SmallMoE c(6, 40, 24, 4);
  const MoEShape& s = c.s;
  const MoEAttrs& a = c.a;
  const MoETensors& t = c.t;
  const std::unique_ptr<numa::Topology> sys = numa::select_topology("sysfs", nullptr);
  for (const KernelTier* tier : tiers_here()) {
    MoEStats st;
    st.partitioned_phases = -1;
    MoEOptions opt;
    opt.stats = &st;
    CHECK(moe_ffn(s, a, t, *tier, serial(), opt).empty());
    CHECK_MSG(st.partitioned_phases == 0 && st.partition_items == 0, tier->name << " no topology: phases "
                                                                                  << st.partitioned_phases);
    if (sys->num_nodes() == 1) {
      opt.topology = sys.get();
      CHECK(moe_ffn(s, a, t, *tier, serial(), opt).empty());
      CHECK_MSG(st.partitioned_phases == 0 && st.partition_items == 0,
                tier->name << " one-node sysfs topology: phases " << st.partitioned_phases);
    }
    // Fake 8 nodes, one worker: it starts on its own node and steals the rest.
    opt.topology = &fake(8);
    CHECK(moe_ffn(s, a, t, *tier, serial(), opt).empty());
    CHECK_MSG(st.partitioned_phases == 2 && st.partition_items > 0 && st.stolen_items > 0,
              tier->name << " fake:8: phases " << st.partitioned_phases << " items " << st.partition_items
                         << " stolen " << st.stolen_items);
  }
}

TEST(gemm_rows_strided_matches_gemm_rows) {
  // Y over a K slice of rows ldw apart == gemm_rows of the same rows copied out.
  for (const KernelTier* tier : tiers_here()) {
    for (int dtype = 0; dtype < 3; ++dtype) {
      if (!tier->gemm_rows_strided[dtype]) {
        CHECK_MSG(false, tier->name << " has no strided " << ht::dtype_str(dtype) << " kernel");
        continue;
      }
      for (int rep = 0; rep < 6; ++rep) {
        const int64_t K = ht::randint(1, 300), ldw = K + ht::randint(0, 50), N = ht::randint(1, 20);
        const int64_t M = ht::randint(1, 9), ldx = K + ht::randint(0, 5), ldy = N + ht::randint(0, 3);
        const size_t es = dtype == 0 ? 4 : 2;
        ht::Buf w = ht::random_buf(dtype, size_t(N * ldw), 0.5);
        std::vector<float> X(size_t(M * ldx));
        for (auto& v : X) v = float(ht::grid_value(0, 1.0));
        std::vector<uint8_t> packed(size_t(N * K) * es);
        for (int64_t n = 0; n < N; ++n) std::memcpy(&packed[size_t(n * K) * es], &w.raw[size_t(n * ldw) * es], size_t(K) * es);
        const int64_t n0 = ht::randint(0, N - 1), n1 = ht::randint(n0 + 1, N);
        std::vector<float> y1(size_t(M * ldy), -7.0f), y2(size_t(M * ldy), -7.0f);
        tier->gemm_rows_strided[dtype](w.data(), ldw, K, n0, n1, X.data(), ldx, M, y1.data(), ldy);
        tier->gemm_rows[dtype](packed.data(), K, n0, n1, X.data(), ldx, M, y2.data(), ldy);
        double worst = 0;
        for (size_t i = 0; i < y1.size(); ++i) worst = std::max(worst, double(std::fabs(y1[i] - y2[i])));
        CHECK_MSG(worst <= 1e-4, tier->name << " " << ht::dtype_str(dtype) << " K=" << K << " ldw=" << ldw
                                            << " M=" << M << " max diff " << worst);
      }
    }
  }
}

TEST(numa_topology_selection_for_the_ep) {
  std::string err;
  const std::unique_ptr<numa::Topology> sys = numa::select_topology("auto", &err);
  CHECK_MSG(sys && sys->num_nodes() >= 1, "sysfs topology: " << err);
  std::printf("    sysfs: %d node(s); C ABI: auto=%d off=%d fake:4=%d\n", sys ? sys->num_nodes() : -1,
              hinamoe_numa_nodes("auto", nullptr, 0), hinamoe_numa_nodes("off", nullptr, 0),
              hinamoe_numa_nodes("fake:4", nullptr, 0));
  CHECK(hinamoe_numa_nodes("auto", nullptr, 0) == (sys ? sys->num_nodes() : -1));
  CHECK(hinamoe_numa_nodes(nullptr, nullptr, 0) == 1 && hinamoe_numa_nodes("off", nullptr, 0) == 1);
  CHECK(hinamoe_numa_nodes("fake:2", nullptr, 0) == 2 && hinamoe_numa_nodes("fake:8", nullptr, 0) == 8);
  char msg[256];
  CHECK(hinamoe_numa_nodes("fake:3", msg, sizeof msg) == -1 && std::string(msg).find("fake:4") != std::string::npos);
}

TEST(c_api_moe_ffn_ex_numa) {
  const int64_t T = 7, H = 300, I = 50, E = 4, k = 2;
  for (int dtype = 0; dtype < 3; ++dtype) {
    ht::Buf x = ht::random_buf(dtype, size_t(T * H), 1.0), lg = ht::random_buf(dtype, size_t(T * E), 1.0);
    ht::Buf w1 = ht::random_buf(dtype, size_t(E * 2 * I * H), 0.125), w2 = ht::random_buf(dtype, size_t(E * H * I), 0.125);
    ref::Params P;
    P.act = 4;
    P.layout = 1;
    P.alpha = double(1.702f);
    const auto want = ref::moe(T, H, I, E, k, P, x.val, lg.val, w1.val, {}, w2.val, {}, {}, {});
    const size_t es = dtype == 0 ? 4 : 2;
    for (const char* numa : {"off", "auto", "fake:2", "fake:4", "fake:8"}) {
      std::vector<uint8_t> out(size_t(T * H) * es);
      ht::poison(out);
      char msg[256];
      const int rc = hinamoe_moe_ffn_ex(T, H, I, E, k, 4, 1, 0, 1.702f, 0.0f, INFINITY, 0, dtype, x.data(),
                                        lg.data(), w1.data(), nullptr, w2.data(), nullptr, nullptr, nullptr,
                                        out.data(), "auto", 2, numa, 256, msg, sizeof msg);
      const double d = max_diff(out, dtype, want), tol = tolerance(dtype, want);
      CHECK_MSG(rc == 0 && d <= tol, ht::dtype_str(dtype) << " numa=" << numa << " rc=" << rc << " '" << msg
                                                          << "' max error " << d << " tol " << tol);
    }
  }
  char msg[256];
  std::vector<float> out(size_t(T * H));
  ht::Buf x = ht::random_buf(0, size_t(T * H), 1.0), lg = ht::random_buf(0, size_t(T * E), 1.0);
  ht::Buf w1 = ht::random_buf(0, size_t(E * I * H), 0.125), w2 = ht::random_buf(0, size_t(E * H * I), 0.125);
  const int rc = hinamoe_moe_ffn_ex(T, H, I, E, k, 0, 0, 0, 1.0f, 0.0f, INFINITY, 0, 0, x.data(), lg.data(),
                                    w1.data(), nullptr, w2.data(), nullptr, nullptr, nullptr, out.data(), "ref", 1,
                                    "fake:5", 0, msg, sizeof msg);
  CHECK_MSG(rc == 2 && std::string(msg).find("fake:2") != std::string::npos, "bad topology name: rc=" << rc << " " << msg);
}
