// TileEmulator: the SDM pseudocode of LDTILECFG, TILELOADD(T1), TILESTORED,
// TILEZERO, TDPBF16PS and TDPB[SU][SU]D, executed in plain C++.
#include "tile_emulator.h"

#include <cmath>
#include <cstring>

namespace hinamoe {
namespace amx {
namespace {

float from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
uint32_t to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// Denormals become a zero of the same sign (DAZ on inputs, FTZ on results).
float flush(float x) {
  const uint32_t u = to_bits(x);
  if ((u & 0x7f800000u) == 0 && (u & 0x007fffffu) != 0) return from_bits(u & 0x80000000u);
  return x;
}

// Which NaN an operation returns is not something C++ pins down (the
// compiler may swap the operands of +), nor does the SDM say for
// TDPBF16PS: every NaN result becomes the x86 default NaN.
constexpr uint32_t kDefaultNaN = 0xffc00000u;

// make_fp32: a bf16 bit pattern in the upper half of a dword.
float make_fp32(uint16_t bf) { return from_bits(uint32_t(bf) << 16); }

std::string tile_name(int t) { return "tmm" + std::to_string(t); }

}  // namespace

TileEmulator::TileEmulator() { std::memset(reg_, 0, sizeof(reg_)); }

void TileEmulator::ldtilecfg(const void* mem64) {
  if (mem64 == nullptr) throw TileError("ldtilecfg: null memory operand");
  TileConfig c;
  std::memcpy(&c, mem64, sizeof(c));
  if (c.palette_id == 0) {  // the init state, as TILERELEASE
    tilerelease();
    return;
  }
  if (c.palette_id != 1)
    throw TileError("ldtilecfg: palette_id " + std::to_string(c.palette_id) + " is not supported (only 0 and 1)");
  if (c.start_row != 0)
    throw TileError("ldtilecfg: start_row must be 0 (got " + std::to_string(c.start_row) + ")");
  for (int i = 0; i < 14; ++i)
    if (c.reserved[i] != 0)
      throw TileError("ldtilecfg: reserved byte " + std::to_string(2 + i) + " is not zero");
  for (int t = 0; t < 16; ++t) {
    const int r = c.rows[t], cb = c.colsb[t];
    const std::string who = "ldtilecfg: tile " + std::to_string(t) + " (rows=" + std::to_string(r) +
                            ", colsb=" + std::to_string(cb) + "): ";
    if (t >= kNumTiles) {
      if (r != 0 || cb != 0) throw TileError(who + "palette 1 has 8 tiles; entries 8..15 must be zero");
      continue;
    }
    if (r == 0 && cb == 0) continue;  // left unconfigured
    if (r == 0 || cb == 0) throw TileError(who + "rows and colsb must both be zero or both non-zero");
    if (r > kMaxRows) throw TileError(who + "rows > 16");
    if (cb > kMaxColsb) throw TileError(who + "colsb > 64");
    if (cb % 4 != 0) throw TileError(who + "colsb is not a multiple of 4");
  }
  for (int t = 0; t < kNumTiles; ++t) {
    rows_[t] = c.rows[t];
    colsb_[t] = c.colsb[t];
  }
  configured_ = true;
  std::memset(reg_, 0, sizeof(reg_));
}

void TileEmulator::sttilecfg(void* mem64) const {
  TileConfig c = blank_palette1();
  if (configured_) {
    for (int t = 0; t < kNumTiles; ++t) set_tile(&c, t, rows_[t], colsb_[t]);
  } else {
    c.palette_id = 0;
  }
  std::memcpy(mem64, &c, sizeof(c));
}

void TileEmulator::tilerelease() {
  configured_ = false;
  std::memset(rows_, 0, sizeof(rows_));
  std::memset(colsb_, 0, sizeof(colsb_));
  std::memset(reg_, 0, sizeof(reg_));
}

void TileEmulator::need_tile(int t, const char* insn) const {
  if (!configured_) throw TileError(std::string(insn) + ": tiles are not configured (no ldtilecfg)");
  if (t < 0 || t >= kNumTiles) throw TileError(std::string(insn) + ": no tile register " + std::to_string(t));
  if (rows_[t] == 0) throw TileError(std::string(insn) + ": " + tile_name(t) + " is not configured");
}

void TileEmulator::tilezero(int t) {
  need_tile(t, "tilezero");
  std::memset(reg_[t], 0, kTileBytes);
}

void TileEmulator::tileloadd(int t, const void* base, int64_t stride) {
  need_tile(t, "tileloadd");
  if (base == nullptr) throw TileError("tileloadd: null base address");
  const uint8_t* p = static_cast<const uint8_t*>(base);
  std::memset(reg_[t], 0, kTileBytes);  // zero_upper_rows + write_row_and_zero
  for (int r = 0; r < rows_[t]; ++r) std::memcpy(reg_[t][r], p + r * stride, colsb_[t]);
}

void TileEmulator::tileloaddt1(int t, const void* base, int64_t stride) {
  need_tile(t, "tileloaddt1");
  tileloadd(t, base, stride);
}

void TileEmulator::tilestored(int t, void* base, int64_t stride) const {
  need_tile(t, "tilestored");
  if (base == nullptr) throw TileError("tilestored: null base address");
  uint8_t* p = static_cast<uint8_t*>(base);
  for (int r = 0; r < rows_[t]; ++r) std::memcpy(p + r * stride, reg_[t][r], colsb_[t]);
}

void TileEmulator::check_dot_operands(int dst, int a, int b, const char* insn) const {
  need_tile(dst, insn);
  need_tile(a, insn);
  need_tile(b, insn);
  const auto shape = [&](int t) {
    return tile_name(t) + "[" + std::to_string(rows_[t]) + "x" + std::to_string(colsb_[t]) + "B]";
  };
  const std::string who = insn;
  if (dst == a || dst == b || a == b)
    throw TileError(who + ": operands must be distinct tiles (" + tile_name(dst) + ", " + tile_name(a) + ", " +
                    tile_name(b) + ")");
  if (colsb_[dst] % 4 || colsb_[a] % 4 || colsb_[b] % 4) throw TileError(who + ": colsb not a multiple of 4");
  if (rows_[dst] != rows_[a])
    throw TileError(who + ": dst.rows != a.rows (" + shape(dst) + ", " + shape(a) + ")");
  if (colsb_[dst] != colsb_[b])
    throw TileError(who + ": dst.colsb != b.colsb (" + shape(dst) + ", " + shape(b) + ")");
  if (colsb_[a] / 4 != rows_[b])
    throw TileError(who + ": a.colsb/4 != b.rows (" + shape(a) + ", " + shape(b) + ")");
}

void TileEmulator::tdp_int8(int dst, int a, int b, bool a_signed, bool b_signed, const char* insn) {
  check_dot_operands(dst, a, b, insn);
  const auto ext = [](uint8_t v, bool sgn) { return sgn ? int32_t(int8_t(v)) : int32_t(v); };
  const int M = rows_[dst], K = colsb_[a] / 4, N = colsb_[dst] / 4;
  for (int m = 0; m < M; ++m) {
    uint32_t row[16] = {};
    for (int n = 0; n < N; ++n) std::memcpy(&row[n], reg_[dst][m] + 4 * n, 4);
    const uint8_t* arow = reg_[a][m];
    for (int k = 0; k < K; ++k) {
      const uint8_t* bk = reg_[b][k];
      for (int n = 0; n < N; ++n) {
        // DPBD: four products (each fits in int32), added modulo 2^32.
        uint32_t c = row[n];
        for (int i = 0; i < 4; ++i)
          c += uint32_t(ext(arow[4 * k + i], a_signed) * ext(bk[4 * n + i], b_signed));
        row[n] = c;
      }
    }
    std::memset(reg_[dst][m], 0, kMaxColsb);  // write_row_and_zero
    std::memcpy(reg_[dst][m], row, size_t(N) * 4);
  }
  for (int m = M; m < kMaxRows; ++m) std::memset(reg_[dst][m], 0, kMaxColsb);  // zero_upper_rows
}

void TileEmulator::tdpbf16ps(int dst, int a, int b) {
  check_dot_operands(dst, a, b, "tdpbf16ps");

  const int M = rows_[dst], K = colsb_[a] / 4, N = colsb_[dst] / 4;
  for (int m = 0; m < M; ++m) {
    float temp1[2 * 16] = {};
    const uint8_t* arow = reg_[a][m];
    for (int k = 0; k < K; ++k) {
      const uint8_t* brow = reg_[b][k];
      uint16_t a0, a1;
      std::memcpy(&a0, arow + 4 * k, 2);
      std::memcpy(&a1, arow + 4 * k + 2, 2);
      const float fa0 = flush(make_fp32(a0)), fa1 = flush(make_fp32(a1));
      for (int n = 0; n < N; ++n) {
        uint16_t b0, b1;
        std::memcpy(&b0, brow + 4 * n, 2);
        std::memcpy(&b1, brow + 4 * n + 2, 2);
        // One rounding per FMA (exact product), results flushed.
        temp1[2 * n] = flush(std::fma(fa0, flush(make_fp32(b0)), temp1[2 * n]));
        temp1[2 * n + 1] = flush(std::fma(fa1, flush(make_fp32(b1)), temp1[2 * n + 1]));
      }
    }
    float row[16] = {};
    for (int n = 0; n < N; ++n) {
      float acc;
      std::memcpy(&acc, reg_[dst][m] + 4 * n, 4);
      const float tmp = flush(temp1[2 * n] + temp1[2 * n + 1]);
      row[n] = flush(flush(acc) + tmp);
      if (std::isnan(row[n])) row[n] = from_bits(kDefaultNaN);
    }
    std::memset(reg_[dst][m], 0, kMaxColsb);  // write_row_and_zero
    std::memcpy(reg_[dst][m], row, size_t(N) * 4);
  }
  for (int m = M; m < kMaxRows; ++m) std::memset(reg_[dst][m], 0, kMaxColsb);  // zero_upper_rows
}

}  // namespace amx
}  // namespace hinamoe
