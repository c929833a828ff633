// Micro-benchmark for tuning the kernels (not run in CI).
//
//   hinamoe_kernel_bench [--shape qwen3|dsv3|both|mixtral|gptoss] [--dtype f32|f16|bf16|all]
//                        [--m 1,2,4,8,16] [--threads 2] [--tier auto] [--kernel]
//                        [--numa-sim 0,1,2,4,8]
//
// Default mode runs moe_ffn with E experts all hit by every token (k = E = 8),
// so each expert sees exactly M tokens, and reports weight bytes touched per
// second and the share of the measured read bandwidth. --kernel times
// gemm_rows alone on the phase-1 ("up": [8*2I, H]) and phase-2 ("down":
// [8*H, I]) matrices, each split over the threads (the qwen3 down matrix fits
// in a 32 MiB L3, so those numbers are not DRAM-bound).
// --numa-sim runs moe_ffn once per listed topology, interleaved per M:
// 0 = no topology (MoEOptions default), 1 = this machine's sysfs topology
// (one node here: the one-branch path), 2/4/8 = fake:N (the partitioned path
// with pages modelled as interleaved; on one real node it shows the cost of
// the partitioning, not any NUMA gain).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>


#include "bandwidth.h"
#include "fma_peak.h"
#include "bench/bench_util.h"
#include "moe/moe_ffn.h"
#include "numa/plan_cache.h"
#include "numa/topology.h"
#include "thread_pool.h"

using namespace hinamoe;

namespace {

using bench::now;
using bench::split;

std::vector<uint8_t> random_bytes(size_t n, DType dt, float scale, uint64_t seed) {
  std::vector<uint8_t> v(n * dtype_size(dt));
  std::mt19937 g{static_cast<uint32_t>(seed)};
  std::uniform_real_distribution<float> u(-scale, scale);
  for (size_t i = 0; i < n; ++i) store_from_f32(v.data(), int64_t(i), dt, u(g));
  return v;
}

// Best (minimum) seconds of fn() over ~min_time, after one warm-up call: the
// machine is shared, and interference only ever makes a call slower.
template <class F>
double time_it(F&& fn, double min_time = 0.6) {
  fn();
  std::vector<double> ts;
  const double start = now();
  while (ts.size() < 3 || (now() - start < min_time && ts.size() < 2000)) {
    const double t0 = now();
    fn();
    ts.push_back(now() - t0);
  }
  return *std::min_element(ts.begin(), ts.end());
}

struct Shape {
  const char* name;
  int64_t H, I;
};

// gemm_rows on one thread with W resident in L2: in-core efficiency vs the FMA peak.
void bench_incache(const KernelTier& tier, const std::vector<DType>& dts, const std::vector<int64_t>& Ms) {
  const double peak = fma_peak_per_s(1);
  std::printf("one core FMA peak %.1f G lane-FMA/s (%.2f GHz at 2 FMA/cycle)\n", peak / 1e9, peak / 16e9);
  std::printf("%-5s %4s %6s %12s %8s\n", "dtype", "M", "K", "G elem/s", "%peak");
  for (DType dt : dts) {
    for (int64_t K : {768, 2000, 2048, 7168}) {
      const int64_t N = std::max<int64_t>(12, (160 * 1024) / (K * int64_t(dtype_size(dt))) / 12 * 12);
      const int64_t ldx = K + std::atoi(std::getenv("LDXPAD") ? std::getenv("LDXPAD") : "0");
      auto W = random_bytes(size_t(N * K), dt, 0.05f, 1);
      for (int64_t M : Ms) {
        std::vector<float> X(size_t(M * ldx), 0.5f), Y(size_t(M * N));
        const double s = time_it([&] { tier.gemm_rows[int(dt)](W.data(), K, 0, N, X.data(), ldx, M, Y.data(), N); }, 0.3);
        const double lane_fmas = double(N * K * M) / s;
        std::printf("%-5s %4lld %6lld %12.2f %7.1f%%\n", dtype_name(dt), (long long)M, (long long)K,
                    double(N * K) / s / 1e9, 100 * lane_fmas / peak);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape_arg = "qwen3", dtype_arg = "all", m_arg = "1,2,4,8,16", tier_arg = "auto", numa_arg = "0";
  int threads = 2;
  bool kernel_only = false, incache = false;
  double probe_gbs = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--shape") shape_arg = next();
    else if (a == "--dtype") dtype_arg = next();
    else if (a == "--m") m_arg = next();
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--tier") tier_arg = next();
    else if (a == "--kernel") kernel_only = true;
    else if (a == "--numa-sim") numa_arg = next();
    else if (a == "--incache") incache = true;
    else if (a == "--probe") probe_gbs = std::atof(next().c_str());
    else { std::fprintf(stderr, "unknown argument %s\n", a.c_str()); return 2; }
  }
  std::string err;
  const KernelTier* tier = select_tier(tier_arg, &err);
  if (!tier) { std::fprintf(stderr, "%s\n", err.c_str()); return 2; }
  // Best of a few probes (each a median of 7 passes over 1 GiB).
  std::vector<DType> dts;
  for (auto& d : split(dtype_arg == "all" ? "bf16,f16,f32" : dtype_arg))
    dts.push_back(d == "f32" ? DType::F32 : d == "f16" ? DType::F16 : DType::BF16);
  std::vector<int64_t> Ms;
  for (auto& m : split(m_arg)) Ms.push_back(std::atoll(m.c_str()));
  if (incache) {
    bench_incache(*tier, dts, Ms);
    return 0;
  }
  if (probe_gbs <= 0)
    for (int i = 0; i < 3; ++i) probe_gbs = std::max(probe_gbs, read_bandwidth_gbs(size_t(1) << 30, threads, 7));
  std::printf("tier %s, %d threads, read bandwidth probe %.1f GB/s\n", tier->name, threads, probe_gbs);

  std::vector<Shape> shapes;
  if (shape_arg == "qwen3" || shape_arg == "both") shapes.push_back({"qwen3-30b-a3b", 2048, 768});
  if (shape_arg == "dsv3" || shape_arg == "both") shapes.push_back({"deepseek-v3", 7168, 2048});
  if (shape_arg == "mixtral") shapes.push_back({"mixtral-8x7b", 4096, 14336});
  if (shape_arg == "gptoss") shapes.push_back({"gpt-oss-20b", 2880, 2880});
  if (shapes.empty()) { std::fprintf(stderr, "--shape %s: qwen3, dsv3, both, mixtral or gptoss\n", shape_arg.c_str()); return 2; }

  // Topologies of --numa-sim (null = none).
  std::vector<std::unique_ptr<numa::Topology>> topos;
  for (auto& n : split(numa_arg)) {
    if (n == "0") { topos.push_back(nullptr); continue; }
    auto t = numa::select_topology(n == "1" ? "sysfs" : "fake:" + n, &err);
    if (!t) { std::fprintf(stderr, "--numa-sim %s: %s\n", n.c_str(), err.c_str()); return 2; }
    topos.push_back(std::move(t));
  }
  numa::PlanCache plans;
  ThreadPool pool(threads);
  const Parallel par = pool.parallel();
  std::printf("%-14s %-5s %4s %10s %9s %7s %12s\n", "shape", "dtype", "M", "ms/call", "GB/s", "%probe", "GFLOP/s");
  for (const Shape& sh : shapes) {
    for (DType dt : dts) {
      const int64_t E = 8, H = sh.H, I = sh.I;
      if (kernel_only) {
        // gemm_rows alone on one matrix split over the threads: "up" = all 8
        // experts' gate+up rows [8*2I, H] (phase 1), "down" = [8*H, I] (phase 2).
        for (int pass = 0; pass < 2; ++pass) {
          const int64_t N = pass == 0 ? E * 2 * I : E * H, K = pass == 0 ? H : I;
          const int64_t ldx = (K + 15) / 16 * 16 + ((K + 15) / 16 * 16 % 512 == 0 ? 16 : 0);
          auto W = random_bytes(size_t(N * K), dt, 0.05f, 1);
          for (int64_t M : Ms) {
            std::vector<float> X(size_t(M * ldx), 0.5f), Y(size_t(M * N));
            const int64_t items = 8 * threads, blk = ((N + items - 1) / items + 7) / 8 * 8;
            auto fn = [&] {
              par.for_each(size_t(items), [&](size_t it) {
                const int64_t n0 = std::min(N, int64_t(it) * blk), n1 = std::min(N, n0 + blk);
                tier->gemm_rows[int(dt)](W.data(), K, n0, n1, X.data(), ldx, M, Y.data() + n0, N);
              });
            };
            const double s = time_it(fn);
            const double gbs = double(W.size()) / s / 1e9;
            std::printf("%-14s %-5s %4lld %10.3f %9.2f %6.1f%% %12.1f  (gemm_rows only, %s K=%lld)\n", sh.name,
                        dtype_name(dt), (long long)M, s * 1e3, gbs, 100 * gbs / probe_gbs, 2.0 * double(N * K * M) / s / 1e9,
                        pass == 0 ? "up" : "down", (long long)K);
          }
        }
        continue;
      }
      // Separate layout SwiGLU (Qwen/DeepSeek style): fc1 = gate, fc3 = up, fc2 = down.
      auto w1 = random_bytes(size_t(E * I * H), dt, 0.05f, 1);
      auto w3 = random_bytes(size_t(E * I * H), dt, 0.05f, 2);
      auto w2 = random_bytes(size_t(E * H * I), dt, 0.05f, 3);
      const double wbytes = double(w1.size() + w2.size() + w3.size());
      for (int64_t M : Ms) {
        auto x = random_bytes(size_t(M * H), dt, 1.0f, 4);
        auto lg = random_bytes(size_t(M * E), dt, 1.0f, 5);
        std::vector<uint8_t> out(size_t(M * H) * dtype_size(dt));
        MoEShape s{M, H, I, E};
        MoEAttrs a;
        a.k = E;  // every token hits every expert: M tokens per expert
        a.activation = Activation::SwiGLU;
        a.gate_layout = GateLayout::Separate;
        MoETensors t;
        t.dtype = dt;
        t.input = x.data(); t.router = lg.data();
        t.fc1_w = w1.data(); t.fc2_w = w2.data(); t.fc3_w = w3.data();
        t.output = out.data();
        for (const auto& topo : topos) {
          std::string e;
          MoEOptions opt;
          opt.topology = topo.get();
          opt.plans = &plans;
          const double sec = time_it([&] { e = moe_ffn(s, a, t, *tier, par, opt); });
          if (!e.empty()) { std::fprintf(stderr, "error: %s\n", e.c_str()); return 1; }
          const double gbs = wbytes / sec / 1e9;
          const double gflops = 2.0 * 3.0 * double(E * H * I * M) / sec / 1e9;
          std::printf("%-14s %-5s %4lld %10.3f %9.2f %6.1f%% %12.1f", sh.name, dtype_name(dt), (long long)M,
                      sec * 1e3, gbs, 100 * gbs / probe_gbs, gflops);
          if (topos.size() > 1 || topo) std::printf("  numa=%s", topo ? topo->name().c_str() : "none");
          std::printf("\n");
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
