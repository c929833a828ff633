// TileOps policy over the software emulator: the same calls the real
// policy makes, checked and executed by TileEmulator.
#pragma once

#include <cstdint>

#include "tile_emulator.h"
#include "tile_ops.h"

namespace hinamoe {
namespace amx {

class EmuTileOps {
 public:
  explicit EmuTileOps(TileEmulator& emu) : emu_(emu) {}

  void configure(const TileConfig& c) { emu_.ldtilecfg(&c); }
  template <int T> void zero() { emu_.tilezero(T); }
  template <int T> void load(const void* p, int64_t stride) { emu_.tileloadd(T, p, stride); }
  template <int T> void stream_load(const void* p, int64_t stride) { emu_.tileloaddt1(T, p, stride); }
  template <int D, int A, int B> void dp_bf16() { emu_.tdpbf16ps(D, A, B); }
  template <int D, int A, int B> void dp_ssd() { emu_.tdpbssd(D, A, B); }
  template <int D, int A, int B> void dp_sud() { emu_.tdpbsud(D, A, B); }
  template <int D, int A, int B> void dp_usd() { emu_.tdpbusd(D, A, B); }
  template <int D, int A, int B> void dp_uud() { emu_.tdpbuud(D, A, B); }
  template <int T> void store(void* p, int64_t stride) { emu_.tilestored(T, p, stride); }
  void staged(const void*) {}  // the emulator reads memory through ordinary C++ calls
  void release() { emu_.tilerelease(); }

  TileEmulator& emulator() { return emu_; }

 private:
  TileEmulator& emu_;
};

}  // namespace amx
}  // namespace hinamoe
