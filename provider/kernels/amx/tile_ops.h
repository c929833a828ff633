// The tile-ops interface the HiNa micro-kernel is written against.
//
// One kernel source (hina_microkernel_impl.h; qmoe_i8_impl.h) is a template over a TileOps
// policy and is instantiated twice: with AmxTileOps (real instructions,
// tile_ops_amx.h) and with EmuTileOps (software registers, tile_ops_emu.h).
// A policy provides, with tile numbers as template arguments so the real one
// can expand them to the literal register names GCC's intrinsics need:
//
//   void configure(const TileConfig&);                // LDTILECFG (zeroes all tiles)
//   template <int T> void zero();                      // TILEZERO
//   template <int T> void load(const void*, int64_t stride_bytes);         // TILELOADD
//   template <int T> void stream_load(const void*, int64_t stride_bytes);  // TILELOADDT1
//   template <int D, int A, int B> void dp_bf16();     // TDPBF16PS tmmD, tmmA, tmmB
//   template <int D, int A, int B> void dp_ssd();      // TDPBSSD (and dp_sud, dp_usd, dp_uud:
//                                                      // TDPBSUD, TDPBUSD, TDPBUUD; AMX-INT8)
//   template <int T> void store(void*, int64_t stride_bytes) ;             // TILESTORED
//   void staged(const void* p);   // compiler barrier: scalar writes to p are visible to tile loads
//   void release();               // TILERELEASE
#pragma once

#include <cstdint>
#include <cstring>

namespace hinamoe {
namespace amx {

constexpr int kNumTiles = 8;       // tmm0..tmm7
constexpr int kMaxRows = 16;       // palette 1
constexpr int kMaxColsb = 64;      // bytes per tile row, palette 1
constexpr int kTileBytes = kMaxRows * kMaxColsb;

// The 64-byte LDTILECFG memory operand (SDM layout). Entries 8..15 are
// reserved for palette 1 and must stay zero.
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG operand is 64 bytes");

inline TileConfig blank_palette1() {
  TileConfig c;
  std::memset(&c, 0, sizeof(c));
  c.palette_id = 1;
  return c;
}

inline void set_tile(TileConfig* c, int t, int rows, int colsb) {
  c->rows[t] = static_cast<uint8_t>(rows);
  c->colsb[t] = static_cast<uint16_t>(colsb);
}

}  // namespace amx
}  // namespace hinamoe
