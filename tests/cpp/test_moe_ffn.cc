// moe_ffn end to end, every tier x dtype x activation/layout x bias x
// threads, against the float64 reference in ref_moe.h.
#include <algorithm>
#include <memory>

#include "moe/moe_ffn.h"
#include "ref_moe.h"
#include "test_util.h"
#include "moe_test_helpers.h"
#include "thread_pool.h"

using namespace hinamoe;

namespace {

struct Shape {
  int64_t T, H, I, E, k;
};

struct Combo {
  int act, layout;
};

// Runs one configuration; returns false on failure (already reported).
bool run_case(const KernelTier& tier, const Parallel& par, int dtype, const Shape& sh, const Combo& c, bool bias,
              bool normalize, bool limit_after, double limit) {
  const bool gated = c.act == 4 || c.act == 5;
  const int64_t T = sh.T, H = sh.H, I = sh.I, E = sh.E, k = sh.k;
  const int64_t N1 = gated && c.layout != 0 ? 2 * I : I;
  const double ws = 0.125, bs = 0.25;  // powers of two keep values exact in every dtype
  ht::Buf x = ht::random_buf(dtype, size_t(T * H), 1.0);
  ht::Buf lg = ht::random_buf(dtype, size_t(T * E), 2.0);
  ht::Buf w1 = ht::random_buf(dtype, size_t(E * N1 * H), ws);
  ht::Buf w2 = ht::random_buf(dtype, size_t(E * H * I), ws);
  ht::Buf w3, b1, b2, b3;
  if (gated && c.layout == 0) w3 = ht::random_buf(dtype, size_t(E * I * H), ws);
  if (bias) {
    b1 = ht::random_buf(dtype, size_t(E * N1), bs);
    b2 = ht::random_buf(dtype, size_t(E * H), bs);
    if (gated && c.layout == 0) b3 = ht::random_buf(dtype, size_t(E * I), bs);
  }
  ref::Params P;
  P.act = c.act;
  P.layout = c.layout;
  P.normalize = normalize;
  P.limit_after = limit_after;
  P.alpha = double(1.702f);
  P.beta = 1.0;
  P.limit = double(float(limit));
  const std::vector<double> want =
      ref::moe(T, H, I, E, k, P, x.val, lg.val, w1.val, b1.val, w2.val, b2.val, w3.val, b3.val);

  MoEShape s{T, H, I, E};
  MoEAttrs a;
  a.k = k;
  a.activation = Activation(c.act);
  a.gate_layout = GateLayout(c.layout);
  a.normalize_routing_weights = normalize;
  a.alpha = 1.702f;
  a.beta = 1.0f;
  a.limit = float(limit);
  a.limit_after_activation = limit_after;
  MoETensors t;
  t.dtype = DType(dtype);
  t.input = x.data();
  t.router = lg.data();
  t.fc1_w = w1.data();
  t.fc1_b = b1.data();
  t.fc2_w = w2.data();
  t.fc2_b = b2.data();
  t.fc3_w = w3.data();
  t.fc3_b = b3.data();
  std::vector<uint8_t> out(size_t(T * H) * (dtype == 0 ? 4 : 2));
  ht::poison(out);
  t.output = out.data();
  const std::string err = moe_ffn(s, a, t, tier, par);
  const std::string what =
      ht::fmt("%s %s act=%d layout=%d T=%lld H=%lld I=%lld E=%lld k=%lld bias=%d norm=%d lim_after=%d limit=%g threads=%d",
              tier.name, ht::dtype_str(dtype), c.act, c.layout, (long long)T, (long long)H, (long long)I,
              (long long)E, (long long)k, int(bias), int(normalize), int(limit_after), limit, par.threads);
  if (!ht::check(err.empty(), what + ": error " + err)) return false;
  double scale = 1e-3;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  const double tol = (dtype == 0 ? 1e-4 : dtype == 1 ? 2e-3 : 1e-2) * scale;
  double worst = 0;
  int64_t worst_i = -1;
  for (int64_t i = 0; i < T * H; ++i) {
    const double g = ht::read_raw(out.data(), size_t(i), dtype);
    const double d = std::isnan(g) ? INFINITY : std::fabs(g - want[i]);
    if (d > worst) { worst = d; worst_i = i; }
  }
  return ht::check(worst <= tol, what + ht::fmt(": max error %.3g at %lld (got %.9g want %.9g), tolerance %.3g",
                                                  worst, (long long)worst_i,
                                                  ht::read_raw(out.data(), size_t(std::max<int64_t>(worst_i, 0)), dtype),
                                                  want[std::max<int64_t>(worst_i, 0)], tol));
}


}  // namespace

TEST(moe_ffn_matrix) {
  const std::vector<Shape> shapes = {
      {1, 100, 72, 8, 8},  {2, 100, 72, 4, 1},  {5, 100, 72, 64, 8}, {17, 37, 13, 8, 2},
      {70, 100, 72, 8, 8}, {70, 64, 72, 64, 4}, {3, 100, 8, 1, 1},   {33, 100, 72, 16, 3},
      {7, 2048, 24, 3, 2}};  // power-of-two H: padded scratch rows, K sliced in the AVX2 tier
  const std::vector<Combo> combos = {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {6, 0}, {4, 0},
                                     {4, 1}, {4, 2}, {5, 0}, {5, 1}, {5, 2}};
  ThreadPool pool3(3);
  size_t n = 0;
  for (const KernelTier* tier : tiers_here())
    for (int dtype = 0; dtype < 3; ++dtype)
      for (const Combo& c : combos)
        for (int bias = 0; bias < 2; ++bias)
          for (int threads : {1, 3}) {
            const Shape& sh = shapes[n % shapes.size()];
            const bool normalize = (n / 3) % 2, lim_after = (n / 5) % 2;
            const double limit = (n % 4 == 0) ? INFINITY : 7.0 * ((n % 3) + 1) / 8.0;
            ++n;
            run_case(*tier, threads == 1 ? serial() : pool3.parallel(), dtype, sh, c, bias, normalize, lim_after,
                     limit);
          }
}

TEST(moe_ffn_many_threads_fused_phases) {
  // Gate/up and down items share one pass over the pool: with more threads
  // than experts finish in order, one expert's down items run while other
  // experts' gate/up items still read their gathered inputs. Many experts,
  // one or two tokens each, H = 2048 (padded input rows, so a buffer shared
  // by inputs and outputs would overlap across experts), 8 threads on
  // however few cores, repeated: every run matches the float64 reference.
  ThreadPool pool8(8);
  const std::vector<Shape> shapes = {{3, 2048, 40, 16, 8}, {5, 2048, 24, 32, 6}, {2, 1000, 48, 8, 8}};
  int n = 0;
  for (const KernelTier* tier : tiers_here()) {
    if (std::string(tier->name) == "amx-emu") continue;  // slow; its block path has separate buffers
    for (int rep = 0; rep < 6; ++rep)
      for (const Shape& sh : shapes) {
        const int dtype = (n++) % 3;
        if (!run_case(*tier, pool8.parallel(), dtype, sh, Combo{4, 0}, rep % 2 == 1, false, false, INFINITY)) return;
      }
  }
}

TEST(moe_ffn_skipped_routes_write_zeros) {
  // Experts 0..2 get -inf logits for token 1, k=4 of E=4: three routes of token 1 are skipped;
  // token 2 has all-but-one -inf as well; every output element must still be written.
  for (const KernelTier* tier : tiers_here()) {
    for (int dtype = 0; dtype < 3; ++dtype) {
      const int64_t T = 3, H = 20, I = 9, E = 4, k = 4;
      ht::Buf x = ht::random_buf(dtype, size_t(T * H), 1.0);
      ht::Buf lg = ht::random_buf(dtype, size_t(T * E), 1.0);
      for (int j = 0; j < 3; ++j) lg.val[1 * E + j] = -INFINITY;
      for (int j = 1; j < 4; ++j) lg.val[2 * E + j] = -INFINITY;
      ht::encode(lg);
      ht::Buf w1 = ht::random_buf(dtype, size_t(E * I * H), 0.25), w2 = ht::random_buf(dtype, size_t(E * H * I), 0.25);
      ref::Params P;
      P.act = 2;
      const auto want = ref::moe(T, H, I, E, k, P, x.val, lg.val, w1.val, {}, w2.val, {}, {}, {});
      MoEShape s{T, H, I, E};
      MoEAttrs a;
      a.k = k;
      a.activation = Activation::Silu;
      MoETensors t;
      t.dtype = DType(dtype);
      t.input = x.data(); t.router = lg.data(); t.fc1_w = w1.data(); t.fc2_w = w2.data();
      std::vector<uint8_t> out(size_t(T * H) * (dtype == 0 ? 4 : 2));
      ht::poison(out);
      t.output = out.data();
      const std::string err = moe_ffn(s, a, t, *tier, serial());
      double worst = 0;
      for (int64_t i = 0; i < T * H; ++i) {
        const double g = ht::read_raw(out.data(), size_t(i), dtype);
        worst = std::max(worst, std::isnan(g) ? INFINITY : std::fabs(g - want[i]));
      }
      ht::check(err.empty() && worst <= 1e-2, ht::fmt("%s %s skipped routes: err='%s' max error %.3g", tier->name,
                                                      ht::dtype_str(dtype), err.c_str(), worst));
    }
  }
}

TEST(moe_ffn_nan_router_is_an_error) {
  SmallMoE c(4, 16, 8, 4);
  c.lg.val[2 * 4 + 1] = NAN;
  ht::encode(c.lg);
  c.t.router = c.lg.data();  // encode may have moved the bytes
  const std::string err = moe_ffn(c.s, c.a, c.t, ref_tier(), serial());
  ht::check(err.find("token 2") != std::string::npos, "NaN router logit -> error naming token 2: " + err);
}
