// Routing: exact agreement with the reference (same experts, bit-equal
// weights), tie order, NaN / inf handling, skipped routes and grouping.
#include <algorithm>

#include "moe/moe_ffn.h"
#include "ref_moe.h"
#include "moe/routing.h"
#include "thread_pool.h"
#include "test_util.h"

using namespace hinamoe;

namespace {

// Routes of token t from Routes, in slot order.
std::vector<std::pair<int, float>> slots_of(const Routes& R, int64_t t, int64_t k, int64_t E) {
  std::vector<std::pair<int, float>> v;
  for (int64_t s = 0; s < k; ++s) {
    const int64_t p = R.slot_pos[t * k + s];
    if (p < 0) { v.push_back({-1, 0.0f}); continue; }
    int e = 0;
    while (!(R.expert_begin[e] <= p && p < R.expert_begin[e + 1])) ++e;
    if (e >= E) e = -2;
    v.push_back({e, R.weight[p]});
  }
  return v;
}

}  // namespace

TEST(routing_matches_reference) {
  ThreadPool pool(3);
  for (int dtype = 0; dtype < 3; ++dtype) {
    for (int64_t E : {1, 2, 7, 8, 64, 65}) {
      for (bool norm : {false, true}) {
        const int64_t T = ht::randint(1, 300);
        const int64_t k = ht::randint(1, std::min<int64_t>(E, 8));
        // Coarse grids give many exact logit ties; f32 gets some too.
        ht::Buf lg = ht::random_buf(dtype, size_t(T * E), 4.0);
        if (dtype == 0)
          for (auto& v : lg.val) if (ht::randint(0, 3) == 0) v = double(ht::randint(-3, 3));
        ht::encode(lg);
        Routes R;
        const Parallel par = E >= 64 ? pool.parallel() : serial();
        const std::string err = compute_routes(lg.data(), DType(dtype), T, E, k, norm, par, &R);
        if (!ht::check(err.empty(), "unexpected error: " + err)) continue;
        int bad = 0;
        for (int64_t t = 0; t < T; ++t) {
          std::vector<float> l(E);
          for (int64_t j = 0; j < E; ++j) l[j] = float(lg.val[t * E + j]);
          const auto want = ref::route(l, k, norm);
          const auto got = slots_of(R, t, k, E);
          for (int64_t s = 0; s < k; ++s) {
            const bool skip = !(want[s].weight > 0);
            const bool ok = skip ? got[s].first == -1
                                 : (got[s].first == want[s].expert && got[s].second == want[s].weight);
            if (!ok && bad++ < 3)
              ht::check(false, ht::fmt("%s E=%lld k=%lld t=%lld slot %lld: got (%d, %.9g) want (%d, %.9g)",
                                       ht::dtype_str(dtype), (long long)E, (long long)k, (long long)t,
                                       (long long)s, got[s].first, got[s].second, want[s].expert,
                                       want[s].weight));
          }
        }
        ht::check(bad == 0, ht::fmt("%s E=%lld k=%lld T=%lld norm=%d: %d slot mismatches", ht::dtype_str(dtype),
                                    (long long)E, (long long)k, (long long)T, int(norm), bad));
        // Grouping: per expert, tokens strictly increasing; counts add up.
        bool sorted = true;
        for (int64_t e = 0; e < E; ++e)
          for (int64_t p = R.expert_begin[e] + 1; p < R.expert_begin[e + 1]; ++p)
            sorted &= R.token[p - 1] < R.token[p];
        ht::check(sorted && R.expert_begin[E] == R.count(), "routes grouped per expert, sorted by token");
      }
    }
  }
}

TEST(routing_ties_prefer_higher_index) {
  std::vector<std::pair<float, int>> scratch;
  int32_t ids[8];
  float w[8];
  const float eq[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  ht::check(route_token(eq, 8, 3, false, ids, w, &scratch), "route_token ok");
  ht::check(ids[0] == 7 && ids[1] == 6 && ids[2] == 5, ht::fmt("equal logits pick 7,6,5 (got %d,%d,%d)", ids[0], ids[1], ids[2]));
  ht::check(w[0] == 0.125f && w[1] == 0.125f, "equal logits weight 1/8");
  const float some[5] = {1, 3, 3, 0, 3};
  route_token(some, 5, 2, true, ids, w, &scratch);
  ht::check(ids[0] == 4 && ids[1] == 2 && w[0] == 0.5f && w[1] == 0.5f,
            ht::fmt("ties among the max go to the higher index (got %d,%d)", ids[0], ids[1]));
  const float one[3] = {5, -1, 5};
  route_token(one, 3, 1, false, ids, w, &scratch);
  ht::check(ids[0] == 2, "k=1 tie -> higher index");
}

TEST(routing_nan_and_inf) {
  for (int dtype = 0; dtype < 3; ++dtype) {
    const int64_t T = 9, E = 6;
    ht::Buf lg = ht::random_buf(dtype, size_t(T * E), 1.0);
    lg.val[7 * E + 0] = NAN;
    lg.val[5 * E + 2] = NAN;
    ht::encode(lg);
    Routes R;
    std::string err = compute_routes(lg.data(), DType(dtype), T, E, 2, false, serial(), &R);
    ht::check(err.find("NaN") != std::string::npos && err.find("token 5") != std::string::npos,
              std::string(ht::dtype_str(dtype)) + " NaN logits -> error naming token 5, got: " + err);
    // +inf makes exp(inf - inf) = NaN: an error too, not a crash.
    lg.val[5 * E + 2] = 0;
    lg.val[7 * E + 0] = INFINITY;
    ht::encode(lg);
    err = compute_routes(lg.data(), DType(dtype), T, E, 2, false, serial(), &R);
    ht::check(err.find("token 7") != std::string::npos, "+inf logit -> error naming token 7, got: " + err);
    // -inf logits are fine: p = 0, and such routes are skipped.
    lg.val[7 * E + 0] = 0;
    for (int64_t j = 0; j < E - 2; ++j) lg.val[3 * E + j] = -INFINITY;
    ht::encode(lg);
    err = compute_routes(lg.data(), DType(dtype), T, E, 3, true, serial(), &R);
    ht::check(err.empty(), "-inf logits are valid: " + err);
    ht::check(R.slot_pos[3 * 3 + 2] == -1 && R.slot_pos[3 * 3 + 0] >= 0 && R.slot_pos[3 * 3 + 1] >= 0,
              "zero-probability route is skipped");
    ht::check(R.count() == T * 3 - 1, ht::fmt("route count %lld", (long long)R.count()));
  }
}

TEST(validate_messages) {
  MoEShape s;
  s.tokens = 4; s.hidden = 16; s.inter = 8; s.experts = 8;
  MoEAttrs a;
  MoETensors t;
  int dummy = 0;
  t.input = t.router = t.fc1_w = t.fc2_w = &dummy;
  t.output = &dummy;
  a.k = 9;
  ht::check(validate_moe(s, a, t) == "k=9 exceeds the number of experts (8)", "k>E: " + validate_moe(s, a, t));
  a.k = 0;
  ht::check(validate_moe(s, a, t).find("k=0") != std::string::npos, "k=0: " + validate_moe(s, a, t));
  a.k = 2;
  ht::check(validate_moe(s, a, t).empty(), "valid relu: " + validate_moe(s, a, t));
  a.activation = Activation::SwiGLU;
  a.gate_layout = GateLayout::Separate;
  ht::check(validate_moe(s, a, t).find("fc3") != std::string::npos, "separate swiglu without fc3: " + validate_moe(s, a, t));
  t.fc3_w = &dummy;
  ht::check(validate_moe(s, a, t).empty(), "separate swiglu with fc3: " + validate_moe(s, a, t));
  a.gate_layout = GateLayout::Interleaved;
  ht::check(validate_moe(s, a, t).find("fc3") != std::string::npos, "interleaved with fc3: " + validate_moe(s, a, t));
  a.activation = Activation::Gelu;
  a.gate_layout = GateLayout::Separate;
  ht::check(validate_moe(s, a, t).find("not gated") != std::string::npos, "fc3 with gelu: " + validate_moe(s, a, t));
  t.fc3_w = nullptr;
  s.hidden = 0;
  ht::check(validate_moe(s, a, t).find("hidden") != std::string::npos, "hidden=0: " + validate_moe(s, a, t));
  s.hidden = 16; s.experts = 0;
  ht::check(!validate_moe(s, a, t).empty(), "experts=0 is an error");
  s.experts = 8; s.inter = 0;
  ht::check(!validate_moe(s, a, t).empty(), "inter=0 is an error");
  s.inter = 8; s.tokens = 0;
  t.input = nullptr;
  ht::check(validate_moe(s, a, t).empty(), "tokens=0 is valid");
  ht::check(moe_ffn(s, a, t, ref_tier(), serial()).empty(), "tokens=0 runs and does nothing");
}
