// The AMX GQA chunk kernel for bf16 K/V (gqa/gqa_amx_impl.h) on its own:
// one GqaChunkFn call against a float64 reference of the chunk contract
// (gqa.h), on the emulator and, where the CPU has AMX, on real tiles.
// Random G in {1,2,4,8} x tokens (up to 64 query rows), d in {64, 80, 128}
// and odd sizes (40, 88: head-dim tails), key ranges of any start and length
// (partial 16-key tiles), in one call or in pieces that keep the query
// operands (same_q), a KV row stride wider than d, ragged per-row
// visible ranges, softcap, bias with -inf masks, and a running softmax state
// carried in (rescaling). Cache rows outside the chunk and the padding
// between rows hold NaN, the scratch is NaN-poisoned: reading any of them
// shows. The kernel splits Q and P into bf16 hi + lo parts, so it is held
// to float32-level errors, not bf16 ones.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gqa/gqa.h"
#include "gqa/gqa_amx.h"
#include "test_util.h"
#include "tier.h"

using namespace hinamoe;

namespace {

struct ChunkCase {
  int64_t rows = 1, d = 64, stride = 64, cap = 1, k0 = 0, k1 = 1;
  float softcap = 0.0f;
  bool bias = false, carry_state = false;
  std::vector<uint16_t> k, v;  // [cap][stride] bf16 bits
  std::vector<float> q;        // [rows][d]
  std::vector<int64_t> lo, hi;
  std::vector<std::vector<float>> bias_rows;  // [rows][cap]
  std::vector<float> m, l, acc;               // state in
};

uint16_t bf16_bits(double v) { return ht::bf16_exact(v); }
double bf16_val(uint16_t h) { return double(ht::bitsf(uint32_t(h) << 16)); }

// K and V rows [k0, k1): random values on the bf16 grid (K at scale 1, V at
// v_scale); every other cache row NaN, so a read outside the chunk shows.
void fill_kv(ChunkCase& c, double v_scale) {
  const uint16_t nan = 0x7fc0;
  c.k.assign(size_t(c.cap * c.stride), nan);
  c.v = c.k;
  for (int64_t j = c.k0; j < c.k1; ++j)
    for (int64_t e = 0; e < c.d; ++e) {
      c.k[size_t(j * c.stride + e)] = bf16_bits(ht::grid_value(2, 1));
      c.v[size_t(j * c.stride + e)] = bf16_bits(ht::grid_value(2, v_scale));
    }
}

ChunkCase random_case() {
  ChunkCase c;
  const int64_t Gs[] = {1, 2, 4, 8}, ds[] = {64, 80, 128, 40, 88};
  const int64_t G = Gs[ht::randint(0, 3)];
  const int64_t tokens = ht::randint(0, 2) == 0 ? ht::randint(2, 64 / G) : 1;
  c.rows = G * tokens;
  c.d = ds[ht::randint(0, 4)];
  c.stride = c.d + (ht::randint(0, 1) ? 0 : 8 * ht::randint(1, 4));
  c.cap = ht::randint(1, 400);
  c.k0 = ht::randint(0, c.cap - 1);
  c.k1 = std::min(c.cap, c.k0 + ht::randint(1, 128));
  if (ht::randint(0, 3) == 0) c.softcap = float(ht::uniform(0.5, 8));
  c.bias = ht::randint(0, 2) == 0;
  c.carry_state = ht::randint(0, 1) != 0;
  fill_kv(c, 2);
  // Q as the driver hands it: float, scaled (not on the bf16 grid).
  c.q.resize(size_t(c.rows * c.d));
  const double scale = ht::uniform(0.05, 0.5);
  for (auto& x : c.q) x = float(ht::uniform(-1, 1) * scale * 4);
  for (int64_t r = 0; r < c.rows; ++r) {
    // Ragged ranges around the chunk: some rows see all of it, some part, some none.
    const int64_t mode = ht::randint(0, 4);
    int64_t lo = 0, hi = c.cap;
    if (mode == 1) hi = ht::randint(c.k0, c.k1);
    if (mode == 2) lo = ht::randint(c.k0, c.k1);
    if (mode == 3) { lo = ht::randint(0, c.cap); hi = ht::randint(lo, c.cap); }
    c.lo.push_back(lo);
    c.hi.push_back(hi);
  }
  if (c.bias) {
    c.bias_rows.assign(size_t(c.rows), std::vector<float>(size_t(c.cap)));
    for (int64_t r = 0; r < c.rows; ++r)
      for (auto& x : c.bias_rows[size_t(r)]) x = ht::randint(0, 5) == 0 ? -INFINITY : float(ht::uniform(-2, 2));
    if (c.rows > 1) std::fill(c.bias_rows[1].begin(), c.bias_rows[1].end(), -INFINITY);  // fully masked row
  }
  c.m.assign(size_t(c.rows), -INFINITY);
  c.l.assign(size_t(c.rows), 0.0f);
  c.acc.assign(size_t(c.rows * c.d), 0.0f);
  if (c.carry_state) {
    for (int64_t r = 0; r < c.rows; ++r) {
      if (ht::randint(0, 3) == 0) continue;  // some rows still empty
      c.m[size_t(r)] = float(ht::uniform(-2, 3));
      c.l[size_t(r)] = float(ht::uniform(0.5, 20));
      for (int64_t e = 0; e < c.d; ++e) c.acc[size_t(r * c.d + e)] = float(ht::uniform(-10, 10));
    }
  }
  return c;
}

struct State {
  std::vector<double> m, l, acc;
  std::vector<double> acc_abs;  // acc with |V| and |acc in|: what acc's rounding scales with
  std::vector<double> score_err;  // per row: bound on a score's error, 2^-16 max_j sum |q_e k_je|
};

// The contract of GqaChunkFn in float64.
State reference(const ChunkCase& c) {
  State s{std::vector<double>(c.m.begin(), c.m.end()), std::vector<double>(c.l.begin(), c.l.end()),
          std::vector<double>(c.acc.begin(), c.acc.end()), {}, std::vector<double>(size_t(c.rows), 0.0)};
  for (auto x : c.acc) s.acc_abs.push_back(std::fabs(double(x)));
  for (int64_t r = 0; r < c.rows; ++r) {
    const int64_t j0 = std::max(c.k0, c.lo[size_t(r)]), j1 = std::min(c.k1, c.hi[size_t(r)]);
    if (j0 >= j1) continue;
    std::vector<double> x;
    double mx = s.m[size_t(r)];
    for (int64_t j = j0; j < j1; ++j) {
      double dot = 0, mag = 0;
      for (int64_t e = 0; e < c.d; ++e) {
        const double t = double(c.q[size_t(r * c.d + e)]) * bf16_val(c.k[size_t(j * c.stride + e)]);
        dot += t;
        mag += std::fabs(t);
      }
      s.score_err[size_t(r)] = std::max(s.score_err[size_t(r)], std::ldexp(mag, -16));
      if (c.softcap > 0) dot = c.softcap * std::tanh(dot / c.softcap);
      if (c.bias) dot += c.bias_rows[size_t(r)][size_t(j)];
      x.push_back(dot);
      mx = std::max(mx, dot);
    }
    if (mx == -INFINITY) continue;
    const double f = s.m[size_t(r)] == -INFINITY ? 0.0 : std::exp(s.m[size_t(r)] - mx);
    s.l[size_t(r)] *= f;
    for (int64_t e = 0; e < c.d; ++e) {
      s.acc[size_t(r * c.d + e)] *= f;
      s.acc_abs[size_t(r * c.d + e)] *= f;
    }
    for (int64_t j = j0; j < j1; ++j) {
      const double p = std::exp(x[size_t(j - j0)] - mx);
      s.l[size_t(r)] += p;
      for (int64_t e = 0; e < c.d; ++e) {
        const double pv = p * bf16_val(c.v[size_t(j * c.stride + e)]);
        s.acc[size_t(r * c.d + e)] += pv;
        s.acc_abs[size_t(r * c.d + e)] += std::fabs(pv);
      }
    }
    s.m[size_t(r)] = mx;
  }
  return s;
}

std::string describe(const ChunkCase& c) {
  return ht::fmt("rows=%lld d=%lld stride=%lld cap=%lld keys=[%lld,%lld) softcap=%g bias=%d carry=%d", (long long)c.rows,
                 (long long)c.d, (long long)c.stride, (long long)c.cap, (long long)c.k0, (long long)c.k1,
                 double(c.softcap), c.bias, c.carry_state);
}

// The chunk's keys in `pieces` calls (the later ones with same_q, as the
// driver makes them for one work item), checked against one reference.
void check_chunk(GqaChunkFn fn, const char* name, const ChunkCase& c, int pieces = 1) {
  std::vector<float> m = c.m, l = c.l, acc = c.acc;
  std::vector<float> scratch(size_t(gqa_chunk_scratch_floats(c.rows, c.k1 - c.k0)), NAN);
  std::vector<const float*> bias;
  for (const auto& b : c.bias_rows) bias.push_back(b.data());
  GqaChunkArgs a;
  a.q = c.q.data();
  a.rows = c.rows;
  a.d = c.d;
  a.k = c.k.data();
  a.v = c.v.data();
  a.kv_stride = c.stride;
  a.k0 = c.k0;
  a.k1 = c.k1;
  a.lo = c.lo.data();
  a.hi = c.hi.data();
  a.bias = c.bias ? bias.data() : nullptr;
  a.softcap = c.softcap;
  a.m = m.data();
  a.l = l.data();
  a.acc = acc.data();
  a.scratch = scratch.data();
  for (int p = 0; p < pieces; ++p) {
    a.k0 = c.k0 + (c.k1 - c.k0) * p / pieces;
    a.k1 = c.k0 + (c.k1 - c.k0) * (p + 1) / pieces;
    fn(a);  // an empty piece too: it must not break what the next one keeps
    a.same_q = true;
  }
  const State want = reference(c);
  size_t bad = 0;
  double worst = 0;
  auto cmp = [&](double got, double w, double tol) {
    if (std::isinf(w) && got == w) return;
    const double err = std::fabs(got - w);
    if (!(err <= tol)) ++bad;
    if (!(err <= worst)) worst = err;
  };
  // A score is off by at most ~2^-17 of sum |q_e k_e| (Q's hi + lo split;
  // float32 sums are far below): score_err is twice that. exp turns it into
  // a relative error of l and of each term of acc; P's split adds ~2^-17.
  for (int64_t r = 0; r < c.rows; ++r) {
    const double se = want.score_err[size_t(r)] + 1e-6, rel = 2 * se + 1e-5;
    cmp(m[size_t(r)], want.m[size_t(r)], se + 1e-6 * std::fabs(want.m[size_t(r)]));
    cmp(l[size_t(r)], want.l[size_t(r)], rel * want.l[size_t(r)] + 1e-6);
    for (int64_t e = 0; e < c.d; ++e) {
      const size_t i = size_t(r * c.d + e);
      cmp(acc[i], want.acc[i], rel * want.acc_abs[i] + 1e-6);
    }
  }
  CHECK_MSG(bad == 0, name << " " << describe(c) << " pieces=" << pieces << ": " << bad
                            << " state values off, worst error " << worst);
}

std::vector<std::pair<const char*, GqaChunkFn>> kernels_here() {
  std::vector<std::pair<const char*, GqaChunkFn>> v = {{"amx-emu", gqa_chunk_bf16_emu}};
  if (tier_unavailable_reason("amx").empty()) v.push_back({"amx", gqa_chunk_bf16_amx});
  return v;
}

}  // namespace

TEST(gqa_amx_chunk_random) {
  for (int iter = 0; iter < 60; ++iter) {
    const ChunkCase c = random_case();
    const int pieces = int(ht::randint(1, 3));
    for (const auto& k : kernels_here()) check_chunk(k.second, k.first, c, pieces);
  }
}

// Every row block / key tile edge: 1..64 rows x chunk lengths around 16 and 32.
TEST(gqa_amx_chunk_edges) {
  const int64_t lens[] = {1, 15, 16, 17, 31, 32, 33, 128};
  for (int64_t rows : {1, 8, 15, 16, 17, 64}) {
    for (int64_t len : lens) {
      ChunkCase c;
      c.rows = rows;
      c.d = 80;
      c.stride = 80;
      c.cap = len + 5;
      c.k0 = 3;
      c.k1 = 3 + len;
      fill_kv(c, 1);
      c.q.resize(size_t(rows * c.d));
      for (auto& x : c.q) x = float(ht::uniform(-0.5, 0.5));
      c.lo.assign(size_t(rows), 0);
      c.hi.assign(size_t(rows), c.cap);
      c.m.assign(size_t(rows), -INFINITY);
      c.l.assign(size_t(rows), 0.0f);
      c.acc.assign(size_t(rows * c.d), 0.0f);
      for (const auto& k : kernels_here()) check_chunk(k.second, k.first, c);
    }
  }
}

// The AMX tier names pick the tile kernel for bf16 and the row kernels for f32/f16.
TEST(gqa_amx_tier_selection) {
  std::string err;
  const GqaTier* emu = select_gqa_tier("amx-emu", &err);
  CHECK(emu == &gqa_amx_emu_tier());
  CHECK(emu->chunk_bf16 == gqa_chunk_bf16_emu);
  const GqaTier& rows = tier_unavailable_reason("avx2").empty() ? gqa_avx2_tier() : gqa_ref_tier();
  CHECK(emu->chunk == rows.chunk && emu->chunk_f16 == rows.chunk_f16);
  if (tier_unavailable_reason("amx").empty()) {
    const GqaTier* amx = select_gqa_tier("amx", &err);
    CHECK(amx == &gqa_amx_tier());
    CHECK(amx->chunk_bf16 == gqa_chunk_bf16_amx);
    // auto stays on the avx2 kernels until the tile kernel is measured faster.
    CHECK(select_gqa_tier("auto", &err) == &gqa_avx2_tier());
  } else {
    CHECK(select_gqa_tier("amx", &err) == nullptr);
  }
}
