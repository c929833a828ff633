// GroupQueryAttention with a windowed KV cache (sliding_window_cache=1, see
// gqa.h) against a float64 reference that keeps every position: on every
// tier, serial and threaded, a batch-1 prompt then steps of 1 or several
// tokens on one buffer shared by past and present, with and without slack
// above the window, with attention_bias by absolute position and head_sink,
// until well past the first eviction. Run under ASan/UBSan too: the in-place
// compaction and the staged multi-token steps must stay inside the buffers.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gqa/gqa.h"
#include "test_util.h"
#include "thread_pool.h"
#include "tier.h"

using namespace hinamoe;

namespace {

int64_t resident(int64_t T, int64_t C, int64_t W) {
  if (T <= C) return T;
  const int64_t G = C - W + 1;
  return T - G * ((T - C + G - 1) / G);
}

struct WindowCase {
  int64_t N = 4, Nkv = 2, d = 64, W = 4, C = 4;
  bool bias = false, sink = false;
};

// One sequence of steps (their token counts), checked after each.
void run_case(const WindowCase& wc, const GqaTier& tier, const Parallel& par, const std::vector<int64_t>& steps,
              const std::string& what) {
  const int64_t N = wc.N, Nkv = wc.Nkv, d = wc.d, G = N / Nkv;
  std::vector<float> cache_k(size_t(Nkv * wc.C * d), NAN), cache_v(cache_k.size(), NAN);
  std::vector<std::vector<double>> all_k(Nkv), all_v(Nkv);  // reference: every position, [pos * d]
  std::vector<float> sink(static_cast<size_t>(N));
  for (float& x : sink) x = float(ht::uniform(-1, 1));
  GqaAttrs attrs;
  attrs.local_window_size = wc.W;
  attrs.sliding_window_cache = true;
  int64_t T = 0;
  for (size_t si = 0; si < steps.size(); ++si) {
    const int64_t S = steps[si], P = T;
    T += S;
    std::vector<float> q(size_t(S * N * d)), k(size_t(S * Nkv * d)), v(k.size());
    for (float& x : q) x = float(ht::uniform(-1, 1));
    for (float& x : k) x = float(ht::uniform(-1, 1));
    for (float& x : v) x = float(ht::uniform(-1, 1));
    std::vector<float> bias(wc.bias ? size_t(S * T) : 0);
    for (float& x : bias) x = float(ht::uniform(-2, 2));
    std::vector<float> out(size_t(S * N * d), NAN);
    const int32_t seqlens = int32_t(T - 1);

    GqaShape sh;
    sh.batch = 1;
    sh.seq = S;
    sh.num_heads = N;
    sh.kv_num_heads = Nkv;
    sh.head_dim = d;
    sh.past_capacity = sh.present_capacity = wc.C;
    sh.total_sequence_length = T;
    GqaTensors t;
    t.query = q.data();
    t.key = k.data();
    t.value = v.data();
    t.past_key = t.present_key = cache_k.data();
    t.past_value = t.present_value = cache_v.data();
    t.seqlens_k = &seqlens;
    if (wc.bias) {
      t.attention_bias = bias.data();
      t.bias_keys = T;
    }
    if (wc.sink) t.head_sink = sink.data();
    t.output = out.data();
    const std::string err = gqa(sh, attrs, t, tier, par);
    if (!ht::check(err.empty(), what + ": " + err)) return;

    for (int64_t h = 0; h < Nkv; ++h) {
      for (int64_t i = 0; i < S; ++i) {
        for (int64_t j = 0; j < d; ++j) {
          all_k[h].push_back(k[(i * Nkv + h) * d + j]);
          all_v[h].push_back(v[(i * Nkv + h) * d + j]);
        }
      }
    }
    const std::string at = what + ht::fmt(" step %zu (T=%lld)", si, (long long)T);
    double worst = 0;
    for (int64_t i = 0; i < S; ++i) {
      const int64_t pos = P + i, lo = std::max<int64_t>(0, pos - wc.W + 1);
      for (int64_t n = 0; n < N; ++n) {
        const int64_t h = n / G;
        std::vector<double> x;
        double m = wc.sink ? double(sink[n]) : -INFINITY;
        for (int64_t j = lo; j <= pos; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += double(q[(i * N + n) * d + e]) * all_k[h][j * d + e];
          dot /= std::sqrt(double(d));
          if (wc.bias) dot += bias[i * T + j];
          x.push_back(dot);
          m = std::max(m, dot);
        }
        double denom = wc.sink ? std::exp(double(sink[n]) - m) : 0.0;
        for (double s : x) denom += std::exp(s - m);
        for (int64_t e = 0; e < d; ++e) {
          double o = 0;
          for (int64_t j = lo; j <= pos; ++j) o += std::exp(x[j - lo] - m) / denom * all_v[h][j * d + e];
          worst = std::max(worst, std::fabs(o - double(out[(i * N + n) * d + e])));
        }
      }
    }
    ht::check(worst < 1e-4, at + ht::fmt(": output max error %.3g", worst));
    // Rows [0, L) hold positions T - L .. T - 1.
    const int64_t L = resident(T, wc.C, wc.W);
    double cache_err = 0;
    for (int64_t h = 0; h < Nkv; ++h) {
      for (int64_t r = 0; r < L; ++r) {
        for (int64_t e = 0; e < d; ++e) {
          const int64_t src = (T - L + r) * d + e, dst = (h * wc.C + r) * d + e;
          cache_err = std::max(cache_err, std::fabs(double(cache_k[dst]) - all_k[h][src]));
          cache_err = std::max(cache_err, std::fabs(double(cache_v[dst]) - all_v[h][src]));
        }
      }
    }
    ht::check(cache_err == 0, at + ht::fmt(": window rows differ from the newest positions by %.3g", cache_err));
  }
}

}  // namespace

TEST(gqa_window_cache_sequences) {
  std::vector<const GqaTier*> tiers = {&gqa_ref_tier()};
  if (tier_unavailable_reason("avx2").empty()) tiers.push_back(&gqa_avx2_tier());
  ThreadPool pool(3);
  for (const GqaTier* tier : tiers) {
    for (int threaded = 0; threaded < 2; ++threaded) {
      const Parallel par = threaded ? pool.parallel() : serial();
      for (int rep = 0; rep < 6; ++rep) {
        WindowCase wc;
        wc.Nkv = ht::randint(1, 2);
        wc.N = wc.Nkv * ht::randint(1, 4);
        wc.d = ht::randint(1, 2) * 64;
        wc.W = ht::randint(2, 7);
        wc.C = wc.W + (rep % 2 ? ht::randint(1, 4) : 0);
        wc.bias = rep % 3 == 1;
        wc.sink = rep % 3 != 0;
        // A prompt (sometimes longer than the buffer), decode steps, then
        // multi-token steps (some longer than the buffer) and decode again.
        std::vector<int64_t> steps = {ht::randint(1, wc.C + 4)};
        for (int i = 0; i < 2 * int(wc.C); ++i) steps.push_back(1);
        steps.push_back(ht::randint(2, wc.C + 3));
        steps.push_back(wc.C + 2);
        for (int i = 0; i < 3; ++i) steps.push_back(1);
        run_case(wc, *tier, par, steps,
                 ht::fmt("tier %s threads %d N=%lld Nkv=%lld d=%lld W=%lld C=%lld bias %d sink %d", tier->name,
                         threaded ? 3 : 1, (long long)wc.N, (long long)wc.Nkv, (long long)wc.d, (long long)wc.W,
                         (long long)wc.C, int(wc.bias), int(wc.sink)));
      }
    }
  }
}
