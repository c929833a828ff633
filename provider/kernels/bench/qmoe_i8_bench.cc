// Micro-benchmark of the AMX-INT8 QMoE block kernel (amx/qmoe_i8.h); not run
// in CI. Speed is only meaningful on AMX silicon (--tier amx); --tier emu
// runs the same loop on the tile emulator as a smoke test (use --shape tiny).
//
//   hinamoe_qmoe_i8_bench [--tier amx|emu] [--shape qwen3|gptoss|both|tiny]
//                         [--bits 4,8] [--block 32] [--m 1,2,4,8,16] [--threads 2]
//
// Per point: E = 8 experts, each with M tokens; per expert the tokens are
// quantised into the VNNI layout, fc1 ([2I, H], gate and up) and fc2
// ([H, I]) run through the block kernel in items of 64 rows over the
// threads. Reports the best time over ~0.6 s and GB/s of packed codes plus
// float scales, and that as a share of the measured read bandwidth.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "amx/amx_detect.h"
#include "amx/qmoe_i8.h"
#include "bandwidth.h"
#include "bench/bench_util.h"
#include "thread_pool.h"

using namespace hinamoe;

namespace {

using bench::now;
using bench::split;

struct Shape {
  const char* name;
  int64_t H, I;
};

struct Mat {  // one expert weight [N, K]
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  AmxI8Weight view(int bits, int64_t N, int64_t K, int64_t block) const {
    AmxI8Weight w;
    w.codes = codes.data(); w.scales = scales.data(); w.bits = bits;
    w.N = N; w.K = K; w.block = block;
    return w;
  }
};

Mat make_mat(std::mt19937_64& g, int bits, int64_t N, int64_t K, int64_t block) {
  Mat m;
  m.codes.resize(size_t(N * K * bits / 8));
  for (auto& c : m.codes) c = uint8_t(g());
  m.scales.resize(size_t(N * (K / block)));
  for (auto& s : m.scales) s = float(1 + g() % 100) / 4096.0f;
  return m;
}

struct Tok {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sum;
  AmxI8Tokens view(int64_t M, int64_t K, int64_t block) const {
    AmxI8Tokens t;
    t.q = q.data(); t.scale = scale.data(); t.sum = sum.data();
    t.M = M; t.K = K; t.block = block;
    return t;
  }
};

void gather(Tok& t, const std::vector<float>& x, int64_t M, int64_t K, int64_t block) {
  t.q.resize(size_t(M * K));
  t.scale.resize(size_t(M * (K / block)));
  t.sum.resize(t.scale.size());
  amx_i8_gather_tokens(x.data(), DType::F32, K, nullptr, M, block, t.q.data(), t.scale.data(), t.sum.data());
}

}  // namespace

int main(int argc, char** argv) {
  std::string tier = "amx", shape = "both";
  std::vector<int> bitss = {4, 8};
  std::vector<int64_t> Ms = {1, 2, 4, 8, 16};
  int64_t block = 32;
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--tier") tier = v;
    else if (a == "--shape") shape = v;
    else if (a == "--block") block = std::atoll(v.c_str());
    else if (a == "--threads") threads = std::max(1, std::atoi(v.c_str()));
    else if (a == "--bits") { bitss.clear(); for (auto& s : split(v)) bitss.push_back(std::atoi(s.c_str())); }
    else if (a == "--m") { Ms.clear(); for (auto& s : split(v)) Ms.push_back(std::atoll(s.c_str())); }
    else { std::fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
  }
  auto fn = tier == "emu" ? amx_qmoe_i8_block_emu : amx_qmoe_i8_block_amx;
  if (tier == "amx" && !amx_int8_unavailable_reason().empty()) {
    std::fprintf(stderr, "tier amx unavailable: %s (--tier emu runs the emulator)\n",
                 amx_int8_unavailable_reason().c_str());
    return 2;
  }
  if (tier != "amx" && tier != "emu") { std::fprintf(stderr, "--tier amx|emu\n"); return 2; }
  std::vector<Shape> shapes;
  if (shape == "qwen3" || shape == "both") shapes.push_back({"qwen3-30b-a3b", 2048, 768});
  if (shape == "gptoss" || shape == "both") shapes.push_back({"gpt-oss-20b", 2880, 2880});
  if (shape == "tiny") shapes.push_back({"tiny", 256, 128});
  if (shapes.empty()) { std::fprintf(stderr, "--shape qwen3|gptoss|both|tiny\n"); return 2; }

  const int E = 8;
  ThreadPool pool(threads);
  const Parallel par = pool.parallel();
  const double bw = read_bandwidth_gbs(size_t(1) << 30, threads, 3);
  std::printf("tier %s, %d threads, block %lld, read bandwidth %.1f GB/s\n", tier.c_str(), threads,
              (long long)block, bw);
  std::printf("%-14s %4s %3s %9s %8s %6s\n", "shape", "bits", "M", "ms", "GB/s", "%BW");
  std::mt19937_64 g(42);
  for (const Shape& s : shapes) {
    for (int bits : bitss) {
      std::vector<Mat> w1, w2;
      for (int e = 0; e < E; ++e) {
        w1.push_back(make_mat(g, bits, 2 * s.I, s.H, block));
        w2.push_back(make_mat(g, bits, s.H, s.I, block));
      }
      const double bytes = double(E) * double(w1[0].codes.size() + w2[0].codes.size() +
                                              4 * (w1[0].scales.size() + w2[0].scales.size()));
      for (int64_t M : Ms) {
        std::vector<float> x(size_t(M * s.H)), a(size_t(M * s.I));
        for (auto& v : x) v = float(int(g() % 2001) - 1000) / 1000.0f;
        for (auto& v : a) v = float(int(g() % 2001) - 1000) / 1000.0f;
        std::vector<Tok> tx(E), ta(E);
        std::vector<std::vector<float>> y1(E, std::vector<float>(size_t(M * 2 * s.I))),
            y2(E, std::vector<float>(size_t(M * s.H)));
        const int64_t rows = 64, items1 = (2 * s.I + rows - 1) / rows, items2 = (s.H + rows - 1) / rows;
        auto run = [&] {
          par.for_each(size_t(E), [&](size_t e) { gather(tx[e], x, M, s.H, block); });
          par.for_each(size_t(E * items1), [&](size_t i) {
            const int64_t e = int64_t(i) / items1, n0 = int64_t(i) % items1 * rows;
            const int64_t n1 = std::min(2 * s.I, n0 + rows);
            fn(w1[size_t(e)].view(bits, 2 * s.I, s.H, block), tx[size_t(e)].view(M, s.H, block), n0, n1,
               y1[size_t(e)].data() + n0, 2 * s.I);
          });
          par.for_each(size_t(E), [&](size_t e) { gather(ta[e], a, M, s.I, block); });
          par.for_each(size_t(E * items2), [&](size_t i) {
            const int64_t e = int64_t(i) / items2, n0 = int64_t(i) % items2 * rows;
            const int64_t n1 = std::min(s.H, n0 + rows);
            fn(w2[size_t(e)].view(bits, s.H, s.I, block), ta[size_t(e)].view(M, s.I, block), n0, n1,
               y2[size_t(e)].data() + n0, s.H);
          });
        };
        run();  // warm-up
        double best = 1e30;
        const double start = now();
        int reps = 0;
        while (reps < 3 || (now() - start < 0.6 && reps < 2000)) {
          const double t0 = now();
          run();
          best = std::min(best, now() - t0);
          ++reps;
        }
        const double gbs = bytes / best / 1e9;
        std::printf("%-14s %4d %3lld %9.3f %8.1f %5.0f%%\n", s.name, bits, (long long)M, best * 1e3, gbs,
                    bw > 0 ? 100.0 * gbs / bw : 0.0);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
