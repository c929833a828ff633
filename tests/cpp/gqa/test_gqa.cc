// GroupQueryAttention (provider/kernels/gqa) against a float64 reference
// written here from the definition (gqa.h's comment, checked against ORT
// 1.32's CPU kernel): every tier, serial and threaded, random configs
// (G in {1,2,3,4,6,8,12,16}, d in {64,80,128}, contexts up to 3000 with odd lengths,
// rows of different lengths), first prompts, decode and continuation steps,
// shared and separate KV buffers, and every attribute; T = float32, float16
// and bfloat16 (tiers without a bf16 kernel run the reference loop). Outputs are poisoned
// with NaN before each call; present rows nobody should touch are checked.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gqa/gqa.h"
#include "test_util.h"
#include "thread_pool.h"
#include "tier.h"

using namespace hinamoe;

namespace {

// ---- one step's inputs ----
struct Config {
  int64_t B = 1, S = 1, N = 1, Nkv = 1, d = 64;
  int64_t total_seq = 1;   // total_sequence_length input
  int64_t past_cap = 0;    // 0: no past inputs
  bool shared = false;     // present_* == past_*
  bool packed = false;
  std::vector<int32_t> seqlens;  // [B]
  GqaAttrs attrs;
  int64_t rot_half = 0, rot_rows = 0;
  bool pos_ids = false;
  bool bias = false;
  int64_t bias_b = 1, bias_n = 1;
  bool sink = false;
  int dt = 0;  // T: 0 float32, 1 float16, 2 bfloat16 (data on values T holds exactly)
  int64_t present_cap() const { return std::max(total_seq, past_cap); }
};

struct Inputs {
  std::vector<float> query, key, value, cos, sin, bias, sink;
  std::vector<int64_t> pos;
};

// A random value in (-scale, scale) (scale a power of 2); for f16/bf16 on the
// i/1024 (i/128) * scale grid, which T holds exactly.
float random_value(int dt, double scale) {
  return dt != 0 ? float(ht::grid_value(dt, scale)) : float(ht::uniform(-scale, scale));
}

Inputs random_inputs(const Config& c) {
  Inputs in;
  auto fill = [&c](std::vector<float>& v, size_t n, double scale) {
    v.resize(n);
    for (auto& x : v) x = random_value(c.dt, scale);
  };
  const int64_t qw = c.packed ? (c.N + 2 * c.Nkv) * c.d : c.N * c.d;
  fill(in.query, size_t(c.B * c.S * qw), 1);
  if (!c.packed) {
    fill(in.key, size_t(c.B * c.S * c.Nkv * c.d), 1);
    fill(in.value, size_t(c.B * c.S * c.Nkv * c.d), 1);
  }
  if (c.attrs.do_rotary) {
    // Real cos/sin pairs of random angles (what models feed).
    in.cos.resize(size_t(c.rot_rows * c.rot_half));
    in.sin.resize(in.cos.size());
    for (size_t i = 0; i < in.cos.size(); ++i) {
      const double th = ht::uniform(-3.2, 3.2);
      in.cos[i] = float(std::cos(th));
      in.sin[i] = float(std::sin(th));
      if (c.dt != 0) {  // on T's grid (i/1024 or i/128)
        const double g = c.dt == 1 ? 1024 : 128;
        in.cos[i] = float(std::round(std::cos(th) * g) / g);
        in.sin[i] = float(std::round(std::sin(th) * g) / g);
      }
    }
    if (c.pos_ids) {
      in.pos.resize(size_t(c.B * c.S));
      for (auto& p : in.pos) p = ht::randint(0, c.rot_rows - 1);
      if (c.S == c.total_seq) in.pos[0] = ht::randint(0, c.rot_rows - c.S);  // the first prompt's base
    }
  }
  if (c.bias) fill(in.bias, size_t(c.bias_b * c.bias_n * c.S * c.total_seq), 2);
  if (c.sink) fill(in.sink, size_t(c.N), 4);
  return in;
}

// ---- float64 reference ----
// The KV cache of the reference: [B, Nkv, cap, d] doubles.
struct RefCache {
  std::vector<double> k, v;
};

void rope_ref(std::vector<double>& x, const Config& c, const Inputs& in, int64_t pos) {
  const int64_t h = c.rot_half;
  std::vector<double> y = x;
  for (int64_t i = 0; i < h; ++i) {
    const double co = in.cos[pos * h + i], si = in.sin[pos * h + i];
    const int64_t a = c.attrs.rotary_interleaved ? 2 * i : i;
    const int64_t b = c.attrs.rotary_interleaved ? 2 * i + 1 : i + h;
    y[a] = x[a] * co - x[b] * si;
    y[b] = x[b] * co + x[a] * si;
  }
  x = y;
}

// Runs one step on the reference cache (capacity cap); returns output [B, S, N*d].
std::vector<double> reference_step(const Config& c, const Inputs& in, RefCache& cache, int64_t cap) {
  const int64_t G = c.N / c.Nkv, d = c.d;
  const bool first = c.S == c.total_seq;
  const int64_t qw = c.packed ? (c.N + 2 * c.Nkv) * d : c.N * d;
  const int64_t kw = c.packed ? qw : c.Nkv * d;
  auto qsrc = [&](int64_t b, int64_t s, int64_t n) { return &in.query[size_t((b * c.S + s) * qw + n * d)]; };
  auto ksrc = [&](int64_t b, int64_t s, int64_t h) {
    return c.packed ? &in.query[size_t((b * c.S + s) * qw + (c.N + h) * d)] : &in.key[size_t((b * c.S + s) * kw + h * d)];
  };
  auto vsrc = [&](int64_t b, int64_t s, int64_t h) {
    return c.packed ? &in.query[size_t((b * c.S + s) * qw + (c.N + c.Nkv + h) * d)]
                    : &in.value[size_t((b * c.S + s) * kw + h * d)];
  };
  const double alpha = c.attrs.scale == 0.0f ? 1.0 / std::sqrt(double(d)) : double(c.attrs.scale);
  std::vector<double> out(size_t(c.B * c.S * c.N * d));
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t total = c.seqlens[b] + 1, past = first ? 0 : total - c.S;
    // ORT: the first prompt rotates every row from one base (position_ids[0]
    // or 0), later steps take a position per token.
    auto pos = [&](int64_t s) {
      if (first) return (c.pos_ids ? in.pos[0] : 0) + s;
      return c.pos_ids ? in.pos[size_t(b * c.S + s)] : past + s;
    };
    for (int64_t h = 0; h < c.Nkv; ++h)
      for (int64_t s = 0; s < c.S; ++s) {
        std::vector<double> kv(ksrc(b, s, h), ksrc(b, s, h) + d);
        if (c.attrs.do_rotary) rope_ref(kv, c, in, pos(s));
        for (int64_t j = 0; j < d; ++j) {
          cache.k[size_t(((b * c.Nkv + h) * cap + past + s) * d + j)] = kv[j];
          cache.v[size_t(((b * c.Nkv + h) * cap + past + s) * d + j)] = vsrc(b, s, h)[j];
        }
      }
    for (int64_t n = 0; n < c.N; ++n) {
      const int64_t h = n / G;
      for (int64_t s = 0; s < c.S; ++s) {
        std::vector<double> q(qsrc(b, s, n), qsrc(b, s, n) + d);
        if (c.attrs.do_rotary) rope_ref(q, c, in, pos(s));
        const int64_t L = std::min(past + s + 1, total);  // padded prompt tokens stop at the row's end
        const int64_t W = c.attrs.local_window_size;
        const int64_t lo = (W > 0 && L > W) ? L - W : 0;
        std::vector<double> x;
        for (int64_t j = lo; j < L; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < d; ++e) dot += q[e] * cache.k[size_t(((b * c.Nkv + h) * cap + j) * d + e)];
          double sc = alpha * dot;
          if (c.attrs.softcap > 0) sc = c.attrs.softcap * std::tanh(sc / c.attrs.softcap);
          if (c.bias) {
            const int64_t bb = c.bias_b > 1 ? b : 0, bn = c.bias_n > 1 ? n : 0;
            sc += in.bias[size_t(((bb * c.bias_n + bn) * c.S + s) * c.total_seq + j)];
          }
          x.push_back(sc);
        }
        double mx = *std::max_element(x.begin(), x.end());
        if (mx == -INFINITY) {
          // Every key masked by the bias: with a sink, or in float32, weights 0
          // (output 0); float16/bfloat16 without a sink: NaN (ORT's half kernel).
          if (!c.sink && !c.attrs.smooth_softmax && c.dt != 0)
            std::fill_n(&out[size_t(((b * c.S + s) * c.N + n) * d)], d, std::nan(""));
          continue;
        }
        double extra = 0;  // the sink's term in the denominator
        if (c.sink || c.attrs.smooth_softmax) {
          const double sk = c.sink ? in.sink[n] : 0.0;
          mx = std::max(mx, sk);
          extra = std::exp(sk - mx);
        }
        double den = extra;
        for (double& e : x) den += (e = std::exp(e - mx));
        double* o = &out[size_t(((b * c.S + s) * c.N + n) * d)];
        for (int64_t j = lo; j < L; ++j)
          for (int64_t e = 0; e < d; ++e)
            o[e] += x[size_t(j - lo)] / den * cache.v[size_t(((b * c.Nkv + h) * cap + j) * d + e)];
      }
    }
  }
  return out;
}

// ---- running the library ----
struct Buffers {
  std::vector<float> past_k, past_v, present_k, present_v, out;
};

// f16 (dt 1) or bf16 (dt 2) bits of values T holds exactly (the test data).
std::vector<uint16_t> to_half(const std::vector<float>& v, int dt) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = dt == 1 ? ht::half_exact(v[i]) : ht::bf16_exact(v[i]);
  return h;
}
std::vector<float> from_half(const std::vector<uint16_t>& h, int dt) {
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = float(ht::read_raw(h.data(), i, dt));
  return v;
}

// Runs the library on float test data; for f16/bf16 configs through 16-bit copies
// (outputs and present buffers are converted back, NaN poison included).
std::string run_lib(const Config& c, const Inputs& in, Buffers& buf, const GqaTier& tier, const Parallel& par) {
  GqaShape sh;
  sh.batch = c.B;
  sh.seq = c.S;
  sh.num_heads = c.N;
  sh.kv_num_heads = c.Nkv;
  sh.head_dim = c.d;
  sh.past_capacity = c.past_cap;
  sh.present_capacity = c.present_cap();
  sh.total_sequence_length = c.total_seq;
  buf.out.assign(size_t(c.B * c.S * c.N * c.d), NAN);
  // The tensors as the library sees them: the float vectors, or half copies.
  struct Half {
    std::vector<uint16_t> query, key, value, past_k, past_v, present_k, present_v, cos, sin, bias, sink, out;
  } h;
  auto pick = [&](const std::vector<float>& f, std::vector<uint16_t>& hv) -> void* {
    if (f.empty()) return nullptr;
    if (c.dt == 0) return const_cast<float*>(f.data());
    hv = to_half(f, c.dt);
    return hv.data();
  };
  GqaTensors t;
  t.dtype = c.dt == 1 ? GqaDType::F16 : c.dt == 2 ? GqaDType::BF16 : GqaDType::F32;
  t.query = pick(in.query, h.query);
  t.key = c.packed ? nullptr : pick(in.key, h.key);
  t.value = c.packed ? nullptr : pick(in.value, h.value);
  t.present_key = pick(buf.present_k, h.present_k);
  t.present_value = pick(buf.present_v, h.present_v);
  if (c.past_cap > 0) {
    t.past_key = c.shared ? t.present_key : pick(buf.past_k, h.past_k);
    t.past_value = c.shared ? t.present_value : pick(buf.past_v, h.past_v);
  }
  t.seqlens_k = c.seqlens.data();
  if (c.attrs.do_rotary) {
    t.cos_cache = pick(in.cos, h.cos);
    t.sin_cache = pick(in.sin, h.sin);
    t.rotary_rows = c.rot_rows;
    t.rotary_half = c.rot_half;
    if (c.pos_ids) t.position_ids = in.pos.data();
  }
  if (c.bias) {
    t.attention_bias = pick(in.bias, h.bias);
    t.bias_batch = c.bias_b;
    t.bias_heads = c.bias_n;
    t.bias_keys = c.total_seq;
  }
  if (c.sink) t.head_sink = pick(in.sink, h.sink);
  if (c.dt != 0) {
    h.out.assign(buf.out.size(), c.dt == 1 ? 0x7e00 : 0x7fc0);  // NaN
    t.output = h.out.data();
  } else {
    t.output = buf.out.data();
  }
  const std::string err = gqa(sh, c.attrs, t, tier, par);
  if (c.dt != 0) {
    buf.out = from_half(h.out, c.dt);
    buf.present_k = from_half(h.present_k, c.dt);
    buf.present_v = from_half(h.present_v, c.dt);
    if (!h.past_k.empty()) {
      buf.past_k = from_half(h.past_k, c.dt);
      buf.past_v = from_half(h.past_v, c.dt);
    }
  }
  return err;
}

std::vector<const GqaTier*> gqa_tiers_here() {
  std::vector<const GqaTier*> v;
  for (const std::string& n : supported_tiers()) {
    std::string err;
    const GqaTier* t = select_gqa_tier(n, &err);
    if (t && std::find(v.begin(), v.end(), t) == v.end()) v.push_back(t);
  }
  return v;
}

std::string describe(const Config& c) {
  std::string s = std::string(ht::dtype_str(c.dt)) + " "  + ht::fmt("B=%lld S=%lld N=%lld Nkv=%lld d=%lld total=%lld past_cap=%lld", (long long)c.B,
                          (long long)c.S, (long long)c.N, (long long)c.Nkv, (long long)c.d,
                          (long long)c.total_seq, (long long)c.past_cap);
  s += " seqlens=";
  for (int32_t x : c.seqlens) s += std::to_string(x) + ",";
  s += ht::fmt(" shared=%d packed=%d rot=%d/%d half=%lld pos=%d bias=%d(%lld,%lld) sink=%d smooth=%d softcap=%g "
               "window=%lld scale=%g",
               c.shared, c.packed, c.attrs.do_rotary, c.attrs.rotary_interleaved, (long long)c.rot_half, c.pos_ids,
               c.bias, (long long)c.bias_b, (long long)c.bias_n, c.sink, c.attrs.smooth_softmax,
               double(c.attrs.softcap), (long long)c.attrs.local_window_size, double(c.attrs.scale));
  return s;
}

// Output and the present rows against the reference. `before` is the
// present buffer before the call (shared: rows not written must keep it).
void compare(const Config& c, const std::vector<double>& want, const RefCache& rc, const Buffers& buf,
             const std::vector<float>& before_k, const std::string& what) {
  const int64_t cap = c.present_cap(), d = c.d;
  double worst = 0;
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(double(buf.out[i]) - want[i]);
    // f16: Q/K rounded to half after rotary, output rounded (eps 2^-11);
    // bf16 the same with eps 2^-8 (output rounding alone reaches ~2e-3).
    const double rel = c.dt == 1 ? 3e-3 : c.dt == 2 ? 8e-3 : 2e-5;
    const double tol = rel + rel * std::fabs(want[i]);
    if (std::isnan(want[i])) {  // a NaN the op defines (fully masked half rows)
      if (!std::isnan(buf.out[i])) ++bad;
      continue;
    }
    if (!(err <= tol)) ++bad;  // NaN counts as bad
    if (!(err <= worst)) worst = err;
  }
  CHECK_MSG(bad == 0, what << ": " << bad << " outputs off, worst error " << worst);
  const bool first = c.S == c.total_seq;
  size_t bad_rows = 0, touched = 0;
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t total = c.seqlens[b] + 1, past = first ? 0 : total - c.S, end = past + c.S;
    for (int64_t h = 0; h < c.Nkv; ++h)
      for (int64_t j = 0; j < cap; ++j)
        for (int64_t e = 0; e < d; ++e) {
          const size_t i = size_t(((b * c.Nkv + h) * cap + j) * d + e);
          const double gk = buf.present_k[i], gv = buf.present_v[i];
          if (j < end && (c.shared ? j >= past : true)) {
            // Written by this step or copied from past: equals the reference cache.
            // Rotated K carries rounding (to T); V and unrotated K are copies.
            const double ktol = c.dt == 1 ? 2e-3 : c.dt == 2 ? 8e-3 : 1e-5;
            if (!(std::fabs(gk - rc.k[i]) <= ktol && std::fabs(gv - rc.v[i]) == 0.0)) ++bad_rows;
          } else if (c.shared) {
            if (ht::fbits(buf.present_k[i]) != ht::fbits(before_k[i])) ++touched;
          } else if (gk != 0.0 || gv != 0.0) {
            ++touched;  // separate buffers: everything else is zero
          }
        }
  }
  CHECK_MSG(bad_rows == 0, what << ": " << bad_rows << " present K/V values differ from the reference cache");
  CHECK_MSG(touched == 0, what << ": " << touched << " present values outside the written rows changed");
}

// A random attribute set (rotary needs d % 16 == 0: true for 64, 80, 128).
void random_attrs(Config& c, int64_t max_pos) {
  c.attrs = GqaAttrs{};
  const int pick = int(ht::randint(0, 2));
  c.attrs.scale = pick == 0 ? 0.0f : float(ht::uniform(0.02, 0.3));
  if (ht::randint(0, 3) == 0) c.attrs.softcap = float(ht::uniform(0.5, 8));
  if (ht::randint(0, 3) == 0) c.attrs.local_window_size = ht::randint(1, std::max<int64_t>(1, max_pos));
  if (ht::randint(0, 1)) {
    c.attrs.do_rotary = true;
    c.attrs.rotary_interleaved = ht::randint(0, 1) != 0;
    c.rot_half = 8 * ht::randint(1, c.d / 16);
    c.rot_rows = max_pos + ht::randint(0, 9);
    c.pos_ids = ht::randint(0, 2) == 0;
  }
  if (ht::randint(0, 2) == 0) {
    c.bias = true;
    c.bias_b = ht::randint(0, 1) ? c.B : 1;
    c.bias_n = ht::randint(0, 1) ? c.N : 1;
  }
  const int s = int(ht::randint(0, 3));
  c.sink = s == 0;
  c.attrs.smooth_softmax = s == 1;
}

// Runs `c` from the given cache contents on the reference and on every
// tier (serial and 3 threads), comparing each.
void check_step(const Config& c, const Inputs& in, const std::vector<float>& past_k, const std::vector<float>& past_v,
                const std::string& label) {
  const int64_t cap = c.present_cap();
  // Reference cache starts as the past rows the step may read.
  RefCache rc;
  rc.k.assign(size_t(c.B * c.Nkv * cap * c.d), 0.0);
  rc.v = rc.k;
  const bool first = c.S == c.total_seq;
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t past = first ? 0 : c.seqlens[b] + 1 - c.S;
    for (int64_t h = 0; h < c.Nkv; ++h)
      for (int64_t j = 0; j < past; ++j)
        for (int64_t e = 0; e < c.d; ++e) {
          const size_t src = size_t(((b * c.Nkv + h) * c.past_cap + j) * c.d + e);
          const size_t dst = size_t(((b * c.Nkv + h) * cap + j) * c.d + e);
          rc.k[dst] = past_k[src];
          rc.v[dst] = past_v[src];
        }
  }
  const std::vector<double> want = reference_step(c, in, rc, cap);
  static ThreadPool pool3(3);
  for (const GqaTier* tier : gqa_tiers_here()) {
    for (int threads : {1, 3}) {
      Buffers buf;
      if (c.shared) {
        buf.present_k = past_k;
        buf.present_v = past_v;
      } else {
        buf.past_k = past_k;
        buf.past_v = past_v;
        buf.present_k.assign(size_t(c.B * c.Nkv * cap * c.d), NAN);
        buf.present_v = buf.present_k;
      }
      const std::vector<float> before_k = buf.present_k;
      const std::string err = run_lib(c, in, buf, *tier, threads == 1 ? serial() : pool3.parallel());
      const std::string what = label + " tier=" + tier->name + " threads=" + std::to_string(threads) + " " + describe(c);
      CHECK_MSG(err.empty(), what << ": error " << err);
      if (!err.empty()) continue;
      compare(c, want, rc, buf, before_k, what);
      if (!c.shared) CHECK_MSG(buf.past_k == past_k, what << ": past_key was modified");
    }
  }
}

std::vector<float> random_cache(int64_t n, int dt) {
  std::vector<float> cache(static_cast<size_t>(n));
  for (auto& x : cache) x = random_value(dt, 1.0);
  return cache;
}

Config random_heads() {
  Config c;
  // G picks the AVX2 block shapes: lane groups of 8 rows (8, 16), one of 4
  // (4, 12 = 8 + 4), 4 + a 2-row tail (6), the row kernel alone (1, 2, 3).
  const int64_t Gs[] = {1, 2, 3, 4, 6, 8, 12, 16}, ds[] = {64, 80, 128};
  const int64_t G = Gs[ht::randint(0, 7)];
  c.Nkv = ht::randint(1, 3);
  c.N = G * c.Nkv;
  c.d = ds[ht::randint(0, 2)];
  c.packed = ht::randint(0, 3) == 0;
  c.dt = int(std::max<int64_t>(0, ht::randint(-2, 2)));  // f32 3 in 5, f16 and bf16 1 in 5 each
  return c;
}

}  // namespace

// First prompts: rows right-padded to S (seqlens < S - 1 for short rows).
TEST(gqa_first_prompt_random) {
  for (int iter = 0; iter < 12; ++iter) {
    Config c = random_heads();
    c.B = ht::randint(1, 3);
    c.S = ht::randint(1, 45);
    c.total_seq = c.S;
    c.seqlens.resize(size_t(c.B));
    for (auto& s : c.seqlens) s = int32_t(ht::randint(0, c.S - 1));
    c.seqlens[0] = int32_t(c.S - 1);
    const int mode = int(ht::randint(0, 2));  // no past, shared buffer, separate past
    c.past_cap = mode == 0 ? 0 : c.S + ht::randint(0, 20);
    c.shared = mode == 1;
    random_attrs(c, c.S);
    if (c.attrs.do_rotary) c.rot_rows = std::max(c.rot_rows, c.present_cap());
    const Inputs in = random_inputs(c);
    const int64_t pn = c.B * c.Nkv * c.past_cap * c.d;
    check_step(c, in, random_cache(pn, c.dt), random_cache(pn, c.dt), "first_prompt");
  }
}

// Decode (S = 1) at long contexts with odd lengths, past read from the buffer.
TEST(gqa_decode_random) {
  for (int iter = 0; iter < 14; ++iter) {
    Config c = random_heads();
    c.B = ht::randint(1, 4);
    c.S = 1;
    const int64_t maxlen = iter < 4 ? 3000 : ht::randint(2, 1200);
    c.seqlens.resize(size_t(c.B));
    for (auto& s : c.seqlens) s = int32_t(ht::randint(1, maxlen - 1));
    c.seqlens[0] = int32_t(maxlen - 1);
    if (c.B > 1) c.seqlens[1] = int32_t(ht::randint(1, 7));
    c.total_seq = *std::max_element(c.seqlens.begin(), c.seqlens.end()) + 1;
    c.shared = ht::randint(0, 1) != 0;
    c.past_cap = c.shared ? c.total_seq + ht::randint(0, 50) : c.total_seq - 1 + ht::randint(0, 3);
    random_attrs(c, c.total_seq);
    if (c.attrs.do_rotary) c.rot_rows = std::max(c.rot_rows, c.present_cap());
    const Inputs in = random_inputs(c);
    const int64_t pn = c.B * c.Nkv * c.past_cap * c.d;
    check_step(c, in, random_cache(pn, c.dt), random_cache(pn, c.dt), "decode");
  }
}

// Head sizes that leave 8-column and odd 24-column tails in the AVX2 P*V
// strips (d = 40, 56, 72, 88), with 4, 8, 12 and 16 heads per KV head (the
// lane-group shapes), decode at a few hundred keys and short prompts. No
// rotary: it needs d % 16 == 0.
TEST(gqa_odd_head_sizes) {
  const int64_t ds[] = {40, 56, 72, 88}, Gs[] = {4, 8, 12, 16};
  for (int iter = 0; iter < 32; ++iter) {
    Config c;
    c.d = ds[iter % 4];
    c.Nkv = ht::randint(1, 2);
    c.N = Gs[iter / 4 % 4] * c.Nkv;
    c.dt = iter % 3;  // f32, f16, bf16
    c.B = ht::randint(1, 2);
    const bool prompt = iter % 3 == 0;
    c.S = prompt ? ht::randint(2, 20) : 1;
    const int64_t total = prompt ? c.S : ht::randint(130, 700);
    c.seqlens.assign(size_t(c.B), int32_t(total - 1));
    c.total_seq = total;
    c.shared = true;
    c.past_cap = total + ht::randint(0, 5);
    random_attrs(c, total);
    c.attrs.do_rotary = false;
    const Inputs in = random_inputs(c);
    const int64_t pn = c.B * c.Nkv * c.past_cap * c.d;
    check_step(c, in, random_cache(pn, c.dt), random_cache(pn, c.dt), "odd_head_size");
  }
}

// ORT's "interactive" continuation: B = 1, S > 1 new tokens after a past.
TEST(gqa_continuation_random) {
  for (int iter = 0; iter < 6; ++iter) {
    Config c = random_heads();
    c.B = 1;
    c.S = ht::randint(2, 24);
    const int64_t total = c.S + ht::randint(1, 700);
    c.seqlens = {int32_t(total - 1)};
    c.total_seq = total;
    c.shared = ht::randint(0, 1) != 0;
    // Separate past: ORT wants past_key dim 2 + S == total (a growing cache)
    // or dim 2 >= total (a preallocated one).
    c.past_cap = c.shared || ht::randint(0, 1) ? total + ht::randint(0, 9) : total - c.S;
    random_attrs(c, total);
    if (c.attrs.do_rotary) c.rot_rows = std::max(c.rot_rows, c.present_cap());
    const Inputs in = random_inputs(c);
    const int64_t pn = c.B * c.Nkv * c.past_cap * c.d;
    check_step(c, in, random_cache(pn, c.dt), random_cache(pn, c.dt), "continuation");
  }
}

// A prompt then decode steps through one shared buffer, rows of different
// lengths, as onnxruntime-genai runs it; the reference keeps its own cache.
TEST(gqa_prefill_then_decode_shared) {
  for (int iter = 0; iter < 4; ++iter) {
    Config base = random_heads();
    base.B = ht::randint(1, 3);
    const int64_t S0 = ht::randint(3, 40), steps = 5, cap = S0 + steps + ht::randint(0, 7);
    std::vector<int64_t> len(size_t(base.B));
    for (auto& l : len) l = ht::randint(1, S0);
    len[0] = S0;
    random_attrs(base, cap);
    base.pos_ids = false;  // positions derived from seqlens_k in this flow
    if (base.attrs.do_rotary) base.rot_rows = cap + 3;
    base.shared = true;
    base.past_cap = cap;
    for (const GqaTier* tier : gqa_tiers_here()) {
      static ThreadPool pool2(2);
      std::vector<float> kc = random_cache(base.B * base.Nkv * cap * base.d, base.dt),
                         vc = random_cache(int64_t(kc.size()), base.dt);
      RefCache rc;
      rc.k.assign(kc.size(), 0.0);
      rc.v = rc.k;
      std::vector<int64_t> cur = len;
      // Identical random inputs per tier: reseed from the iteration.
      std::mt19937_64 saved = ht::rng();
      for (int64_t step = 0; step <= steps; ++step) {
        Config c = base;
        if (step == 0) {
          c.S = S0;
          c.total_seq = S0;
          for (int64_t b = 0; b < c.B; ++b) c.seqlens.push_back(int32_t(cur[b] - 1));
        } else {
          c.S = 1;
          for (auto& l : cur) ++l;
          for (int64_t b = 0; b < c.B; ++b) c.seqlens.push_back(int32_t(cur[b] - 1));
          c.total_seq = *std::max_element(cur.begin(), cur.end());
        }
        const Inputs in = random_inputs(c);
        const std::vector<double> want = reference_step(c, in, rc, cap);
        Buffers buf;
        buf.present_k.swap(kc);
        buf.present_v.swap(vc);
        const std::vector<float> before = buf.present_k;
        const std::string err = run_lib(c, in, buf, *tier, step % 2 ? pool2.parallel() : serial());
        const std::string what = "prefill+decode step " + std::to_string(step) + " tier=" + tier->name + " " + describe(c);
        CHECK_MSG(err.empty(), what << ": error " << err);
        if (!err.empty()) break;
        compare(c, want, rc, buf, before, what);
        kc.swap(buf.present_k);
        vc.swap(buf.present_v);
      }
      ht::rng() = saved;
    }
  }
}

// Every attribute alone, one decode and one prompt each, so a failure names it.
TEST(gqa_each_attribute) {
  for (int which = 0; which < 10; ++which) {
    for (int phase = 0; phase < 6; ++phase) {
      Config c;
      c.dt = phase / 2;
      c.N = 8;
      c.Nkv = 2;
      c.d = 80;
      c.B = 2;
      if (phase % 2 == 0) {
        c.S = 9;
        c.total_seq = 9;
        c.seqlens = {8, 4};
        c.past_cap = 0;
      } else {
        c.S = 1;
        c.seqlens = {300, 41};
        c.total_seq = 301;
        c.past_cap = 320;
        c.shared = true;
      }
      c.rot_rows = std::max<int64_t>(c.present_cap(), 9) + 1;
      c.rot_half = 16;
      switch (which) {
        case 0: c.attrs.do_rotary = true; break;
        case 1: c.attrs.do_rotary = true; c.attrs.rotary_interleaved = true; break;
        case 2: c.attrs.do_rotary = true; c.pos_ids = true; break;
        case 3: c.bias = true; c.bias_b = 2; c.bias_n = 8; break;
        case 4: c.attrs.local_window_size = 5; break;
        case 5: c.attrs.softcap = 1.5f; c.attrs.scale = 0.9f; break;  // big scores: the cap matters
        case 6: c.sink = true; break;
        case 7: c.attrs.smooth_softmax = true; break;
        case 8: c.packed = true; c.bias = true; break;
        case 9: c.bias = true; c.bias_n = 8; c.sink = phase == 1; break;  // -inf masks, below
      }
      Inputs in = random_inputs(c);
      if (which == 9) {
        // Head 0 of every row fully masked, a third of the other entries masked.
        for (size_t i = 0; i < in.bias.size(); ++i) {
          const int64_t head = int64_t(i / size_t(c.S * c.total_seq)) % c.bias_n;
          if (head == 0 || ht::randint(0, 2) == 0) in.bias[i] = -INFINITY;
        }
      }
      const int64_t pn = c.B * c.Nkv * c.past_cap * c.d;
      check_step(c, in, random_cache(pn, c.dt), random_cache(pn, c.dt), "attribute " + std::to_string(which));
    }
  }
}

// Bad input gets a message naming the problem, and nothing is written.
TEST(gqa_errors) {
  Config ok;
  ok.N = 4;
  ok.Nkv = 2;
  ok.d = 64;
  ok.B = 2;
  ok.S = 1;
  ok.seqlens = {10, 3};
  ok.total_seq = 11;
  ok.past_cap = 16;
  ok.shared = true;
  struct Bad {
    const char* expect;
    std::function<void(Config&)> mutate;
  };
  const std::vector<Bad> bad = {
      {"multiple of kv_num_heads", [](Config& c) { c.Nkv = 3; c.N = 4; }},
      {"head_size", [](Config& c) { c.d = 60; }},
      {"seqlens_k[1]", [](Config& c) { c.seqlens[1] = 11; }},
      {"seqlens_k[0]", [](Config& c) { c.seqlens[0] = -1; }},
      {"past_key holds", [](Config& c) { c.shared = false; c.past_cap = 6; }},
      {"past_key is absent", [](Config& c) { c.shared = false; c.past_cap = 0; }},
      {"sequence_length > 1", [](Config& c) { c.S = 2; }},
      {"cos_cache", [](Config& c) { c.attrs.do_rotary = true; c.rot_half = 16; c.rot_rows = 5; }},
      {"dim 1", [](Config& c) { c.attrs.do_rotary = true; c.rot_half = 12; c.rot_rows = 20; }},
      {"outside cos_cache", [](Config& c) { c.attrs.do_rotary = true; c.rot_half = 16; c.rot_rows = 16; c.pos_ids = true; }},
      {"attention_bias dim 1", [](Config& c) { c.bias = true; c.bias_n = 3; }},
      {"smooth_softmax", [](Config& c) { c.sink = true; c.attrs.smooth_softmax = true; }},
      {"local_window_size", [](Config& c) { c.attrs.local_window_size = 0; }},
  };
  for (const Bad& b : bad) {
    Config c = ok;
    b.mutate(c);
    Inputs in = random_inputs(c);
    if (c.pos_ids) in.pos[0] = 16;  // one past the cache
    Buffers buf;
    buf.present_k = random_cache(c.B * c.Nkv * c.present_cap() * c.d, 0);
    buf.present_v = buf.present_k;
    if (!c.shared) {
      buf.past_k = random_cache(c.B * c.Nkv * c.past_cap * c.d, 0);
      buf.past_v = buf.past_k;
    }
    const std::vector<float> before = buf.present_k;
    const std::string err = run_lib(c, in, buf, gqa_ref_tier(), serial());
    CHECK_MSG(err.find(b.expect) != std::string::npos, "expected an error mentioning '" << b.expect << "', got '" << err << "'");
    CHECK_MSG(err.rfind("GroupQueryAttention", 0) == 0, "error does not name the op: " << err);
    CHECK_MSG(buf.present_k == before, b.expect << ": present written despite the error");
    CHECK_MSG(std::all_of(buf.out.begin(), buf.out.end(), [](float x) { return std::isnan(x); }),
              b.expect << ": output written despite the error");
  }
}

// The chunk kernels' contract for non-finite scores (gqa.h): a row that sees
// a NaN or +inf score ends with m = NaN (the driver recomputes it exactly),
// a row flagged by an earlier call stays NaN, and a row that does not see
// the bad key keeps a finite state. Every tier, f32/f16/bf16 K/V (bf16: the
// AMX kernel on amx-emu), 1..20 rows (lane groups and the row tail).
TEST(gqa_chunk_kernels_flag_nonfinite) {
  const int64_t ds[] = {16, 64, 128};
  for (const GqaTier* tier : gqa_tiers_here()) {
    for (int iter = 0; iter < 36; ++iter) {
      const int dt = iter % 3;
      const int kind = iter / 3 % 3;  // 0: NaN in K, 1: +inf bias, 2: NaN in q of one row
      const int64_t rows = ht::randint(1, 20), d = ds[ht::randint(0, 2)], keys = ht::randint(20, 200);
      const int64_t bad_key = ht::randint(0, keys - 1), bad_row = ht::randint(0, rows - 1);
      const size_t nr = static_cast<size_t>(rows), nk = static_cast<size_t>(keys);
      std::vector<float> q(nr * static_cast<size_t>(d));
      for (auto& x : q) x = float(ht::uniform(-0.5, 0.5));
      if (kind == 2) q[size_t(bad_row * d + ht::randint(0, d - 1))] = NAN;
      std::vector<double> kv(nk * static_cast<size_t>(d)), vv(kv.size());
      for (size_t i = 0; i < kv.size(); ++i) {
        kv[i] = ht::grid_value(dt, 1.0);
        vv[i] = ht::grid_value(dt, 1.0);
      }
      if (kind == 0) kv[size_t(bad_key * d + ht::randint(0, d - 1))] = NAN;
      std::vector<float> kf(kv.begin(), kv.end()), vf(vv.begin(), vv.end());
      std::vector<uint16_t> kh(kv.size()), vh(vv.size());
      for (size_t i = 0; dt != 0 && i < kv.size(); ++i) {
        kh[i] = dt == 1 ? ht::half_exact(kv[i]) : ht::bf16_exact(kv[i]);
        vh[i] = dt == 1 ? ht::half_exact(vv[i]) : ht::bf16_exact(vv[i]);
      }
      std::vector<int64_t> lo(nr), hi(nr);
      for (int64_t r = 0; r < rows; ++r) {
        lo[r] = ht::randint(0, 1) ? 0 : ht::randint(0, keys - 1);
        hi[r] = ht::randint(0, 1) ? keys : ht::randint(lo[r] + 1, keys);
      }
      std::vector<std::vector<float>> bias_rows(nr, std::vector<float>(nk, 0.0f));
      std::vector<const float*> bias(nr);
      for (int64_t r = 0; r < rows; ++r) {
        if (kind == 1) bias_rows[r][size_t(bad_key)] = INFINITY;
        bias[r] = bias_rows[r].data();
      }
      const int64_t flagged_before = ht::randint(0, rows - 1);  // incoming m = NaN
      std::vector<float> m(nr, -INFINITY), l(nr, 0.0f), acc(nr * static_cast<size_t>(d), 0.0f);
      m[size_t(flagged_before)] = NAN;
      std::vector<float> scratch(size_t(gqa_chunk_scratch_floats(rows, keys)), NAN);
      GqaChunkArgs a;
      a.q = q.data();
      a.rows = rows;
      a.d = d;
      a.k = dt == 0 ? static_cast<const void*>(kf.data()) : kh.data();
      a.v = dt == 0 ? static_cast<const void*>(vf.data()) : vh.data();
      a.kv_stride = d;
      a.k0 = 0;
      a.k1 = keys;
      a.lo = lo.data();
      a.hi = hi.data();
      a.bias = kind == 1 ? bias.data() : nullptr;
      a.m = m.data();
      a.l = l.data();
      a.acc = acc.data();
      a.scratch = scratch.data();
      (dt == 0 ? tier->chunk : dt == 1 ? tier->chunk_f16 : tier->chunk_bf16)(a);
      for (int64_t r = 0; r < rows; ++r) {
        const bool sees = bad_key >= lo[r] && bad_key < hi[r];
        const bool want_nan = r == flagged_before || (kind == 2 ? r == bad_row : sees);
        CHECK_MSG(std::isnan(m[r]) == want_nan,
                  tier->name << " " << ht::dtype_str(dt) << " kind " << kind << " rows=" << rows << " d=" << d
                             << " row " << r << ": m = " << m[r] << ", expected " << (want_nan ? "NaN" : "finite"));
      }
    }
  }
}

// A NaN in one cached key through gqa() on every tier: exactly the heads of
// that KV head are NaN (long contexts: key ranges split over threads).
TEST(gqa_nan_key_through_driver) {
  ThreadPool pool3(3);
  for (const GqaTier* tier : gqa_tiers_here()) {
    for (int dt = 0; dt < 3; ++dt) {
      Config c;
      c.N = 8;
      c.Nkv = 2;
      c.d = 64;
      c.B = 1;
      c.S = 1;
      c.dt = dt;
      c.total_seq = int64_t(ht::randint(2, 900));
      c.seqlens = {int32_t(c.total_seq - 1)};
      c.past_cap = c.total_seq;
      c.shared = true;
      const Inputs in = random_inputs(c);
      Buffers buf;
      buf.present_k = random_cache(c.B * c.Nkv * c.past_cap * c.d, c.dt);
      buf.present_v = random_cache(c.B * c.Nkv * c.past_cap * c.d, c.dt);
      const int64_t key = ht::randint(0, c.total_seq - 2);  // a past row (the new one is overwritten)
      const size_t at = size_t(((1 * c.past_cap) + key) * c.d + ht::randint(0, c.d - 1));  // KV head 1
      buf.present_k[at] = NAN;  // run_lib passes NaN on to f16/bf16
      const std::string err = run_lib(c, in, buf, *tier, pool3.parallel());
      CHECK_MSG(err.empty(), err);
      for (int64_t n = 0; n < c.N; ++n) {
        size_t nans = 0;
        for (int64_t e = 0; e < c.d; ++e) nans += std::isnan(buf.out[size_t(n * c.d + e)]);
        const size_t want = n >= 4 ? size_t(c.d) : 0;
        CHECK_MSG(nans == want, tier->name << " " << ht::dtype_str(dt) << " total " << c.total_seq << " head " << n
                                           << ": " << nans << " NaN of " << c.d);
      }
    }
  }
}

// The tier names of select_tier resolve; unknown names say so.
// The chunk kernels alone (GqaChunkFn's contract in gqa.h) against float64:
// 1..20 rows (lane groups of 8 and 4 and the row-kernel tail), head sizes
// with every strip tail, ragged per-row visible ranges (rows that see
// nothing, rows cut inside a key block), an incoming online-softmax state,
// softcap, bias with -inf entries, pieces at odd offsets, row strides > d,
// f32 and f16 K/V. Scratch is poisoned with NaN; a row with no visible key
// must leave its state bit-exact.
TEST(gqa_chunk_kernels_ragged) {
  const int64_t ds[] = {8, 16, 24, 40, 64, 72, 128};
  const double inf = std::numeric_limits<double>::infinity();
  for (const GqaTier* tier : gqa_tiers_here()) {
    for (int iter = 0; iter < 60; ++iter) {
      const bool f16 = iter % 2 == 1;
      const int64_t rows = ht::randint(1, 20), d = ds[ht::randint(0, 6)];
      const int64_t stride = d + 8 * ht::randint(0, 2), keys = ht::randint(40, 300);
      const size_t nr = static_cast<size_t>(rows), nkeys = static_cast<size_t>(keys);
      const int64_t k0 = ht::randint(0, keys / 3), k1 = ht::randint(k0 + 1, keys);
      const bool softcap = ht::randint(0, 3) == 0, with_bias = ht::randint(0, 2) == 0;
      const float cap = float(ht::uniform(0.5, 6));
      std::vector<float> q(size_t(rows * d)), kf(size_t(keys * stride)), vf(kf.size());
      for (auto& x : q) x = float(ht::uniform(-0.5, 0.5));
      for (size_t i = 0; i < kf.size(); ++i) {
        kf[i] = random_value(f16, 1.0);
        vf[i] = random_value(f16, 1.0);
      }
      std::vector<uint16_t> kh(kf.size()), vh(vf.size());  // the same values as halves
      for (size_t i = 0; f16 && i < kf.size(); ++i) {
        kh[i] = ht::half_exact(kf[i]);
        vh[i] = ht::half_exact(vf[i]);
      }
      std::vector<int64_t> lo(nr), hi(nr);
      const bool same = ht::randint(0, 2) == 0;  // all rows one range (decode)
      for (int64_t r = 0; r < rows; ++r) {
        const int mode = same ? 0 : int(ht::randint(0, 4));
        lo[r] = mode == 1 ? ht::randint(0, keys) : 0;
        hi[r] = mode == 2 ? ht::randint(0, keys) : mode == 3 ? ht::randint(k0, k1) : keys;
        if (mode == 4) lo[r] = hi[r] = ht::randint(0, keys);  // sees nothing
        if (lo[r] > hi[r]) std::swap(lo[r], hi[r]);
      }
      std::vector<std::vector<float>> bias_rows(nr, std::vector<float>(nkeys));
      std::vector<const float*> bias(nr);
      for (int64_t r = 0; r < rows; ++r) {
        for (auto& x : bias_rows[r]) x = ht::randint(0, 9) == 0 ? -INFINITY : float(ht::uniform(-2, 2));
        if (r % 5 == 4)  // a row whose every key is masked by the bias
          for (auto& x : bias_rows[r]) x = -INFINITY;
        bias[r] = bias_rows[r].data();
      }
      // Incoming state: fresh rows (m = -inf, l = 0, acc = 0) and rows that
      // already saw keys of an earlier piece.
      std::vector<float> m(nr), l(nr), acc(nr * size_t(d));
      for (int64_t r = 0; r < rows; ++r) {
        const bool fresh = ht::randint(0, 1) == 0;
        m[r] = fresh ? -INFINITY : float(ht::uniform(-1, 3));
        l[r] = fresh ? 0.0f : float(ht::uniform(0.5, 20));
        for (int64_t e = 0; e < d; ++e) acc[r * d + e] = fresh ? 0.0f : float(ht::uniform(-5, 5));
      }
      const std::vector<float> m0 = m, l0 = l, acc0 = acc;
      std::vector<float> scratch(size_t(gqa_chunk_scratch_floats(rows, k1 - k0)), NAN);

      GqaChunkArgs a;
      a.q = q.data();
      a.rows = rows;
      a.d = d;
      a.k = f16 ? static_cast<const void*>(kh.data()) : kf.data();
      a.v = f16 ? static_cast<const void*>(vh.data()) : vf.data();
      a.kv_stride = stride;
      a.k0 = k0;
      a.k1 = k1;
      a.lo = lo.data();
      a.hi = hi.data();
      a.bias = with_bias ? bias.data() : nullptr;
      a.softcap = softcap ? cap : 0.0f;
      a.m = m.data();
      a.l = l.data();
      a.acc = acc.data();
      a.scratch = scratch.data();
      (f16 ? tier->chunk_f16 : tier->chunk)(a);

      const std::string what = std::string(tier->name) + ht::fmt(" %s rows=%lld d=%lld stride=%lld keys [%lld, %lld) softcap=%d bias=%d",
                                                                  f16 ? "f16" : "f32", (long long)rows, (long long)d,
                                                                  (long long)stride, (long long)k0, (long long)k1,
                                                                  softcap, with_bias);
      size_t bad = 0, moved = 0;
      for (int64_t r = 0; r < rows; ++r) {
        // float64: the state after folding in the visible keys of the piece.
        std::vector<double> x;
        std::vector<int64_t> js;
        for (int64_t j = std::max(k0, lo[r]); j < std::min(k1, hi[r]); ++j) {
          double s = 0;
          for (int64_t e = 0; e < d; ++e) s += double(q[r * d + e]) * double(kf[j * stride + e]);
          if (softcap) s = double(cap) * std::tanh(s / double(cap));
          if (with_bias) s += double(bias_rows[r][j]);
          x.push_back(s);
          js.push_back(j);
        }
        double M = double(m0[r]);
        for (double s : x) M = std::max(M, s);
        if (x.empty() || M == -inf) {  // nothing folded in: the state stays as it was, bit for bit
          bool same_state = ht::fbits(m[r]) == ht::fbits(m0[r]) && ht::fbits(l[r]) == ht::fbits(l0[r]);
          for (int64_t e = 0; e < d; ++e) same_state = same_state && ht::fbits(acc[r * d + e]) == ht::fbits(acc0[r * d + e]);
          if (!same_state) ++moved;
          continue;
        }
        const double f = m0[r] == -INFINITY ? 0.0 : std::exp(double(m0[r]) - M);
        double L = double(l0[r]) * f;
        std::vector<double> A(static_cast<size_t>(d));
        for (int64_t e = 0; e < d; ++e) A[e] = double(acc0[r * d + e]) * f;
        for (size_t i = 0; i < x.size(); ++i) {
          const double p = std::exp(x[i] - M);
          L += p;
          for (int64_t e = 0; e < d; ++e) A[e] += p * double(vf[js[i] * stride + e]);
        }
        // m may differ by the scores' rounding: compare what does not
        // depend on the shift, l * e^m and acc / l.
        const double rel = 2e-5;
        const double Lgot = double(l[r]) * std::exp(double(m[r]) - M);
        if (!(std::fabs(Lgot - L) <= rel * L)) ++bad;
        double amax = 0;
        for (int64_t e = 0; e < d; ++e) amax = std::max(amax, std::fabs(A[e] / L));
        for (int64_t e = 0; e < d; ++e)
          if (!(std::fabs(double(acc[r * d + e]) / double(l[r]) - A[e] / L) <= rel * (1 + amax))) ++bad;
      }
      CHECK_MSG(bad == 0, what << ": " << bad << " state values off");
      CHECK_MSG(moved == 0, what << ": " << moved << " rows without visible keys changed their state");
    }
  }
}

TEST(gqa_tier_selection) {
  std::string err;
  CHECK(select_gqa_tier("ref", &err) == &gqa_ref_tier());
  CHECK(select_gqa_tier("amx-emu", &err) != nullptr);
  CHECK(select_gqa_tier("auto", &err) != nullptr);
  CHECK(select_gqa_tier("nonsense", &err) == nullptr);
  CHECK_MSG(err.find("nonsense") != std::string::npos, err);
  if (tier_unavailable_reason("avx2").empty()) CHECK(select_gqa_tier("avx2", &err) == &gqa_avx2_tier());
  // avx512 has no GQA kernel of its own: the avx2 kernels under its name.
  const GqaTier* t512 = select_gqa_tier("avx512", &err);
  if (tier_unavailable_reason("avx512").empty()) {
    CHECK(t512 != nullptr && std::string(t512->name) == "avx512" && t512->chunk == gqa_avx2_tier().chunk &&
          t512->chunk_f16 == gqa_avx2_tier().chunk_f16 && t512->chunk_bf16 == gqa_avx2_tier().chunk_bf16);
  } else {
    CHECK_MSG(t512 == nullptr && err == tier_unavailable_reason("avx512"), err);
  }
}
