// The HiNa kernel through the tile emulator: the full expert FFN against a
// float64 reference written here, every activation and gate layout, odd
// sizes, M from 1 to 64; plus what the kernel does with its tiles (weights
// used in place, stream loads for M <= 32, AMX even for M = 1); and the
// detection on this CPU (real AMX cross-check only where it is usable).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <vector>

#include "amx/amx_detect.h"
#include "amx/hina_microkernel.h"
#include "amx/hina_microkernel_impl.h"
#include "../test_util.h"
#include "amx/tile_ops_emu.h"

using namespace hinamoe;
using hinamoe::amx::EmuTileOps;
using hinamoe::amx::TileConfig;
using hinamoe::amx::TileEmulator;

namespace {

// ---- float64 reference ----
double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double gelu_d(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double act_d(const MoEAttrs& at, double g, double u) {
  switch (at.activation) {
    case Activation::Relu: return std::max(0.0, g);
    case Activation::Gelu: return gelu_d(g);
    case Activation::Silu: return g * sigmoid_d(g);
    case Activation::Identity: return g;
    case Activation::Relu2: return g > 0 ? g * g : 0.0;
    case Activation::GeGLU: return gelu_d(g) * u;
    case Activation::SwiGLU: {
      const double lim = at.limit;
      const double L = std::min(std::max(u, -lim), lim);
      if (at.limit_after_activation) return std::min(g * sigmoid_d(at.alpha * g), lim) * (L + at.beta);
      const double G = std::min(g, lim);
      return G * sigmoid_d(at.alpha * G) * (L + at.beta);
    }
  }
  return 0;
}

uint16_t bf(float v) { return f32_to_bf16(v); }
double dbf(uint16_t h) { return double(bf16_to_f32(h)); }

struct Expert {
  int64_t H, I, N1;
  std::vector<uint16_t> w1, w3, w2, b1, b3, b2;  // bf16; biases empty when absent
};

Expert make_expert(std::mt19937_64& g, const MoEAttrs& at, int64_t H, int64_t I, bool bias) {
  const bool gated = is_gated(at.activation), sep = gated && at.gate_layout == GateLayout::Separate;
  Expert e{H, I, gated && !sep ? 2 * I : I, {}, {}, {}, {}, {}, {}};
  auto fill = [&](std::vector<uint16_t>& v, int64_t n, double scale) {
    v.resize(static_cast<size_t>(n));
    for (auto& x : v) x = bf(float(std::uniform_real_distribution<double>(-scale, scale)(g)));
  };
  fill(e.w1, e.N1 * H, 2.0 / std::sqrt(double(H)));
  if (sep) fill(e.w3, I * H, 2.0 / std::sqrt(double(H)));
  fill(e.w2, H * I, 2.0 / std::sqrt(double(I)));
  if (bias) {
    fill(e.b1, e.N1, 0.5);
    if (sep) fill(e.b3, I, 0.5);
    fill(e.b2, H, 0.5);
  }
  return e;
}

// y_ref[m][h] = w_m * (W2[h] . act(x_m) + b2[h]) in float64.
std::vector<double> reference(const MoEAttrs& at, const Expert& e, const std::vector<float>& x,
                              const std::vector<int32_t>& rows, const std::vector<float>& rw) {
  const int64_t H = e.H, I = e.I, M = int64_t(rows.size());
  const bool gated = is_gated(at.activation);
  std::vector<double> y(size_t(M * H)), a(static_cast<size_t>(I));
  auto dot1 = [&](const std::vector<uint16_t>& w, int64_t row, const float* xr) {
    double s = 0;
    for (int64_t k = 0; k < H; ++k) s += dbf(w[size_t(row * H + k)]) * double(xr[k]);
    return s;
  };
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = &x[size_t(rows[size_t(m)] * H)];
    for (int64_t j = 0; j < I; ++j) {
      int64_t gi = j, ui = 0;
      const std::vector<uint16_t>* uw = &e.w1;
      const std::vector<uint16_t>* ub = &e.b1;
      if (gated) {
        if (at.gate_layout == GateLayout::Interleaved) { gi = 2 * j; ui = 2 * j + 1; }
        else if (at.gate_layout == GateLayout::Stacked) { ui = I + j; }
        else { ui = j; uw = &e.w3; ub = &e.b3; }
      }
      double gv = dot1(e.w1, gi, xr) + (e.b1.empty() ? 0.0 : dbf(e.b1[size_t(gi)]));
      double uv = gated ? dot1(*uw, ui, xr) + (ub->empty() ? 0.0 : dbf((*ub)[size_t(ui)])) : 0.0;
      a[size_t(j)] = act_d(at, gv, uv);
    }
    for (int64_t h = 0; h < H; ++h) {
      double s = e.b2.empty() ? 0.0 : dbf(e.b2[size_t(h)]);
      for (int64_t i = 0; i < I; ++i) s += dbf(e.w2[size_t(h * I + i)]) * a[size_t(i)];
      y[size_t(m * H + h)] = double(rw[size_t(m)]) * s;
    }
  }
  return y;
}

// Splits [0, n) into blocks with boundaries at multiples of 8 (the driver's split).
std::vector<std::pair<int64_t, int64_t>> split(std::mt19937_64& g, int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> b;
  for (int64_t s = 0; s < n;) {
    const int64_t len = 8 * (1 + int64_t(g() % 6));
    b.push_back({s, std::min(n, s + len)});
    s += len;
  }
  std::shuffle(b.begin(), b.end(), g);  // order must not matter
  return b;
}

using GateUpFn = void (*)(const MoEAttrs&, int64_t, int64_t, const uint16_t*, const void*, const uint16_t*,
                          const void*, DType, const uint16_t*, int64_t, int64_t, int64_t, uint16_t*);
using DownFn = void (*)(int64_t, int64_t, const uint16_t*, const void*, DType, const uint16_t*, int64_t, int64_t,
                        int64_t, const float*, bool, float*, int64_t);

// The driver's sequence for one expert: gather -> gate/up blocks -> down blocks.
std::vector<float> run_expert(std::mt19937_64& g, GateUpFn gate_up, DownFn down, const MoEAttrs& at,
                              const Expert& e, const std::vector<float>& x, const std::vector<int32_t>& rows,
                              const std::vector<float>& rw, bool accumulate, const std::vector<float>& y0) {
  const int64_t H = e.H, I = e.I, M = int64_t(rows.size());
  std::vector<uint16_t> xv(size_t(amx_vnni_elems(H, M)), 0x7fc1);  // NaN sentinels: gaps would show
  std::vector<uint16_t> actv(size_t(amx_vnni_elems(I, M)), 0x7fc1);
  amx_gather_vnni(x.data(), DType::F32, H, rows.data(), M, xv.data());
  auto ptr = [](const std::vector<uint16_t>& v) -> const void* { return v.empty() ? nullptr : v.data(); };
  for (auto& b : split(g, I))
    gate_up(at, H, I, e.w1.data(), ptr(e.b1), e.w3.empty() ? nullptr : e.w3.data(), ptr(e.b3), DType::BF16,
            xv.data(), M, b.first, b.second, actv.data());
  std::vector<float> y = y0;
  for (auto& b : split(g, H))
    down(H, I, e.w2.data(), ptr(e.b2), DType::BF16, actv.data(), M, b.first, b.second, rw.data(), accumulate,
         y.data(), H);
  return y;
}

struct ActCase {
  std::string name;
  MoEAttrs at;
};

std::vector<ActCase> act_cases() {
  std::vector<ActCase> v;
  auto plain = [&](const char* n, Activation a) {
    MoEAttrs at; at.activation = a; v.push_back({n, at});
  };
  plain("relu", Activation::Relu);
  plain("gelu", Activation::Gelu);
  plain("silu", Activation::Silu);
  plain("identity", Activation::Identity);
  plain("relu2", Activation::Relu2);
  const GateLayout layouts[] = {GateLayout::Interleaved, GateLayout::Stacked, GateLayout::Separate};
  const char* lname[] = {"interleaved", "stacked", "separate"};
  for (int l = 0; l < 3; ++l) {
    MoEAttrs at; at.activation = Activation::SwiGLU; at.gate_layout = layouts[l];
    v.push_back({std::string("swiglu-") + lname[l], at});
    at.alpha = 1.702f; at.beta = 1.0f; at.limit = 0.8f;  // the clamp bites at this data's scale
    v.push_back({std::string("swiglu-oss-") + lname[l], at});
    at.limit_after_activation = true;
    v.push_back({std::string("swiglu-oss-after-") + lname[l], at});
    MoEAttrs ge; ge.activation = Activation::GeGLU; ge.gate_layout = layouts[l];
    v.push_back({std::string("geglu-") + lname[l], ge});
  }
  return v;
}

// Records what the kernel asks of the tiles, then runs it on the emulator.
struct RecordingOps : EmuTileOps {
  struct Load { int tile; const void* p; int64_t stride; bool stream; };
  std::vector<Load> loads;
  std::vector<TileConfig> configs;
  int dps = 0;
  using EmuTileOps::EmuTileOps;
  void configure(const TileConfig& c) { configs.push_back(c); EmuTileOps::configure(c); }
  template <int T> void load(const void* p, int64_t s) { loads.push_back({T, p, s, false}); EmuTileOps::load<T>(p, s); }
  template <int T> void stream_load(const void* p, int64_t s) {
    loads.push_back({T, p, s, true});
    EmuTileOps::stream_load<T>(p, s);
  }
  template <int D, int A, int B> void dp_bf16() { ++dps; EmuTileOps::dp_bf16<D, A, B>(); }
};

const int64_t kMs[] = {1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 64};

}  // namespace

TEST(kernel_ffn_emu_vs_float64_all_activations) {
  auto& g = ht::rng();
  const int64_t sizes[][2] = {{100, 72}, {64, 48}, {47, 23}};
  double worst = 0;
  int runs = 0;
  for (auto& sz : sizes) {
    for (const ActCase& ac : act_cases()) {
      for (int bias = 0; bias < 2; ++bias) {
        for (int64_t M : kMs) {
          const int64_t H = sz[0], I = sz[1], T = M + 5;
          const Expert e = make_expert(g, ac.at, H, I, bias);
          std::vector<float> x(size_t(T * H));
          for (auto& v : x) v = bf16_to_f32(bf(float(std::uniform_real_distribution<double>(-1, 1)(g))));
          std::vector<int32_t> rows(static_cast<size_t>(M));
          for (auto& r : rows) r = int32_t(g() % T);
          std::vector<float> rw(static_cast<size_t>(M));
          for (auto& w : rw) w = float(std::uniform_real_distribution<double>(0.1, 1)(g));
          const bool accumulate = g() & 1;
          std::vector<float> y0(size_t(M * H), 0.0f);
          if (accumulate)
            for (auto& v : y0) v = float(std::uniform_real_distribution<double>(-1, 1)(g));
          const std::vector<float> y =
              run_expert(g, amx_gate_up_block_emu, amx_down_block_emu, ac.at, e, x, rows, rw, accumulate, y0);
          const std::vector<double> ref = reference(ac.at, e, x, rows, rw);
          double scale = 1e-3, err = 0;
          for (double r : ref) scale = std::max(scale, std::fabs(r));
          bool finite = true;
          for (size_t i = 0; i < ref.size(); ++i) {
            const double got = double(y[i]) - (accumulate ? double(y0[i]) : 0.0);
            finite &= std::isfinite(y[i]);
            err = std::max(err, std::fabs(got - ref[i]));
          }
          worst = std::max(worst, err / scale);
          ++runs;
          CHECK_MSG(finite && err <= 1e-2 * scale,
                    ac.name + " H=" + std::to_string(H) +
                        " I=" + std::to_string(I) + " M=" + std::to_string(M) + " bias=" + std::to_string(bias) +
                        " err/scale=" + std::to_string(err / scale));
        }
      }
    }
  }
  std::printf("    %d expert runs, worst max|err|/max|ref| = %.2e (bound 1e-2)\n", runs, worst);
}

TEST(kernel_gather_from_f16_and_f32_inputs) {
  // Non-bf16 inputs are rounded once in the gather; compare with a reference
  // fed the same rounded values, and with the plain pipeline on bf16 input.
  auto& g = ht::rng();
  MoEAttrs at; at.activation = Activation::SwiGLU; at.gate_layout = GateLayout::Interleaved;
  const int64_t H = 80, I = 40, M = 9, T = 12;
  const Expert e = make_expert(g, at, H, I, true);
  std::vector<float> xf(size_t(T * H));
  for (auto& v : xf) v = float(std::uniform_real_distribution<double>(-1, 1)(g));
  std::vector<uint16_t> xh(xf.size());
  for (size_t i = 0; i < xf.size(); ++i) xh[i] = f32_to_f16(xf[i]);
  std::vector<int32_t> rows(static_cast<size_t>(M));
  for (auto& r : rows) r = int32_t(g() % T);
  std::vector<float> rw(size_t(M), 1.0f);
  for (DType dt : {DType::F32, DType::F16}) {
    std::vector<float> xr(xf.size());  // what the kernel will see
    for (size_t i = 0; i < xf.size(); ++i)
      xr[i] = bf16_to_f32(f32_to_bf16(dt == DType::F32 ? xf[i] : f16_to_f32(xh[i])));
    std::vector<uint16_t> xv(size_t(amx_vnni_elems(H, M))), xv_ref(xv.size());
    amx_gather_vnni(dt == DType::F32 ? static_cast<const void*>(xf.data()) : xh.data(), dt, H, rows.data(), M,
                    xv.data());
    amx_gather_vnni(xr.data(), DType::F32, H, rows.data(), M, xv_ref.data());
    CHECK(xv == xv_ref);
  }
}

// M tokens of H elements, all `value`, gathered into the VNNI B layout.
static std::vector<uint16_t> constant_tokens_vnni(int64_t H, int64_t M, float value) {
  std::vector<float> x(size_t(M * H), value);
  std::vector<int32_t> rows(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) rows[size_t(m)] = int32_t(m);
  std::vector<uint16_t> xv(size_t(amx_vnni_elems(H, M)));
  amx_gather_vnni(x.data(), DType::F32, H, rows.data(), M, xv.data());
  return xv;
}

TEST(kernel_uses_weights_in_place_and_streams) {
  auto& g = ht::rng();
  for (int64_t H : {64, 100}) {   // 100: a K tail (the one staged W edge)
    for (int64_t M : kMs) {
      MoEAttrs at; at.activation = Activation::SwiGLU; at.gate_layout = GateLayout::Stacked;
      const int64_t I = 40;
      const Expert e = make_expert(g, at, H, I, false);
      std::vector<uint16_t> xv = constant_tokens_vnni(H, M, 0.5f), actv(size_t(amx_vnni_elems(I, M)));
      TileEmulator emu;
      RecordingOps ops(emu);
      amx::gate_up_block(ops, at, H, I, e.w1.data(), nullptr, nullptr, nullptr, DType::BF16, xv.data(), M, 0, I,
                         actv.data());
      const char* wb = reinterpret_cast<const char*>(e.w1.data());
      const char* we = wb + e.w1.size() * 2;
      const char* xb = reinterpret_cast<const char*>(xv.data());
      const char* xe = xb + xv.size() * 2;
      int w_direct = 0, w_staged = 0, bad = 0;
      for (auto& l : ops.loads) {
        const char* p = static_cast<const char*>(l.p);
        if (l.tile == 2 || l.tile == 3) {
          if (p >= wb && p < we) {
            ++w_direct;
            bad += l.stride != H * 2;         // rows of W where they lie
            bad += l.stream != (M <= 32);     // tileloaddt1 exactly when M <= 32
          } else {
            ++w_staged;                       // K tail only
            bad += l.stride != 64;
          }
        } else {
          bad += !(p >= xb && p < xe) || l.stride != 4 * M || l.stream;
        }
      }
      const int64_t jblocks = (I + 15) / 16, mblocks = (M + 31) / 32, kfull = H / 32;
      CHECK_MSG(bad == 0, "H=" + std::to_string(H) + " M=" + std::to_string(M));
      CHECK(w_direct == 2 * jblocks * mblocks * kfull);
      CHECK(w_staged == (H % 32 ? 2 * jblocks * mblocks : 0));
      CHECK(ops.dps > 0);  // AMX for every M, including 1
      // Tile shapes: tokens m_r = min(M, 32) split over tmm0/tmm1; reconfigured only at edges.
      const TileConfig& c = ops.configs.front();
      CHECK(c.colsb[0] == 4 * std::min<int64_t>(M, 16));
      CHECK(c.colsb[1] == (M > 16 ? 4 * (std::min<int64_t>(M, 32) - 16) : 0));
      CHECK(c.rows[2] == 16 && c.colsb[2] == 64 && c.rows[0] == 16);
      // One LDTILECFG per shape change: only at the I edge, plus once per panel
      // when M > 32 has a partial token block (zigzag order).
      const size_t max_cfg = (M <= 32 || M % 32 == 0) ? 2 : size_t(jblocks) + 2;
      CHECK_MSG(ops.configs.size() <= max_cfg, std::to_string(ops.configs.size()) + " configs, M=" + std::to_string(M));
    }
  }
}

TEST(kernel_tile_shapes_for_edges) {
  // Non-gated, I = 40: blocks of 32 then 8 W rows; M = 33: token blocks 32 + 1.
  auto& g = ht::rng();
  MoEAttrs at; at.activation = Activation::Relu;
  const int64_t H = 32, I = 40, M = 33;
  const Expert e = make_expert(g, at, H, I, false);
  std::vector<uint16_t> xv = constant_tokens_vnni(H, M, 0.25f), actv(size_t(amx_vnni_elems(I, M)));
  TileEmulator emu;
  RecordingOps ops(emu);
  amx::gate_up_block(ops, at, H, I, e.w1.data(), nullptr, nullptr, nullptr, DType::BF16, xv.data(), M, 0, I,
                     actv.data());
  // Zigzag order: (32 rows, 32 tokens), (32, 1), then the 8-row panel backwards: (8, 1), (8, 32).
  CHECK(ops.configs.size() == 4);
  if (ops.configs.size() == 4) {
    const TileConfig& c = ops.configs[2];
    CHECK(c.rows[2] == 8 && c.rows[3] == 0 && c.colsb[0] == 4 && c.colsb[1] == 0);
    CHECK(c.rows[4] == 8 && c.colsb[4] == 4 && c.rows[5] == 0 && c.rows[6] == 0 && c.rows[7] == 0);
    const TileConfig& d = ops.configs[3];
    CHECK(d.rows[2] == 8 && d.colsb[0] == 64 && d.colsb[1] == 64 && d.rows[5] == 8 && d.colsb[5] == 64);
    const TileConfig& b = ops.configs[1];
    CHECK(b.rows[2] == 16 && b.rows[3] == 16 && b.colsb[0] == 4 && b.rows[6] == 16 && b.colsb[6] == 4);
  }
}

TEST(kernel_tile_error_surfaces_as_exception) {
  // A corrupt shape would be a kernel bug: the emulator turns it into TileError.
  TileEmulator emu;
  EmuTileOps ops(emu);
  TileConfig c = amx::blank_palette1();
  amx::set_tile(&c, 0, 16, 66);
  CHECK_THROWS(ops.configure(c), ::hinamoe::amx::TileError);
}

TEST(detect_reports_on_this_cpu) {
  const std::string r = amx_unavailable_reason(), cpu = amx_cpu_os_reason();
  std::ifstream f("/proc/cpuinfo");
  const std::string info((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const bool lscpu_amx = info.find(" amx_tile") != std::string::npos && info.find(" amx_bf16") != std::string::npos;
  std::printf("    amx_unavailable_reason() = \"%s\"\n", r.c_str());
  CHECK(r == amx_unavailable_reason());  // cached, stable
  if (!lscpu_amx) {
    CHECK(!r.empty());
    CHECK(!cpu.empty());
    CHECK(r.rfind("CPU lacks AMX-", 0) == 0 || r.rfind("OS ", 0) == 0);
  } else {
    CHECK(cpu.empty());  // /proc/cpuinfo only lists what the OS enabled
  }
}

TEST(real_amx_matches_emulator_where_available) {
  if (!amx_unavailable_reason().empty()) {
    std::printf("    skipped: %s\n", amx_unavailable_reason().c_str());
    return;
  }
  auto& g = ht::rng();
  for (const ActCase& ac : act_cases()) {
    for (int64_t M : kMs) {
      const int64_t H = 100, I = 72;
      const Expert e = make_expert(g, ac.at, H, I, true);
      std::vector<float> x(size_t(M * H));
      for (auto& v : x) v = float(std::uniform_real_distribution<double>(-1, 1)(g));
      std::vector<int32_t> rows(static_cast<size_t>(M));
      for (int64_t m = 0; m < M; ++m) rows[size_t(m)] = int32_t(m);
      std::vector<float> rw(size_t(M), 0.5f), y0(size_t(M * H), 0.0f);
      std::mt19937_64 g1(g()), g2 = g1;  // same block split for both
      const auto ye = run_expert(g1, amx_gate_up_block_emu, amx_down_block_emu, ac.at, e, x, rows, rw, false, y0);
      const auto ya = run_expert(g2, amx_gate_up_block_amx, amx_down_block_amx, ac.at, e, x, rows, rw, false, y0);
      double scale = 1e-3, err = 0;
      size_t exact = 0;
      for (size_t i = 0; i < ye.size(); ++i) {
        scale = std::max(scale, std::fabs(double(ye[i])));
        err = std::max(err, std::fabs(double(ye[i]) - double(ya[i])));
        exact += std::memcmp(&ye[i], &ya[i], 4) == 0;
      }
       CHECK_MSG(err <= 1e-3 * scale, ac.name + " M=" + std::to_string(M));
      if (exact != ye.size())
        std::printf("    %s M=%lld: %zu/%zu outputs bit-identical to the emulator, max diff %.3g\n", ac.name.c_str(),
                    (long long)M, exact, ye.size(), err);
    }
  }
}
