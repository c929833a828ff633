// The AMX-INT8 QMoE block kernel through the tile emulator: the token
// quantiser against its definition, the block kernel against an int64 /
// float64 reference on random codes, scales, zero points and tokens (4- and
// 8-bit, block 16..1024, N and M edges, sub-ranges of rows), how it uses its
// tiles (codes in place, TDPBUSD only), the input checks, and (where the CPU
// has AMX-INT8) real tiles against the emulator.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../test_util.h"
#include "amx/amx_detect.h"
#include "amx/qmoe_i8.h"
#include "amx/qmoe_i8_impl.h"
#include "amx/tile_ops_emu.h"

using namespace hinamoe;
using hinamoe::amx::EmuTileOps;
using hinamoe::amx::TileEmulator;

namespace {

// An expert weight with its own (test-side) view of every value.
struct QW {
  int bits = 4;
  int64_t N = 0, K = 0, block = 0, nb = 0;
  std::vector<uint8_t> packed, zp_packed;
  std::vector<int> code, zp;  // [N][K], [N][nb] as plain integers
  std::vector<float> scales;  // [N][nb]
  AmxI8Weight view(bool with_zp) const {
    AmxI8Weight w;
    w.codes = packed.data();
    w.scales = scales.data();
    w.zero_points = with_zp ? zp_packed.data() : nullptr;
    w.bits = bits;
    w.N = N;
    w.K = K;
    w.block = block;
    return w;
  }
};

// Codes over the whole range (0 and the top value included), packed as QMoE
// packs them; zero points packed ORT's block-wise way.
QW make_weight(std::mt19937_64& g, int bits, int64_t N, int64_t K, int64_t block) {
  QW w;
  w.bits = bits; w.N = N; w.K = K; w.block = block; w.nb = K / block;
  const int top = (1 << bits) - 1;
  w.code.resize(size_t(N * K));
  for (auto& c : w.code) {
    const uint32_t r = uint32_t(g());
    c = r % 5 == 0 ? (r % 2 ? top : 0) : int(r >> 8) % (top + 1);
  }
  w.packed.assign(size_t(N * K * bits / 8), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int c = w.code[size_t(n * K + k)];
      if (bits == 8) w.packed[size_t(n * K + k)] = uint8_t(c);
      else w.packed[size_t(n * K / 2 + k / 2)] |= uint8_t(c << (4 * (k % 2)));
    }
  const int64_t pack = 8 / bits, per_row = (w.nb + pack - 1) / pack;
  w.zp.resize(size_t(N * w.nb));
  w.zp_packed.assign(size_t(N * per_row), 0);
  w.scales.resize(size_t(N * w.nb));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < w.nb; ++b) {
      const int z = int(g() % uint64_t(top + 1));
      w.zp[size_t(n * w.nb + b)] = z;
      w.zp_packed[size_t(n * per_row + b / pack)] |= uint8_t(z << (bits * (b % pack)));
      w.scales[size_t(n * w.nb + b)] = float(ht::uniform(0.2, 2.0) * (g() % 4 == 0 ? -1 : 1) / 64.0);
    }
  return w;
}

// Tokens as the kernel reads them, with the plain row-major codes beside.
struct QT {
  int64_t M = 0, K = 0, block = 0, nb = 0;
  std::vector<int8_t> rowmajor, vnni;
  std::vector<float> scale;
  std::vector<int32_t> sum;
  AmxI8Tokens view() const {
    AmxI8Tokens t;
    t.q = vnni.data(); t.scale = scale.data(); t.sum = sum.data();
    t.M = M; t.K = K; t.block = block;
    return t;
  }
};

// Random int8 tokens over the whole range (-128 and 127 included), laid out
// with amx_i8_tokens_to_vnni; sums and scales written here.
QT make_tokens(std::mt19937_64& g, int64_t M, int64_t K, int64_t block) {
  QT t;
  t.M = M; t.K = K; t.block = block; t.nb = K / block;
  t.rowmajor.resize(size_t(M * K));
  for (auto& q : t.rowmajor) {
    const uint32_t r = uint32_t(g());
    q = r % 6 == 0 ? int8_t(r % 2 ? 127 : -128) : int8_t(uint8_t(r >> 8));
  }
  t.vnni.assign(size_t(M * K), int8_t(0x5a));
  amx_i8_tokens_to_vnni(t.rowmajor.data(), K, M, K, t.vnni.data());
  t.scale.resize(size_t(M * t.nb));
  t.sum.assign(size_t(M * t.nb), 0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < t.nb; ++b) {
      t.scale[size_t(m * t.nb + b)] = float(ht::uniform(0.1, 1.0) / 127.0);
      for (int64_t i = 0; i < block; ++i) t.sum[size_t(m * t.nb + b)] += t.rowmajor[size_t(m * K + b * block + i)];
    }
  return t;
}

// Reference: exact int64 per block, then float64. Also the scale of the
// float rounding the kernel may add: the sum of |terms|.
void reference(const QW& w, const QT& x, bool with_zp, int64_t n, int64_t m, double* val, double* mag) {
  double v = 0, a = 0;
  for (int64_t b = 0; b < w.nb; ++b) {
    const int64_t z = with_zp ? w.zp[size_t(n * w.nb + b)] : (1 << (w.bits - 1));
    int64_t d = 0;
    for (int64_t i = 0; i < w.block; ++i) {
      const int64_t k = b * w.block + i;
      d += (int64_t(w.code[size_t(n * w.K + k)]) - z) * int64_t(x.rowmajor[size_t(m * x.K + k)]);
    }
    const double t = double(w.scales[size_t(n * w.nb + b)]) * double(x.scale[size_t(m * x.nb + b)]) * double(d);
    v += t;
    a += std::fabs(t);
  }
  *val = v;
  *mag = a;
}

using BlockFn = void (*)(const AmxI8Weight&, const AmxI8Tokens&, int64_t, int64_t, float*, int64_t);

// Runs fn on rows [n0, n1) into a NaN-poisoned y (ldy > n1 - n0), checks
// every written value against the reference and that nothing else changed.
// Returns the worst error relative to the magnitude.
double check_block(BlockFn fn, const QW& w, const QT& x, bool with_zp, int64_t n0, int64_t n1,
                   const std::string& what) {
  const int64_t ldy = n1 - n0 + 3;
  std::vector<float> y(size_t(x.M * ldy), std::numeric_limits<float>::quiet_NaN());
  fn(w.view(with_zp), x.view(), n0, n1, y.data(), ldy);
  double worst = 0;
  int bad = 0, touched = 0;
  for (int64_t m = 0; m < x.M; ++m) {
    for (int64_t n = n0; n < n1; ++n) {
      double ref, mag;
      reference(w, x, with_zp, n, m, &ref, &mag);
      const double got = y[size_t(m * ldy + n - n0)];
      const double err = std::fabs(got - ref) / (mag + 1e-30);
      if (!(err <= 2e-6)) {
        if (bad++ == 0) std::printf("    %s: m=%lld n=%lld got %.9g want %.9g\n", what.c_str(), (long long)m,
                                    (long long)n, got, ref);
      }
      if (std::isfinite(err)) worst = std::max(worst, err);
    }
    for (int64_t i = n1 - n0; i < ldy; ++i) touched += !std::isnan(y[size_t(m * ldy + i)]);
  }
  CHECK_MSG(bad == 0, what + ": " + std::to_string(bad) + " wrong outputs");
  CHECK_MSG(touched == 0, what + ": wrote outside its rows");
  return worst;
}

std::string case_name(int bits, int64_t N, int64_t K, int64_t block, int64_t M, bool zp) {
  return ht::fmt("bits=%d N=%lld K=%lld block=%lld M=%lld zp=%d", bits, (long long)N, (long long)K,
                 (long long)block, (long long)M, int(zp));
}

struct RecordingOps : EmuTileOps {
  struct Load { int tile; const void* p; int64_t stride; bool stream; };
  std::vector<Load> loads;
  int usd = 0;
  using EmuTileOps::EmuTileOps;
  template <int T> void load(const void* p, int64_t s) { loads.push_back({T, p, s, false}); EmuTileOps::load<T>(p, s); }
  template <int T> void stream_load(const void* p, int64_t s) {
    loads.push_back({T, p, s, true});
    EmuTileOps::stream_load<T>(p, s);
  }
  template <int D, int A, int B> void dp_usd() { ++usd; EmuTileOps::dp_usd<D, A, B>(); }
};

}  // namespace

TEST(qmoe_i8_block_emu_vs_int64_reference) {
  auto& g = ht::rng();
  double worst = 0;
  int runs = 0;
  for (int bits : {4, 8}) {
    for (int64_t block : {16, 32, 64, 128, 256, 1024}) {
      for (bool zp : {false, true}) {
        // N edges around the 16/32-row tiles; K one or several blocks; M over 1..32 (and 33+: two token blocks).
        const int64_t Ns[] = {1, 7, 16, 17, 32, 33, int64_t(40 + g() % 30)};
        for (int64_t N : Ns) {
          const int64_t K = block * int64_t(1 + g() % (block >= 1024 ? 1 : block >= 128 ? 3 : 6));
          const int64_t M = g() % 8 == 0 ? int64_t(33 + g() % 16) : int64_t(1 + g() % 32);
          const QW w = make_weight(g, bits, N, K, block);
          const QT x = make_tokens(g, M, K, block);
          worst = std::max(worst, check_block(amx_qmoe_i8_block_emu, w, x, zp, 0, N,
                                              case_name(bits, N, K, block, M, zp)));
          ++runs;
        }
      }
    }
  }
  std::printf("    %d shapes, worst error %.3g of the sum of |block terms|\n", runs, worst);
}

TEST(qmoe_i8_block_every_m_and_row_ranges) {
  auto& g = ht::rng();
  for (int bits : {4, 8}) {
    const int64_t block = g() % 2 ? 32 : 64, K = 2 * block + (g() % 2) * block;
    const QW w = make_weight(g, bits, 50, K, block);
    for (int64_t M = 1; M <= 32; ++M) {
      const QT x = make_tokens(g, M, K, block);
      // A random row range (blocks of one expert split between threads).
      const int64_t n0 = int64_t(g() % 40), n1 = n0 + 1 + int64_t(g() % uint64_t(50 - n0));
      check_block(amx_qmoe_i8_block_emu, w, x, g() % 2 == 0, n0, n1,
                  case_name(bits, 50, K, block, M, true) + ht::fmt(" rows [%lld, %lld)", (long long)n0, (long long)n1));
    }
  }
}

TEST(qmoe_i8_block_empty_ranges_write_nothing) {
  auto& g = ht::rng();
  const QW w = make_weight(g, 8, 8, 64, 32);
  const QT x = make_tokens(g, 3, 64, 32);
  std::vector<float> y(24, std::numeric_limits<float>::quiet_NaN());
  amx_qmoe_i8_block_emu(w.view(false), x.view(), 4, 4, y.data(), 8);
  AmxI8Tokens none = x.view();
  none.M = 0;
  amx_qmoe_i8_block_emu(w.view(false), none, 0, 8, y.data(), 8);
  int touched = 0;
  for (float v : y) touched += !std::isnan(v);
  CHECK(touched == 0);
}

TEST(qmoe_i8_gather_quantises_per_block) {
  auto& g = ht::rng();
  for (int64_t block : {16, 32, 64, 128, 256}) {
    const int64_t K = block * int64_t(1 + g() % 3), M = int64_t(1 + g() % 20), nb = K / block, X = M + 5;
    std::vector<float> x(size_t(X * K));
    for (auto& v : x) v = float(ht::uniform(-3, 3));
    for (int64_t i = 0; i < K; ++i) x[size_t(2 * K + i)] = 0.0f;  // an all-zero row: scale 0
    std::vector<int32_t> rows(static_cast<size_t>(M));
    for (auto& r : rows) r = int32_t(g() % uint64_t(X));
    rows[0] = 2;
    std::vector<int8_t> q(size_t(M * K), int8_t(0x5a));
    std::vector<float> sc(size_t(M * nb), -1.0f);
    std::vector<int32_t> sm(size_t(M * nb), -12345);
    amx_i8_gather_tokens(x.data(), DType::F32, K, rows.data(), M, block, q.data(), sc.data(), sm.data());
    int bad = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t b = 0; b < nb; ++b) {
        const float* xb = &x[size_t(rows[size_t(m)] * K + b * block)];
        double amax = 0;
        for (int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(double(xb[i])));
        const double s = sc[size_t(m * nb + b)];
        bad += std::fabs(s - amax / 127.0) > 1e-6 * amax / 127.0;
        int64_t total = 0;
        bool saw127 = false;
        for (int64_t i = 0; i < block; ++i) {
          const int64_t k = b * block + i;
          const int c = q[size_t((k / 4) * 4 * M + 4 * m + k % 4)];  // VNNI: 4 k of a token per dword
          total += c;
          bad += c < -127 || c > 127;
          if (amax > 0) bad += std::fabs(double(c) - double(xb[i]) * 127.0 / amax) > 0.5 + 1e-4;
          else bad += c != 0;
          saw127 |= std::abs(c) == 127;
        }
        bad += total != sm[size_t(m * nb + b)];
        bad += amax > 0 && !saw127;  // the block's largest value maps to +-127
      }
    CHECK_MSG(bad == 0, ht::fmt("block=%lld: %d wrong", (long long)block, bad));
    CHECK(sc[0] == 0.0f);  // the all-zero row
  }
}

TEST(qmoe_i8_gather_from_f16_bf16_and_nonfinite) {
  auto& g = ht::rng();
  const int64_t K = 64, M = 5, block = 32, nb = 2;
  std::vector<uint16_t> xh(size_t(M * K)), xb(size_t(M * K));
  std::vector<float> fh(xh.size()), fb(xb.size());
  for (size_t i = 0; i < xh.size(); ++i) {
    const double v = std::ldexp(double(int(g() % 2001) - 1000), -8);  // exact in f16 and bf16? 11 bits: f16 yes
    xh[i] = ht::half_exact(v);
    fh[i] = float(v);
    const double vb = std::ldexp(double(int(g() % 255) - 127), -5);   // 8 significant bits: exact in bf16
    xb[i] = ht::bf16_exact(vb);
    fb[i] = float(vb);
  }
  auto gather = [&](const void* p, DType dt, std::vector<int8_t>& q, std::vector<float>& s, std::vector<int32_t>& u) {
    q.assign(size_t(M * K), 0); s.assign(size_t(M * nb), 0); u.assign(size_t(M * nb), 0);
    amx_i8_gather_tokens(p, dt, K, nullptr, M, block, q.data(), s.data(), u.data());
  };
  std::vector<int8_t> q1, q2;
  std::vector<float> s1, s2;
  std::vector<int32_t> u1, u2;
  gather(xh.data(), DType::F16, q1, s1, u1);
  gather(fh.data(), DType::F32, q2, s2, u2);
  CHECK(q1 == q2 && s1 == s2 && u1 == u2);
  gather(xb.data(), DType::BF16, q1, s1, u1);
  gather(fb.data(), DType::F32, q2, s2, u2);
  CHECK(q1 == q2 && s1 == s2 && u1 == u2);
  // A NaN or inf makes its block's scale NaN (so the outputs are NaN) and
  // leaves the other blocks alone.
  std::vector<float> x = fb;
  x[size_t(1 * K + 40)] = std::numeric_limits<float>::quiet_NaN();
  x[size_t(3 * K + 3)] = std::numeric_limits<float>::infinity();
  gather(x.data(), DType::F32, q1, s1, u1);
  CHECK(std::isnan(s1[1 * nb + 1]) && std::isnan(s1[3 * nb + 0]));
  CHECK(u1[1 * nb + 1] == 0 && u1[3 * nb + 0] == 0);
  CHECK(s1[1 * nb + 0] == s2[1 * nb + 0] && s1[3 * nb + 1] == s2[3 * nb + 1]);
  const QW w = make_weight(g, 8, 3, K, block);
  QT t;
  t.M = M; t.K = K; t.block = block; t.nb = nb; t.vnni = q1; t.scale = s1; t.sum = u1;
  std::vector<float> y(size_t(M * 3), 0.0f);
  amx_qmoe_i8_block_emu(w.view(false), t.view(), 0, 3, y.data(), 3);
  CHECK(std::isnan(y[1 * 3]) && std::isnan(y[3 * 3 + 2]) && std::isfinite(y[0]) && std::isfinite(y[2 * 3 + 1]));
}

TEST(qmoe_i8_gathered_tokens_end_to_end) {
  // Float tokens -> gather -> kernel, against float64 on the dequantised
  // weights and the gathered tokens' own dequantised values.
  auto& g = ht::rng();
  for (int bits : {4, 8}) {
    const int64_t K = 256, block = 64, M = 9, N = 20, nb = K / block;
    const QW w = make_weight(g, bits, N, K, block);
    std::vector<float> x(size_t(M * K));
    for (auto& v : x) v = float(ht::uniform(-1, 1));
    QT t;
    t.M = M; t.K = K; t.block = block; t.nb = nb;
    t.vnni.resize(size_t(M * K)); t.scale.resize(size_t(M * nb)); t.sum.resize(size_t(M * nb));
    amx_i8_gather_tokens(x.data(), DType::F32, K, nullptr, M, block, t.vnni.data(), t.scale.data(), t.sum.data());
    std::vector<float> y(size_t(M * N));
    amx_qmoe_i8_block_emu(w.view(true), t.view(), 0, N, y.data(), N);
    double err = 0, scale = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0;  // float x, float64: the int8 rounding of x is the only approximation
        for (int64_t k = 0; k < K; ++k) {
          const int64_t b = k / block;
          ref += double(w.scales[size_t(n * nb + b)]) * (w.code[size_t(n * K + k)] - w.zp[size_t(n * nb + b)]) *
                 double(x[size_t(m * K + k)]);
        }
        err = std::max(err, std::fabs(ref - y[size_t(m * N + n)]));
        scale = std::max(scale, std::fabs(ref));
      }
    // int8 tokens: each element within half a step (amax/254) of x.
    CHECK_MSG(err <= 0.02 * scale, ht::fmt("bits=%d err %.3g scale %.3g", bits, err, scale));
  }
}

TEST(qmoe_i8_uses_codes_in_place_and_tdpbusd) {
  auto& g = ht::rng();
  for (int bits : {4, 8}) {
    for (int64_t M : {1, 17, 32, 40}) {
      const int64_t N = 40, K = 128, block = 32;
      const QW w = make_weight(g, bits, N, K, block);
      const QT x = make_tokens(g, M, K, block);
      std::vector<float> y(size_t(M * N));
      TileEmulator emu;
      RecordingOps ops(emu);
      amx::qmoe_i8_block(ops, w.view(false), x.view(), 0, N, y.data(), N);
      const char* wb = reinterpret_cast<const char*>(w.packed.data());
      const char* we = wb + w.packed.size();
      int direct = 0, staged = 0, bad = 0;
      for (auto& l : ops.loads) {
        if (l.tile != 2 && l.tile != 3) continue;
        const char* p = static_cast<const char*>(l.p);
        if (p >= wb && p < we) {
          ++direct;
          bad += l.stride != K * bits / 8;  // rows of the codes where they lie
          bad += l.stream != (M <= 32);     // tileloaddt1 when each code is used once
        } else {
          ++staged;
          bad += l.stride != 64;
        }
      }
      CHECK_MSG(bad == 0, ht::fmt("bits=%d M=%lld", bits, (long long)M));
      CHECK(bits == 8 ? (direct > 0 && staged == 0) : (direct == 0 && staged > 0));  // 4-bit: widened
      // k-steps of one block (32 bytes) x 2 row panels, 4 tile pairs when 32 rows and > 16 tokens.
      CHECK(ops.usd > 0);
    }
  }
}

TEST(qmoe_i8_unsupported_inputs_are_named) {
  auto& g = ht::rng();
  const QW w8 = make_weight(g, 8, 4, 128, 64);
  const QT x = make_tokens(g, 2, 128, 64);
  CHECK(amx_i8_unsupported_reason(w8.view(false), x.view()).empty());
  auto reason = [&](auto edit) {
    AmxI8Weight w = w8.view(false);
    AmxI8Tokens t = x.view();
    edit(w, t);
    return amx_i8_unsupported_reason(w, t);
  };
  CHECK(reason([](AmxI8Weight& w, AmxI8Tokens&) { w.bits = 2; }).find("expert_weight_bits 2") != std::string::npos);
  for (int64_t bs : {8, 48, 96, 131072, 0}) {
    const std::string r = reason([&](AmxI8Weight& w, AmxI8Tokens& t) { w.block = bs; t.block = bs; });
    CHECK_MSG(r.find("block_size " + std::to_string(bs)) != std::string::npos, r);
  }
  CHECK(reason([](AmxI8Weight& w, AmxI8Tokens& t) { w.K = 96; t.K = 96; }).find("multiple of block_size") !=
        std::string::npos);
  CHECK(reason([](AmxI8Weight&, AmxI8Tokens& t) { t.K = 64; }).find("do not match") != std::string::npos);
  CHECK(!reason([](AmxI8Weight& w, AmxI8Tokens&) { w.scales = nullptr; }).empty());
  CHECK(!reason([](AmxI8Weight&, AmxI8Tokens& t) { t.sum = nullptr; }).empty());
}

TEST(real_amx_qmoe_i8_matches_emulator_where_available) {
  const std::string why = amx_int8_unavailable_reason();
  if (!why.empty()) {
    std::printf("    skipped: %s\n", why.c_str());
    return;
  }
  auto& g = ht::rng();
  for (int bits : {4, 8})
    for (int64_t block : {16, 32, 64, 256})
      for (int64_t M : {1, 5, 16, 17, 32, 33}) {
        const int64_t N = 45, K = block * 2;
        const QW w = make_weight(g, bits, N, K, block);
        const QT x = make_tokens(g, M, K, block);
        std::vector<float> ye(size_t(M * N)), ya(size_t(M * N));
        amx_qmoe_i8_block_emu(w.view(true), x.view(), 0, N, ye.data(), N);
        amx_qmoe_i8_block_amx(w.view(true), x.view(), 0, N, ya.data(), N);
        // Same int32 sums, same float epilogue code: bit-identical but for FMA contraction.
        double err = 0, scale = 1e-30;
        for (size_t i = 0; i < ye.size(); ++i) {
          err = std::max(err, std::fabs(double(ye[i]) - double(ya[i])));
          scale = std::max(scale, std::fabs(double(ye[i])));
        }
        CHECK_MSG(err <= 1e-5 * scale, case_name(bits, N, K, block, M, true));
        check_block(amx_qmoe_i8_block_amx, w, x, true, 3, N, "real " + case_name(bits, N, K, block, M, true));
      }
}
