// A software model of the eight AMX tile registers (palette 1) and of the
// instructions the HiNa kernels use (bf16 and int8 dot products). It checks what the hardware checks
// (#GP on LDTILECFG, #UD on bad operands) and raises TileError instead, so a
// kernel bug shows up as an exception on machines without AMX.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "tile_ops.h"

namespace hinamoe {
namespace amx {

// Raised for anything real hardware would fault on (or that we treat as a
// kernel bug: using a tile the configuration left out).
class TileError : public std::runtime_error {
 public:
  explicit TileError(const std::string& what) : std::runtime_error(what) {}
};

class TileEmulator {
 public:
  TileEmulator();

  // LDTILECFG. palette_id 0 returns to the init state; palette 1 is checked
  // (start_row 0, reserved bytes 0, rows <= 16, colsb <= 64, colsb % 4 == 0,
  // rows and colsb both zero or both non-zero, entries 8..15 zero) and then
  // every tile register is zeroed. On error nothing changes.
  void ldtilecfg(const void* mem64);
  void sttilecfg(void* mem64) const;  // palette-0 image when unconfigured
  void tilerelease();                 // init state: unconfigured, all zero

  void tilezero(int t);
  // Rows [0, rows) read colsb bytes from base + r*stride; every byte of the
  // register past rows/colsb becomes zero.
  void tileloadd(int t, const void* base, int64_t stride);
  void tileloaddt1(int t, const void* base, int64_t stride);  // same data semantics (a cache hint)
  void tilestored(int t, void* base, int64_t stride) const;   // writes rows x colsb bytes only
  // dst[m][n] += sum over k of a[m] bf16 pair k . b[k] bf16 pair n, in the
  // SDM's order (two fp32 partial sums per output, then one add into dst);
  // DAZ on inputs, FTZ on outputs, RNE, MXCSR ignored. A NaN result is the
  // default NaN 0xFFC00000 (payload/sign propagation is not modelled).
  void tdpbf16ps(int dst, int a, int b);
  // dst[m][n] += sum over k of the four byte products a[m] dword k x b[k]
  // dword n (each byte sign- or zero-extended as the mnemonic says: first
  // letter a, second b; S signed, U unsigned), int32 adds wrapping around
  // as the SDM's DPBD does (no saturation). Same operand checks as tdpbf16ps.
  void tdpbssd(int dst, int a, int b) { tdp_int8(dst, a, b, true, true, "tdpbssd"); }
  void tdpbsud(int dst, int a, int b) { tdp_int8(dst, a, b, true, false, "tdpbsud"); }
  void tdpbusd(int dst, int a, int b) { tdp_int8(dst, a, b, false, true, "tdpbusd"); }
  void tdpbuud(int dst, int a, int b) { tdp_int8(dst, a, b, false, false, "tdpbuud"); }

  bool configured() const { return configured_; }
  int rows(int t) const { return rows_[t]; }
  int colsb(int t) const { return colsb_[t]; }
  // The whole 1 KiB register image of tile t (for tests).
  const uint8_t* reg(int t) const { return &reg_[t][0][0]; }

 private:
  void need_tile(int t, const char* insn) const;
  // The #UD checks every TDP* instruction shares (distinct tiles, shapes).
  void check_dot_operands(int dst, int a, int b, const char* insn) const;
  void tdp_int8(int dst, int a, int b, bool a_signed, bool b_signed, const char* insn);

  bool configured_ = false;
  uint8_t rows_[kNumTiles] = {};
  uint16_t colsb_[kNumTiles] = {};
  alignas(64) uint8_t reg_[kNumTiles][kMaxRows][kMaxColsb];
};

}  // namespace amx
}  // namespace hinamoe
