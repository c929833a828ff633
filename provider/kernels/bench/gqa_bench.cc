// Micro-benchmark of the GQA decode step (not run in CI; the user-facing
// benchmark is `hina-bench gqa`).
//
//   hinamoe_gqa_bench [--heads 32/4,32/8,64/8] [--d 128,128,64] [--ctx 512,2048,8192,32768]
//                     [--batch 1,4] [--threads 2] [--tier auto|ref|avx2|...] [--prefill]
//                     [--dtype f32,f16] [--variants lanes/pf,...] [--cache-mib 128]
//
// One decode step (S = 1) per call on a shared KV buffer of capacity ctx + 1,
// every row at context ctx, with K/V (and all other tensors) of each
// --dtype. Calls cycle over enough such buffers ("layers") to hold
// --cache-mib of K/V, so they stream from DRAM as in a multi-layer decode
// (--cache-mib 0: one buffer, which stays in cache when it fits). Reports the best and median time over repeated calls, the K+V
// bytes read per second (at the best time), and their share of the read
// bandwidth probed at the start.
// --variants (A/B runs of the AVX2 kernel's knobs: "lanes/prefetch keys",
// e.g. 0,1/16,1/0,1/32/l2 = row kernel, lanes kernel prefetching 16 keys
// ahead, lanes kernel without software prefetch, 32 keys ahead into L2;
// "/s": the first 32 keys' lines requested up front as well) alternates the variants call by
// call, so a busy machine slows them alike.
// --prefill times first prompts of ctx tokens instead (GB/s is then only
// the K+V bytes over the time, not a bandwidth figure).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bandwidth.h"
#include "bench/bench_util.h"
#include "dtype.h"
#include "gqa/gqa.h"
#include "thread_pool.h"

using namespace hinamoe;

namespace {

using bench::now;
using bench::split;

}  // namespace

int main(int argc, char** argv) {
  std::string heads = "32/4,32/8,64/8", dims = "128,128,64", ctxs = "512,2048,8192,32768", batches = "1,4";
  std::string tier_name = "auto";
  int threads = 2;
  std::string dtypes = "f32", variants;
  bool prefill = false;
  int64_t cache_mib = 128;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--heads") heads = next();
    else if (a == "--d") dims = next();
    else if (a == "--ctx") ctxs = next();
    else if (a == "--batch") batches = next();
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--tier") tier_name = next();
    else if (a == "--prefill") prefill = true;
    else if (a == "--dtype") dtypes = next();
    else if (a == "--variants") variants = next();
    else if (a == "--cache-mib") cache_mib = std::atoll(next().c_str());
    else {
      std::printf("usage: %s [--heads N/Nkv,...] [--d d,...] [--ctx T,...] [--batch B,...] [--threads n] [--tier name] [--prefill] [--dtype f32,f16] [--variants lanes/pf,...] [--cache-mib M]\n",
                  argv[0]);
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  std::string err;
  const GqaTier* tier = select_gqa_tier(tier_name, &err);
  if (!tier) {
    std::printf("%s\n", err.c_str());
    return 2;
  }
  ThreadPool pool(threads);
  const Parallel par = threads > 1 ? pool.parallel() : serial();
  double probe = 0;
  for (int i = 0; i < 3; ++i) probe = std::max(probe, read_bandwidth_gbs(size_t(1) << 30, threads, 5));
  std::printf("gqa tier %s, %d threads, read bandwidth probe %.1f GB/s\n", tier->name, threads, probe);
  std::vector<GqaAvx2Knobs> knobs;
  std::vector<std::string> knob_names;
  for (const std::string& v : split(variants)) {
    GqaAvx2Knobs k;
    k.lanes = std::atoi(v.c_str()) != 0;
    if (v.find('/') != std::string::npos) k.prefetch_keys = std::atoll(v.substr(v.find('/') + 1).c_str());
    k.prefetch_l2 = v.find("/l2") != std::string::npos;
    k.prefetch_start = v.find("/s") != std::string::npos;
    knobs.push_back(k);
    knob_names.push_back(v);
  }
  if (knobs.empty()) {
    knobs.push_back(gqa_avx2_knobs());
    knob_names.push_back("-");
  }
  std::printf("%-8s %4s %5s %6s %5s %8s %10s %10s %8s %6s\n", "heads", "d", "dtype", "ctx", "batch", "variant",
              "ms", "median ms", "GB/s", "%bw");

  const auto hs = split(heads), ds = split(dims);
  std::mt19937 g(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (size_t hi = 0; hi < hs.size(); ++hi) {
    const int64_t N = std::atoll(hs[hi].c_str()), Nkv = std::atoll(hs[hi].substr(hs[hi].find('/') + 1).c_str());
    const int64_t d = std::atoll(ds[std::min(hi, ds.size() - 1)].c_str());
    for (const std::string& dts : split(dtypes)) {
      const bool f16 = dts == "f16";
      if (!f16 && dts != "f32") {
        std::printf("unknown --dtype %s (f32 or f16)\n", dts.c_str());
        return 2;
      }
      for (const std::string& bs : split(batches)) {
        const int64_t B = std::atoll(bs.c_str());
        for (const std::string& cs : split(ctxs)) {
          const int64_t T = std::atoll(cs.c_str()), cap = T + 1, S = prefill ? T : 1;
          // Every tensor in the element type T: float, or f16 bits.
          auto random_tensor = [&](size_t n) {
            std::vector<uint8_t> buf(n * (f16 ? 2 : 4));
            for (size_t i = 0; i < n; ++i) {
              const float x = u(g);
              if (f16) reinterpret_cast<uint16_t*>(buf.data())[i] = f32_to_f16(x);
              else reinterpret_cast<float*>(buf.data())[i] = x;
            }
            return buf;
          };
          const size_t kv_n = size_t(B * Nkv * cap * d), q_n = size_t(B * S * N * d), k_n = size_t(B * S * Nkv * d);
          const size_t layer_bytes = 2 * kv_n * (f16 ? 2 : 4);
          const size_t layers = std::max<size_t>(1, (size_t(cache_mib) << 20) / layer_bytes + 1);
          std::vector<std::vector<uint8_t>> kv_k, kv_v;
          for (size_t l = 0; l < layers; ++l) {
            kv_k.push_back(random_tensor(kv_n));
            kv_v.push_back(random_tensor(kv_n));
          }
          std::vector<uint8_t> q = random_tensor(q_n), k = random_tensor(k_n), v = random_tensor(k_n),
                               out = random_tensor(q_n);
          std::vector<int32_t> seqlens(size_t(B), int32_t(T - 1));  // T tokens after this step
          GqaShape sh;
          sh.batch = B;
          sh.seq = S;
          sh.num_heads = N;
          sh.kv_num_heads = Nkv;
          sh.head_dim = d;
          sh.past_capacity = cap;
          sh.present_capacity = cap;
          sh.total_sequence_length = T;
          GqaTensors t;
          t.dtype = f16 ? GqaDType::F16 : GqaDType::F32;
          t.query = q.data();
          t.key = k.data();
          t.value = v.data();
          auto use_layer = [&](size_t l) {
            t.past_key = t.present_key = kv_k[l].data();
            t.past_value = t.present_value = kv_v[l].data();
          };
          use_layer(0);
          t.seqlens_k = seqlens.data();
          t.output = out.data();
          GqaAttrs attrs;
          std::string e = gqa(sh, attrs, t, *tier, par);
          if (!e.empty()) {
            std::printf("%s\n", e.c_str());
            return 1;
          }
          std::vector<std::vector<double>> times(knobs.size());
          const double start = now(), budget = 0.5 * double(knobs.size());
          size_t call = 0;
          while (times[0].size() < 5 || (now() - start < budget && times[0].size() < 5000)) {
            for (size_t vi = 0; vi < knobs.size(); ++vi) {
              use_layer(++call % layers);
              gqa_avx2_knobs() = knobs[vi];
              const double t0 = now();
              gqa(sh, attrs, t, *tier, par);
              times[vi].push_back(now() - t0);
            }
          }
          for (size_t vi = 0; vi < knobs.size(); ++vi) {
            std::vector<double>& ts = times[vi];
            std::sort(ts.begin(), ts.end());
            const double best = ts[0], median = ts[ts.size() / 2];
            const double bytes = 2.0 * B * Nkv * T * d * (f16 ? 2 : 4);
            std::printf("%-8s %4lld %5s %6lld %5lld %8s %10.4f %10.4f %8.1f %5.0f%%\n", hs[hi].c_str(), (long long)d,
                        dts.c_str(), (long long)T, (long long)B, knob_names[vi].c_str(), best * 1e3, median * 1e3,
                        bytes / best / 1e9, 100.0 * bytes / best / 1e9 / probe);
          }
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}
