// The tile emulator against a scalar model written from the SDM pseudocode,
// and every configuration / operand error it must raise.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "../test_util.h"
#include "amx/tile_emulator.h"

using hinamoe::amx::TileConfig;
using hinamoe::amx::TileEmulator;
using hinamoe::amx::TileError;

namespace {

// ---- scalar SDM model (independent of the emulator's code) ----

float f32(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
uint32_t u32(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
// DAZ/FTZ: a value with a zero exponent field keeps only its sign.
float daz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
float make_fp32(uint16_t x) { return f32(uint32_t(x) << 16); }

// TDPBF16PS on byte images: C (rows x nc fp32, ld 64 bytes), A (rows x kp
// dword pairs), B (kp rows x nc dword pairs). Mirrors the SDM loop nest.
void sdm_tdpbf16ps(uint8_t C[16][64], const uint8_t A[16][64], const uint8_t B[16][64], int rows, int kp, int nc) {
  for (int m = 0; m < rows; ++m) {
    std::vector<float> temp1(size_t(2 * nc), 0.0f);
    for (int k = 0; k < kp; ++k) {
      for (int n = 0; n < nc; ++n) {
        for (int h = 0; h < 2; ++h) {  // FP32 FMA, DAZ=FTZ=1, RNE
          uint16_t a, b;
          std::memcpy(&a, &A[m][4 * k + 2 * h], 2);
          std::memcpy(&b, &B[k][4 * n + 2 * h], 2);
          temp1[2 * n + h] = daz(std::fma(daz(make_fp32(a)), daz(make_fp32(b)), daz(temp1[2 * n + h])));
        }
      }
    }
    float row[16] = {};
    for (int n = 0; n < nc; ++n) {
      float c;
      std::memcpy(&c, &C[m][4 * n], 4);
      const float tmpf32 = daz(daz(temp1[2 * n]) + daz(temp1[2 * n + 1]));
      row[n] = daz(daz(c) + tmpf32);
      if (row[n] != row[n]) row[n] = f32(0xffc00000u);  // NaN results: the default NaN
    }
    std::memset(C[m], 0, 64);
    std::memcpy(C[m], row, size_t(nc) * 4);
  }
  for (int m = rows; m < 16; ++m) std::memset(C[m], 0, 64);
}

// Random bf16 with plenty of specials: denormals, zeros, infinities, NaNs
// (several payloads), huge and tiny magnitudes (overflow, FTZ of results).
uint16_t rand_bf16(std::mt19937_64& g) {
  const uint32_t r = uint32_t(g());
  const uint16_t sign = uint16_t((r >> 31) << 15);
  switch (r % 16) {
    case 0: return uint16_t(sign | (1 + (r >> 8) % 0x7f));                  // denormal
    case 1: return sign;                                                       // +-0
    case 2: return uint16_t(sign | 0x7f80);                                    // +-inf
    case 3: return uint16_t(sign | 0x7f80 | (1 + (r >> 8) % 0x7f));          // NaN (quiet or signalling)
    case 4: return uint16_t(sign | (((0xf0 + (r >> 8) % 15) << 7) | ((r >> 4) & 0x7f)));  // huge
    case 5: return uint16_t(sign | (((1 + (r >> 8) % 24) << 7) | ((r >> 4) & 0x7f)));     // tiny normal
    default: return uint16_t(sign | (((120 + (r >> 8) % 14) << 7) | ((r >> 4) & 0x7f)));  // ~[2^-7, 2^6)
  }
}

void fill_random(uint8_t* p, size_t n, std::mt19937_64& g, bool specials) {
  for (size_t i = 0; i + 1 < n; i += 2) {
    uint16_t v = specials ? rand_bf16(g) : uint16_t(g());
    std::memcpy(p + i, &v, 2);
  }
}

TileConfig cfg_with(std::initializer_list<std::array<int, 3>> tiles) {
  TileConfig c = hinamoe::amx::blank_palette1();
  for (auto& t : tiles) hinamoe::amx::set_tile(&c, t[0], t[1], t[2]);
  return c;
}

bool reg_equals(const TileEmulator& e, int t, const uint8_t img[16][64]) {
  return std::memcmp(e.reg(t), img, 1024) == 0;
}

}  // namespace

TEST(emu_load_store_every_shape) {
  auto& g = ht::rng();
  std::vector<uint8_t> mem(16 * 200 + 64);
  for (int rows = 1; rows <= 16; ++rows) {
    for (int colsb = 4; colsb <= 64; colsb += 4) {
      const int t = int(g() % 8);
      TileEmulator e;
      const TileConfig c = cfg_with({{t, rows, colsb}});
      e.ldtilecfg(&c);
      for (int pass = 0; pass < 2; ++pass) {
        const int64_t stride = pass == 0 ? colsb : 64 + int64_t(g() % 130);
        fill_random(mem.data(), mem.size(), g, false);
        if (pass) e.tileloaddt1(t, mem.data(), stride);
        else e.tileloadd(t, mem.data(), stride);
        uint8_t want[16][64] = {};
        for (int r = 0; r < rows; ++r) std::memcpy(want[r], mem.data() + r * stride, colsb);
        CHECK_MSG(reg_equals(e, t, want), "load rows=" + std::to_string(rows) + " colsb=" + std::to_string(colsb));
        // Store writes exactly rows x colsb bytes.
        std::vector<uint8_t> out(16 * 200 + 64, 0xA5);
        e.tilestored(t, out.data(), stride);
        bool ok = true;
        for (size_t i = 0; i < out.size(); ++i) {
          const int64_t r = int64_t(i) / stride, cb = int64_t(i) % stride;
          const bool inside = r < rows && cb < colsb;
          ok &= inside ? out[i] == mem[i] : out[i] == 0xA5;
        }
        CHECK_MSG(ok, "store rows=" + std::to_string(rows) + " colsb=" + std::to_string(colsb));
      }
      e.tilezero(t);
      uint8_t zero[16][64] = {};
      CHECK(reg_equals(e, t, zero));
    }
  }
}

TEST(emu_negative_stride_and_reload_zeroing) {
  auto& g = ht::rng();
  TileEmulator e;
  TileConfig c = cfg_with({{0, 16, 64}, {1, 5, 12}});
  e.ldtilecfg(&c);
  std::vector<uint8_t> mem(16 * 64);
  fill_random(mem.data(), mem.size(), g, false);
  e.tileloadd(1, mem.data() + 15 * 64, -64);  // rows walk backwards
  uint8_t want[16][64] = {};
  for (int r = 0; r < 5; ++r) std::memcpy(want[r], mem.data() + (15 - r) * 64, 12);
  CHECK(reg_equals(e, 1, want));
  // A TDPBF16PS result outside the shape never exists: ldtilecfg zeroes all.
  e.tileloadd(0, mem.data(), 64);
  e.ldtilecfg(&c);
  uint8_t zero[16][64] = {};
  CHECK(reg_equals(e, 0, zero));
  CHECK(reg_equals(e, 1, zero));
}

TEST(emu_tdpbf16ps_matches_sdm_model) {
  auto& g = ht::rng();
  // Every value of each dimension (others random), the corners, and random shapes.
  std::vector<std::array<int, 3>> shapes;  // rows, k pairs, n
  for (int v = 1; v <= 16; ++v) {
    shapes.push_back({v, int(1 + g() % 16), int(1 + g() % 16)});
    shapes.push_back({int(1 + g() % 16), v, int(1 + g() % 16)});
    shapes.push_back({int(1 + g() % 16), int(1 + g() % 16), v});
  }
  shapes.push_back({1, 1, 1});
  shapes.push_back({16, 16, 16});
  for (int i = 0; i < 40; ++i) shapes.push_back({int(1 + g() % 16), int(1 + g() % 16), int(1 + g() % 16)});
  int nan_outputs = 0, inf_outputs = 0, zero_outputs = 0;
  for (auto& s : shapes) {
    const int rows = s[0], kp = s[1], nc = s[2];
    int t[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    std::shuffle(t, t + 8, g);
    const int d = t[0], a = t[1], b = t[2];
    TileEmulator e;
    const TileConfig c = cfg_with({{d, rows, 4 * nc}, {a, rows, 4 * kp}, {b, kp, 4 * nc}});
    e.ldtilecfg(&c);
    const bool specials = g() % 4 != 0;  // some all-ordinary runs keep results finite
    alignas(64) uint8_t A[16][64] = {}, B[16][64] = {}, C[16][64] = {};
    fill_random(&A[0][0], 1024, g, specials);
    fill_random(&B[0][0], 1024, g, specials);
    for (int m = 0; m < 16; ++m)
      for (int n = 0; n < 16; ++n) {  // accumulator: fp32 incl. denormals and specials
        uint32_t v = uint32_t(g());
        if (g() % 8 == 0) v &= 0x807fffffu;  // denormal / zero
        std::memcpy(&C[m][4 * n], &v, 4);
      }
    e.tileloadd(a, A, 64);
    e.tileloadd(b, B, 64);
    e.tileloadd(d, C, 64);
    // The model sees exactly what the registers hold (zero past the shape).
    uint8_t Am[16][64], Bm[16][64], Cm[16][64];
    std::memcpy(Am, e.reg(a), 1024);
    std::memcpy(Bm, e.reg(b), 1024);
    std::memcpy(Cm, e.reg(d), 1024);
    for (int rep = 0; rep < 2; ++rep) {  // accumulate twice: dst feeds back
      e.tdpbf16ps(d, a, b);
      sdm_tdpbf16ps(Cm, Am, Bm, rows, kp, nc);
    }
    if (!reg_equals(e, d, Cm)) {
      for (int i = 0; i < 256; ++i) {
        uint32_t x, y;
        std::memcpy(&x, e.reg(d) + 4 * i, 4);
        std::memcpy(&y, &Cm[0][0] + 4 * i, 4);
        if (x != y) { std::printf("    first diff at row %d col %d: emu %08x model %08x\n", i / 16, i % 16, x, y); break; }
      }
    }
    CHECK_MSG(reg_equals(e, d, Cm), "shape " + std::to_string(rows) + "x" + std::to_string(kp) + "x" +
                                        std::to_string(nc) + " tiles " + std::to_string(d) + "," +
                                        std::to_string(a) + "," + std::to_string(b));
    CHECK(reg_equals(e, a, Am));  // sources untouched
    CHECK(reg_equals(e, b, Bm));
    for (int m = 0; m < rows; ++m)
      for (int n = 0; n < nc; ++n) {
        float v;
        std::memcpy(&v, &Cm[m][4 * n], 4);
        nan_outputs += std::isnan(v);
        inf_outputs += std::isinf(v);
        zero_outputs += v == 0.0f;
        CHECK(std::fpclassify(v) != FP_SUBNORMAL);  // FTZ
      }
  }
  CHECK(nan_outputs > 0);  // the data did exercise the specials
  CHECK(inf_outputs > 0);
}

TEST(emu_tdpbf16ps_daz_ftz_rne_cases) {
  TileEmulator e;
  const TileConfig c = cfg_with({{0, 1, 4}, {1, 1, 4}, {2, 1, 4}});
  e.ldtilecfg(&c);
  auto run = [&](uint16_t a0, uint16_t a1, uint16_t b0, uint16_t b1, float acc) {
    uint16_t A[2] = {a0, a1}, B[2] = {b0, b1};
    e.tileloadd(1, A, 4);
    e.tileloadd(2, B, 4);
    e.tileloadd(0, &acc, 4);
    e.tdpbf16ps(0, 1, 2);
    float r;
    std::memcpy(&r, e.reg(0), 4);
    return r;
  };
  // DAZ: a denormal input counts as zero (1*denormal + 0 -> 0, not denormal).
  CHECK(run(0x3f80, 0, 0x0001, 0, 0.0f) == 0.0f);
  // FTZ: 2^-100 * 2^-30 = 2^-130 is denormal in fp32 -> flushed to zero.
  CHECK(u32(run(0x0d80, 0, 0x30800000u >> 16, 0, 0.0f)) == 0);
  // A denormal accumulator reads as zero.
  CHECK(run(0x3f80, 0, 0x3f80, 0, f32(0x00000001)) == 1.0f);
  // RNE: 2^24 + 3 is a tie between 2^24+2 and 2^24+4; even wins.
  CHECK(run(0x4b80, 0x4040, 0x3f80, 0x3f80, 0.0f) == 16777220.0f);
  // inf * 0 -> NaN; inf + -inf -> NaN.
  CHECK(std::isnan(run(0x7f80, 0, 0, 0, 0.0f)));
  CHECK(std::isnan(run(0x7f80, 0xff80, 0x3f80, 0x3f80, 0.0f)));
}

TEST(emu_invalid_configs_raise) {
  TileEmulator e;
  const TileConfig good = cfg_with({{0, 16, 64}, {1, 2, 8}});
  e.ldtilecfg(&good);
  auto bad = [&](TileConfig c) {
    CHECK_THROWS(e.ldtilecfg(&c), ::hinamoe::amx::TileError);
    CHECK(e.configured() && e.rows(1) == 2 && e.colsb(1) == 8);  // unchanged on error
  };
  TileConfig c = good; c.palette_id = 2; bad(c);
  c = good; c.palette_id = 255; bad(c);
  c = good; c.start_row = 1; bad(c);
  for (int i = 0; i < 14; ++i) { c = good; c.reserved[i] = 1; bad(c); }
  c = good; c.rows[2] = 17; c.colsb[2] = 64; bad(c);
  c = good; c.rows[2] = 1; c.colsb[2] = 68; bad(c);
  for (int cb : {1, 2, 3, 6, 10, 62}) { c = good; c.rows[2] = 1; c.colsb[2] = uint16_t(cb); bad(c); }
  c = good; c.rows[2] = 0; c.colsb[2] = 4; bad(c);
  c = good; c.rows[2] = 4; c.colsb[2] = 0; bad(c);
  for (int t = 8; t < 16; ++t) {
    c = good; c.rows[t] = 1; bad(c);
    c = good; c.colsb[t] = 4; bad(c);
  }
  CHECK_THROWS(e.ldtilecfg(nullptr), ::hinamoe::amx::TileError);
  // palette 0 is the init state: everything unconfigured afterwards.
  TileConfig zero = good; zero.palette_id = 0;
  e.ldtilecfg(&zero);
  CHECK(!e.configured());
  CHECK_THROWS(e.tilezero(0), ::hinamoe::amx::TileError);
  // sttilecfg round-trips.
  e.ldtilecfg(&good);
  TileConfig back;
  e.sttilecfg(&back);
  CHECK(std::memcmp(&back, &good, 64) == 0);
}

TEST(emu_unconfigured_and_operand_errors_raise) {
  TileEmulator e;
  uint8_t buf[1024] = {};
  CHECK_THROWS(e.tilezero(0), ::hinamoe::amx::TileError);  // never configured
  CHECK_THROWS(e.tileloadd(0, buf, 64), ::hinamoe::amx::TileError);
  CHECK_THROWS(e.tdpbf16ps(0, 1, 2), ::hinamoe::amx::TileError);
  const TileConfig c = cfg_with({{0, 4, 16}, {1, 4, 8}, {2, 2, 16}, {4, 3, 16}, {5, 2, 12}, {6, 4, 12}});
  e.ldtilecfg(&c);
  CHECK_THROWS(e.tilezero(3), ::hinamoe::amx::TileError);  // tile 3 left unconfigured
  CHECK_THROWS(e.tileloadd(3, buf, 64), ::hinamoe::amx::TileError);
  CHECK_THROWS(e.tileloaddt1(7, buf, 64), ::hinamoe::amx::TileError);
  CHECK_THROWS(e.tilestored(3, buf, 64), ::hinamoe::amx::TileError);
  CHECK_THROWS(e.tilezero(8), ::hinamoe::amx::TileError);
  CHECK_THROWS(e.tilezero(-1), ::hinamoe::amx::TileError);
  CHECK_THROWS(e.tileloadd(0, nullptr, 64), ::hinamoe::amx::TileError);
  CHECK_THROWS(e.tdpbf16ps(3, 1, 2), ::hinamoe::amx::TileError);  // unconfigured dst
  e.tdpbf16ps(0, 1, 2);                    // valid: 4x16B += 4x8B . 2x16B
  CHECK_THROWS(e.tdpbf16ps(0, 0, 2), ::hinamoe::amx::TileError);  // dst == a
  CHECK_THROWS(e.tdpbf16ps(0, 1, 0), ::hinamoe::amx::TileError);  // dst == b
  CHECK_THROWS(e.tdpbf16ps(0, 2, 2), ::hinamoe::amx::TileError);  // a == b
  CHECK_THROWS(e.tdpbf16ps(4, 1, 2), ::hinamoe::amx::TileError);  // dst.rows 3 != a.rows 4
  CHECK_THROWS(e.tdpbf16ps(6, 1, 2), ::hinamoe::amx::TileError);  // dst.colsb 12 != b.colsb 16
  CHECK_THROWS(e.tdpbf16ps(0, 6, 2), ::hinamoe::amx::TileError);  // a.colsb/4 = 3 != b.rows 2
  e.tilerelease();
  CHECK_THROWS(e.tdpbf16ps(0, 1, 2), ::hinamoe::amx::TileError);
}
