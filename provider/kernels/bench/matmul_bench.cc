// Micro-benchmark of the dense MatMul (dense/matmul.h: float16 / bfloat16
// weights [K, N] read in place) streaming from DRAM; not run in CI.
//
//   hinamoe_matmul_bench [--dtype bf16,f16] [--shape q,kv,o,all] [--m 1,4,16,64]
//                        [--threads 2] [--tier auto,avx2] [--reps 100] [--set-mib 128]
//
// --set-mib of weight copies of one shape, used in turn (by every call of
// every tier), so each call reads its weights from DRAM as a decode step does. Several tiers are
// timed alternately per point. Reports the median and 10th/90th percentile
// ms, GB/s of weights and that as a share of the read bandwidth probed
// just before the point.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bandwidth.h"
#include "bench/bench_util.h"
#include "dense/matmul.h"
#include "thread_pool.h"

using namespace hinamoe;

namespace {

using bench::now;
using bench::split;

struct Shape {
  const char* name;
  int64_t K, N;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> tier_names = {"auto"}, dtypes = {"bf16", "f16"}, shape_names = {"all"};
  std::vector<int64_t> Ms = {1, 4, 16, 64};
  int threads = 2, reps = 100;
  int64_t set_mib = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--tier") tier_names = split(v);
    else if (a == "--dtype") dtypes = split(v);
    else if (a == "--shape") shape_names = split(v);
    else if (a == "--threads") threads = std::max(1, std::atoi(v.c_str()));
    else if (a == "--set-mib") set_mib = std::max<int64_t>(1, std::atoll(v.c_str()));
    else if (a == "--reps") reps = std::max(5, std::atoi(v.c_str()));
    else if (a == "--m") { Ms.clear(); for (auto& s : split(v)) Ms.push_back(std::atoll(s.c_str())); }
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
  }
  std::vector<const KernelTier*> tiers;
  for (const std::string& n : tier_names) {
    std::string err;
    const KernelTier* t = select_tier(n, &err);
    if (t == nullptr) { std::fprintf(stderr, "%s\n", err.c_str()); return 2; }
    tiers.push_back(t);
  }
  // Qwen3-30B-A3B's attention projections (hidden 2048, 32 x 128 query and
  // 4 x 128 key/value heads).
  const std::vector<Shape> known = {{"q", 2048, 4096}, {"kv", 2048, 512}, {"o", 4096, 2048}};
  std::vector<Shape> shapes;
  for (const Shape& s : known)
    for (const std::string& n : shape_names)
      if (n == "all" || n == s.name) shapes.push_back(s);
  if (shapes.empty()) { std::fprintf(stderr, "--shape q,kv,o,all\n"); return 2; }

  ThreadPool pool(threads);
  const Parallel par = pool.parallel();
  std::printf("%d threads\n%-6s %-5s %5s %5s %4s %9s %9s %9s %8s %6s\n", threads, "tier", "dtype", "K", "N", "M",
              "ms p50", "p10", "p90", "GB/s", "%BW");
  std::mt19937_64 g(42);
  for (const std::string& dn : dtypes) {
    const DType dt = dn == "f16" ? DType::F16 : DType::BF16;
    for (const Shape& s : shapes) {
      const int64_t bytes = s.K * s.N * 2;
      const int64_t copies = std::max<int64_t>(2, (set_mib << 20) / bytes);
      std::vector<uint16_t> w(size_t(copies * s.K * s.N));
      for (size_t i = 0; i < w.size(); ++i) store_from_f32(w.data(), int64_t(i), dt, float(int(g() % 2001) - 1000) / 8e3f);
      for (int64_t M : Ms) {
        std::vector<uint16_t> a(size_t(M * s.K)), y(size_t(M * s.N));
        for (size_t i = 0; i < a.size(); ++i) store_from_f32(a.data(), int64_t(i), dt, float(int(g() % 2001) - 1000) / 1e3f);
        const double bw = read_bandwidth_gbs(size_t(256) << 20, threads, 1);
        std::vector<std::vector<double>> ts(tiers.size());
        for (int r = 0; r < reps + int(copies); ++r)
          for (size_t ti = 0; ti < tiers.size(); ++ti) {
            MatMulTensors t;
            t.dtype = dt;
            t.a = a.data();
            t.b = w.data() + size_t(((r * int64_t(tiers.size()) + int64_t(ti)) % copies) * s.K * s.N);
            t.y = y.data();
            t.M = M;
            t.K = s.K;
            t.N = s.N;
            const double t0 = now();
            const std::string err = matmul(t, *tiers[ti], par);
            const double dt_s = now() - t0;
            if (!err.empty()) { std::fprintf(stderr, "matmul: %s\n", err.c_str()); return 1; }
            if (r >= copies) ts[ti].push_back(dt_s);  // the first round warms up
          }
        for (size_t ti = 0; ti < tiers.size(); ++ti) {
          auto& v = ts[ti];
          std::sort(v.begin(), v.end());
          const double p50 = v[v.size() / 2], p10 = v[v.size() / 10], p90 = v[v.size() * 9 / 10];
          const double gbs = double(bytes) / p50 / 1e9;
          std::printf("%-6s %-5s %5lld %5lld %4lld %9.3f %9.3f %9.3f %8.1f %5.0f%%\n", tiers[ti]->name, dn.c_str(),
                      (long long)s.K, (long long)s.N, (long long)M, p50 * 1e3, p10 * 1e3, p90 * 1e3, gbs,
                      bw > 0 ? 100.0 * gbs / bw : 0.0);
        }
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
