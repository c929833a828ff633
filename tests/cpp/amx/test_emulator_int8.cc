// The tile emulator's int8 dot products (TDPBSSD, TDPBSUD, TDPBUSD,
// TDPBUUD) against a scalar model written from the SDM pseudocode, their
// operand errors, and (where the CPU has AMX-INT8) real tiles against the
// emulator.
#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "../test_util.h"
#include "amx/amx_detect.h"
#include "amx/tile_emulator.h"
#include "amx/tile_ops_amx.h"

using hinamoe::amx::TileConfig;
using hinamoe::amx::TileEmulator;
using hinamoe::amx::TileError;

namespace {

struct Variant {
  const char* name;
  bool a_signed, b_signed;
  void (TileEmulator::*op)(int, int, int);
};
const Variant kVariants[] = {{"tdpbssd", true, true, &TileEmulator::tdpbssd},
                             {"tdpbsud", true, false, &TileEmulator::tdpbsud},
                             {"tdpbusd", false, true, &TileEmulator::tdpbusd},
                             {"tdpbuud", false, false, &TileEmulator::tdpbuud}};

// ---- scalar SDM model (independent of the emulator's code) ----
// DPBD: c + the four byte products; the int32 add wraps, which is addition
// modulo 2^32: sum exactly in int64, keep the low 32 bits.
void sdm_tdpb(uint8_t C[16][64], const uint8_t A[16][64], const uint8_t B[16][64], int rows, int kd, int nc,
              bool as, bool bs) {
  for (int m = 0; m < rows; ++m) {
    uint32_t row[16] = {};
    for (int n = 0; n < nc; ++n) {
      int32_t c;
      std::memcpy(&c, &C[m][4 * n], 4);
      int64_t acc = c;
      for (int k = 0; k < kd; ++k)
        for (int i = 0; i < 4; ++i) {
          const int64_t a = as ? int64_t(int8_t(A[m][4 * k + i])) : int64_t(A[m][4 * k + i]);
          const int64_t b = bs ? int64_t(int8_t(B[k][4 * n + i])) : int64_t(B[k][4 * n + i]);
          acc += a * b;
        }
      row[n] = uint32_t(uint64_t(acc) & 0xffffffffu);
    }
    std::memset(C[m], 0, 64);
    std::memcpy(C[m], row, size_t(nc) * 4);
  }
  for (int m = rows; m < 16; ++m) std::memset(C[m], 0, 64);
}

// Bytes biased to the extremes: 0x80 (-128 / 128), 0x7f, 0xff (-1 / 255), 0, 1.
uint8_t rand_byte(std::mt19937_64& g) {
  static const uint8_t ext[] = {0x80, 0x7f, 0xff, 0x00, 0x01, 0x81, 0xfe};
  const uint32_t r = uint32_t(g());
  return r % 3 == 0 ? ext[(r >> 8) % 7] : uint8_t(r >> 16);
}

int32_t rand_acc(std::mt19937_64& g) {
  const uint32_t r = uint32_t(g());
  switch (r % 4) {
    case 0: return int32_t(0x7fffffffu - (r >> 12) % 5000000);  // near INT32_MAX: adds wrap
    case 1: return int32_t(0x80000000u + (r >> 12) % 5000000);  // near INT32_MIN: subtractions wrap
    default: return int32_t(uint32_t(g()));
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

std::string shape_name(const char* v, int rows, int kd, int nc) {
  return std::string(v) + " " + std::to_string(rows) + "x" + std::to_string(kd) + "x" + std::to_string(nc);
}

}  // namespace

TEST(emu_int8_dot_products_match_sdm_model) {
  auto& g = ht::rng();
  std::vector<std::array<int, 3>> shapes;  // rows, k dwords, n
  for (int v = 1; v <= 16; ++v) {
    shapes.push_back({v, int(1 + g() % 16), int(1 + g() % 16)});
    shapes.push_back({int(1 + g() % 16), v, int(1 + g() % 16)});
    shapes.push_back({int(1 + g() % 16), int(1 + g() % 16), v});
  }
  shapes.push_back({1, 1, 1});
  shapes.push_back({16, 16, 16});
  for (int i = 0; i < 20; ++i) shapes.push_back({int(1 + g() % 16), int(1 + g() % 16), int(1 + g() % 16)});
  int wrapped = 0;
  for (const Variant& v : kVariants) {
    for (auto& s : shapes) {
      const int rows = s[0], kd = s[1], nc = s[2];
      int t[8] = {0, 1, 2, 3, 4, 5, 6, 7};
      std::shuffle(t, t + 8, g);
      const int d = t[0], a = t[1], b = t[2];
      TileEmulator e;
      const TileConfig c = cfg_with({{d, rows, 4 * nc}, {a, rows, 4 * kd}, {b, kd, 4 * nc}});
      e.ldtilecfg(&c);
      alignas(64) uint8_t A[16][64], B[16][64], C[16][64];
      for (int i = 0; i < 1024; ++i) {
        (&A[0][0])[i] = rand_byte(g);
        (&B[0][0])[i] = rand_byte(g);
      }
      for (int i = 0; i < 256; ++i) {
        const int32_t x = rand_acc(g);
        std::memcpy(&C[0][0] + 4 * i, &x, 4);
      }
      e.tileloadd(a, A, 64);
      e.tileloadd(b, B, 64);
      e.tileloadd(d, C, 64);
      uint8_t Am[16][64], Bm[16][64], Cm[16][64];
      std::memcpy(Am, e.reg(a), 1024);  // the model sees what the registers hold
      std::memcpy(Bm, e.reg(b), 1024);
      std::memcpy(Cm, e.reg(d), 1024);
      for (int rep = 0; rep < 3; ++rep) {  // dst feeds back
        uint8_t before[16][64];
        std::memcpy(before, Cm, 1024);
        (e.*v.op)(d, a, b);
        sdm_tdpb(Cm, Am, Bm, rows, kd, nc, v.a_signed, v.b_signed);
        for (int m = 0; m < rows; ++m)
          for (int n = 0; n < nc; ++n) {  // count results that crossed the int32 range
            int32_t x0, x1;
            std::memcpy(&x0, &before[m][4 * n], 4);
            std::memcpy(&x1, &Cm[m][4 * n], 4);
            wrapped += (x0 > (1 << 30) && x1 < -(1 << 30)) || (x0 < -(1 << 30) && x1 > (1 << 30));
          }
      }
      CHECK_MSG(reg_equals(e, d, Cm), shape_name(v.name, rows, kd, nc));
      CHECK(reg_equals(e, a, Am));  // sources untouched
      CHECK(reg_equals(e, b, Bm));
    }
  }
  CHECK(wrapped > 0);  // the data did exercise the wrap-around
}

TEST(emu_int8_extremes_and_wrap_by_hand) {
  TileEmulator e;
  const TileConfig c = cfg_with({{0, 1, 4}, {1, 1, 64}, {2, 16, 4}});
  e.ldtilecfg(&c);
  auto run = [&](void (TileEmulator::*op)(int, int, int), uint8_t a, uint8_t b, int32_t acc) {
    uint8_t A[64], B[64];
    std::memset(A, a, 64);
    std::memset(B, b, 64);
    e.tileloadd(1, A, 64);
    e.tileloadd(2, B, 4);
    e.tileloadd(0, &acc, 4);
    (e.*op)(0, 1, 2);
    int32_t r;
    std::memcpy(&r, e.reg(0), 4);
    return r;
  };
  // 64 products per output (16 dwords x 4 bytes).
  CHECK(run(&TileEmulator::tdpbssd, 0x80, 0x80, 0) == 64 * 16384);       // -128 * -128
  CHECK(run(&TileEmulator::tdpbssd, 0x80, 0x7f, 0) == -64 * 16256);      // -128 * 127
  CHECK(run(&TileEmulator::tdpbsud, 0x80, 0xff, 0) == -64 * 32640);      // -128 * 255
  CHECK(run(&TileEmulator::tdpbusd, 0xff, 0x80, 0) == -64 * 32640);      // 255 * -128
  CHECK(run(&TileEmulator::tdpbuud, 0xff, 0xff, 0) == 64 * 65025);       // 255 * 255
  CHECK(run(&TileEmulator::tdpbssd, 0xff, 0xff, 5) == 5 + 64);           // -1 * -1
  // INT32_MAX + 64*65025 wraps to INT32_MIN + 64*65025 - 1 (no saturation).
  CHECK(run(&TileEmulator::tdpbuud, 0xff, 0xff, 0x7fffffff) == int32_t(0x80000000u + 64u * 65025u - 1u));
  // INT32_MIN - 64*32640 wraps to the positive side.
  CHECK(run(&TileEmulator::tdpbusd, 0xff, 0x80, int32_t(0x80000000u)) ==
        int32_t(0x80000000u - 64u * 32640u));
}

TEST(emu_int8_operand_errors_raise) {
  for (const Variant& v : kVariants) {
    TileEmulator e;
    CHECK_THROWS((e.*v.op)(0, 1, 2), TileError);  // never configured
    const TileConfig c = cfg_with({{0, 4, 16}, {1, 4, 8}, {2, 2, 16}, {4, 3, 16}, {5, 2, 12}, {6, 4, 12}});
    e.ldtilecfg(&c);
    CHECK_THROWS((e.*v.op)(3, 1, 2), TileError);  // unconfigured dst
    CHECK_THROWS((e.*v.op)(0, 7, 2), TileError);  // unconfigured a
    CHECK_THROWS((e.*v.op)(0, 1, 8), TileError);  // no such tile
    (e.*v.op)(0, 1, 2);                            // valid: 4x16B += 4x8B . 2x16B
    CHECK_THROWS((e.*v.op)(0, 0, 2), TileError);  // dst == a
    CHECK_THROWS((e.*v.op)(0, 1, 0), TileError);  // dst == b
    CHECK_THROWS((e.*v.op)(0, 2, 2), TileError);  // a == b
    CHECK_THROWS((e.*v.op)(4, 1, 2), TileError);  // dst.rows 3 != a.rows 4
    CHECK_THROWS((e.*v.op)(6, 1, 2), TileError);  // dst.colsb 12 != b.colsb 16
    CHECK_THROWS((e.*v.op)(0, 6, 2), TileError);  // a.colsb/4 = 3 != b.rows 2
    try {
      (e.*v.op)(4, 1, 2);
    } catch (const TileError& err) {
      CHECK_MSG(std::string(err.what()).find(v.name) == 0, err.what());  // names the instruction
    }
    e.tilerelease();
    CHECK_THROWS((e.*v.op)(0, 1, 2), TileError);
  }
}

namespace {

// One TDPB*D on real tiles: tmm0 (C) += tmm1 (A) . tmm2 (B), shapes of cfg.
__attribute__((target("amx-tile,amx-bf16,amx-int8"))) void real_tdpb(int variant, const TileConfig& cfg,
                                                                      const uint8_t* A, const uint8_t* B,
                                                                      uint8_t* C) {
  hinamoe::amx::AmxTileOps ops;
  ops.configure(cfg);
  ops.load<1>(A, 64);
  ops.load<2>(B, 64);
  ops.load<0>(C, 64);
  switch (variant) {
    case 0: ops.dp_ssd<0, 1, 2>(); break;
    case 1: ops.dp_sud<0, 1, 2>(); break;
    case 2: ops.dp_usd<0, 1, 2>(); break;
    default: ops.dp_uud<0, 1, 2>(); break;
  }
  ops.store<0>(C, 64);
  ops.release();
}

}  // namespace

TEST(real_amx_int8_matches_emulator_where_available) {
  const std::string why = hinamoe::amx_int8_unavailable_reason();
  if (!why.empty()) {
    std::printf("    skipped: %s\n", why.c_str());
    return;
  }
  auto& g = ht::rng();
  for (int vi = 0; vi < 4; ++vi) {
    for (int rep = 0; rep < 60; ++rep) {
      const int rows = int(1 + g() % 16), kd = int(1 + g() % 16), nc = int(1 + g() % 16);
      const TileConfig c = cfg_with({{0, rows, 4 * nc}, {1, rows, 4 * kd}, {2, kd, 4 * nc}});
      alignas(64) uint8_t A[16][64], B[16][64], C[16][64] = {}, Cr[16][64] = {};
      for (int i = 0; i < 1024; ++i) {
        (&A[0][0])[i] = rand_byte(g);
        (&B[0][0])[i] = rand_byte(g);
      }
      for (int i = 0; i < 256; ++i) {
        const int32_t x = rand_acc(g);
        std::memcpy(&C[0][0] + 4 * i, &x, 4);
      }
      std::memcpy(Cr, C, 1024);
      TileEmulator e;
      e.ldtilecfg(&c);
      e.tileloadd(1, A, 64);
      e.tileloadd(2, B, 64);
      e.tileloadd(0, C, 64);
      (e.*kVariants[vi].op)(0, 1, 2);
      real_tdpb(vi, c, &A[0][0], &B[0][0], &Cr[0][0]);
      bool same = true;
      for (int m = 0; m < rows; ++m) same &= std::memcmp(Cr[m], e.reg(0) + 64 * m, size_t(4 * nc)) == 0;
      CHECK_MSG(same, shape_name(kVariants[vi].name, rows, kd, nc));
    }
  }
}
