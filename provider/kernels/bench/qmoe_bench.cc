// Micro-benchmark of the whole QMoE block (qmoe_ffn: routing, gather, the
// quantised GEMMs of a tier, activation, combine) streaming from DRAM, for
// tuning the quantised kernels; not run in CI.
//
//   hinamoe_qmoe_bench [--shape qwen3|gptoss|mixtral|dsv3|all] [--bits 4,8]
//                      [--block 32] [--m 1,2,4,8,16] [--threads 2]
//                      [--tier auto] [--al 0,4] [--reps 200] [--layer-mib 128]
//
// The layer holds enough experts for ~4x the last-level cache (--layer-mib:
// a small layer, e.g. 8, stays in cache and shows the compute bound); each call
// routes all tokens to k experts (M tokens each), and the active experts
// rotate from call to call, so the codes come from DRAM as in decode.
// Reports the median and 10th/90th percentile ms, GB/s of packed codes plus
// float scales, and that as a share of the read bandwidth probed just before
// the point.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bandwidth.h"
#include "bench/bench_util.h"
#include "qmoe/qmoe_ffn.h"
#include "thread_pool.h"

using namespace hinamoe;

namespace {

using bench::now;
using bench::split;

struct Shape {
  const char* name;
  int64_t H, I, k;
};

}  // namespace

int main(int argc, char** argv) {
  std::string tier_name = "auto", shape = "qwen3";
  std::vector<int> bitss = {4, 8}, als = {0, 4};
  std::vector<int64_t> Ms = {1, 2, 4, 8, 16};
  int64_t block = 32;
  int threads = 2, reps = 200;
  int64_t layer_mib = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--tier") tier_name = v;
    else if (a == "--shape") shape = v;
    else if (a == "--block") block = std::atoll(v.c_str());
    else if (a == "--threads") threads = std::max(1, std::atoi(v.c_str()));
    else if (a == "--layer-mib") layer_mib = std::max<int64_t>(1, std::atoll(v.c_str()));
    else if (a == "--reps") reps = std::max(5, std::atoi(v.c_str()));
    else if (a == "--bits") { bitss.clear(); for (auto& s : split(v)) bitss.push_back(std::atoi(s.c_str())); }
    else if (a == "--al") { als.clear(); for (auto& s : split(v)) als.push_back(std::atoi(s.c_str())); }
    else if (a == "--m") { Ms.clear(); for (auto& s : split(v)) Ms.push_back(std::atoll(s.c_str())); }
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
  }
  std::string err;
  const KernelTier* tier = select_tier(tier_name, &err);
  if (tier == nullptr) { std::fprintf(stderr, "%s\n", err.c_str()); return 2; }
  std::vector<Shape> shapes;
  const bool all = shape == "all";
  if (all || shape == "qwen3") shapes.push_back({"qwen3-30b-a3b", 2048, 768, 8});
  if (all || shape == "gptoss") shapes.push_back({"gpt-oss-20b", 2880, 2880, 4});
  if (all || shape == "mixtral") shapes.push_back({"mixtral-8x7b", 4096, 14336, 2});
  if (all || shape == "dsv3") shapes.push_back({"deepseek-v3", 7168, 2048, 8});
  if (shapes.empty()) { std::fprintf(stderr, "--shape qwen3|gptoss|mixtral|dsv3|all\n"); return 2; }

  ThreadPool pool(threads);
  const Parallel par = pool.parallel();
  std::printf("tier %s, %d threads, block %lld\n", tier->name, threads, (long long)block);
  std::printf("%-14s %4s %3s %3s %9s %9s %9s %8s %6s\n", "shape", "bits", "al", "M", "ms p50", "p10", "p90",
              "GB/s", "%BW");
  std::mt19937_64 g(42);
  for (const Shape& s : shapes) {
    for (int bits : bitss) {
      const int64_t nb1 = (s.H + block - 1) / block, nb2 = (s.I + block - 1) / block;
      const int64_t per_expert = 2 * s.I * s.H * bits / 8 + s.H * s.I * bits / 8 + 4 * (2 * s.I * nb1 + s.H * nb2);
      const int64_t E = std::max<int64_t>(s.k, (layer_mib << 20) / per_expert / s.k * s.k);
      std::vector<uint8_t> w1(size_t(E * 2 * s.I * s.H * bits / 8)), w2(size_t(E * s.H * s.I * bits / 8));
      for (auto& c : w1) c = uint8_t(g());
      for (auto& c : w2) c = uint8_t(g());
      std::vector<float> s1(size_t(E * 2 * s.I * nb1)), s2(size_t(E * s.H * nb2));
      for (auto& v : s1) v = float(1 + g() % 100) / 4096.0f;
      for (auto& v : s2) v = float(1 + g() % 100) / 4096.0f;
      const double bytes = double(s.k) * double(per_expert);
      for (int al : als) {
        for (int64_t M : Ms) {
          QMoEAttrs at;
          at.moe.k = s.k;
          at.moe.activation = Activation::SwiGLU;
          at.moe.gate_layout = GateLayout::Interleaved;
          at.moe.alpha = 1.702f;
          at.moe.beta = 1.0f;
          at.bits = bits;
          at.block_size = block;
          at.int8_activations = al == 4;
          MoEShape sh{M, s.H, s.I, E};
          std::vector<float> x(size_t(M * s.H)), out(size_t(M * s.H));
          for (auto& v : x) v = float(int(g() % 2001) - 1000) / 1000.0f;
          // One router per rotation step: every token picks experts [j*k, j*k + k).
          const int64_t steps = E / s.k;
          std::vector<std::vector<float>> routers(size_t(steps), std::vector<float>(size_t(M * E), -4.0f));
          for (int64_t j = 0; j < steps; ++j)
            for (int64_t m = 0; m < M; ++m)
              for (int64_t e = 0; e < s.k; ++e) routers[size_t(j)][size_t(m * E + j * s.k + e)] = 1.0f + 0.1f * float(e);
          QMoETensors t;
          t.input = x.data();
          t.fc1_w = w1.data();
          t.fc1_s = s1.data();
          t.fc2_w = w2.data();
          t.fc2_s = s2.data();
          t.fc1_nb = nb1;
          t.fc2_nb = nb2;
          t.output = out.data();
          std::vector<double> ts;
          const double bw = read_bandwidth_gbs(size_t(256) << 20, threads, 1);
          for (int r = 0; r < reps + steps; ++r) {
            t.router = routers[size_t(r % steps)].data();
            const double t0 = now();
            err = qmoe_ffn(sh, at, t, *tier, par);
            const double dt = now() - t0;
            if (!err.empty()) { std::fprintf(stderr, "qmoe_ffn: %s\n", err.c_str()); return 1; }
            if (r >= steps) ts.push_back(dt);  // the first rotation warms up
          }
          std::sort(ts.begin(), ts.end());
          const double p50 = ts[ts.size() / 2], p10 = ts[ts.size() / 10], p90 = ts[ts.size() * 9 / 10];
          const double gbs = bytes / p50 / 1e9;
          std::printf("%-14s %4d %3d %3lld %9.3f %9.3f %9.3f %8.1f %5.0f%%\n", s.name, bits, al, (long long)M,
                      p50 * 1e3, p10 * 1e3, p90 * 1e3, gbs, bw > 0 ? 100.0 * gbs / bw : 0.0);
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
