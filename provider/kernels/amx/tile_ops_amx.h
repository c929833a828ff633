// TileOps policy over the real AMX instructions (GCC intrinsics).
//
// Include this only inside a `#pragma GCC target("amx-tile,amx-bf16")`
// region (hina_microkernel_amx.cc): the methods are always_inline with that
// target, so a caller compiled without it fails to build rather than
// silently calling out of line. GCC 12 pitfalls handled here (DESIGN.md §5):
//  * tile numbers must be literal tokens: the template ints are expanded by
//    if-constexpr ladders into _tile_*(0..7, ...) with literals;
//  * _tile_loadconfig's "m" operand covers 8 bytes, so GCC may drop the
//    stores to rows/colsb: we issue ldtilecfg on the whole 64-byte struct;
//  * tile loads pass the address in a register with no memory operand:
//    staged() is a compiler barrier that publishes scalar writes first.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "tile_ops.h"

#define HINA_AMX_FN __attribute__((always_inline, target("amx-tile,amx-bf16"))) inline
// The int8 dot products need AMX-INT8 on top: only translation units whose
// pragma also names amx-int8 (qmoe_i8_amx.cc) may call them.
#define HINA_AMX_I8_FN __attribute__((always_inline, target("amx-tile,amx-int8"))) inline

// Expands F(0) .. F(7) as a sequence of `if constexpr` statements.
#define HINA_AMX_LADDER8(F) F(0) F(1) F(2) F(3) F(4) F(5) F(6) F(7)

namespace hinamoe {
namespace amx {

struct AmxTileOps {
  HINA_AMX_FN void configure(const TileConfig& c) {
    asm volatile("" : : "m"(c) : "memory");           // materialise every byte of c
    asm volatile("ldtilecfg %0" : : "m"(c) : "memory");  // 64-byte operand, not 8
  }

  template <int T>
  HINA_AMX_FN void zero() {
    static_assert(T >= 0 && T < 8, "tile number");
#define HINA_Z(t) if constexpr (T == t) _tile_zero(t);
    HINA_AMX_LADDER8(HINA_Z)
#undef HINA_Z
  }

  template <int T>
  HINA_AMX_FN void load(const void* p, int64_t stride) {
    static_assert(T >= 0 && T < 8, "tile number");
#define HINA_L(t) if constexpr (T == t) _tile_loadd(t, p, stride);
    HINA_AMX_LADDER8(HINA_L)
#undef HINA_L
  }

  template <int T>
  HINA_AMX_FN void stream_load(const void* p, int64_t stride) {
    static_assert(T >= 0 && T < 8, "tile number");
#define HINA_S(t) if constexpr (T == t) _tile_stream_loadd(t, p, stride);
    HINA_AMX_LADDER8(HINA_S)
#undef HINA_S
  }

  template <int T>
  HINA_AMX_FN void store(void* p, int64_t stride) {
    static_assert(T >= 0 && T < 8, "tile number");
#define HINA_ST(t) if constexpr (T == t) _tile_stored(t, p, stride);
    HINA_AMX_LADDER8(HINA_ST)
#undef HINA_ST
  }

  // TDPBF16PS tmmD, tmmA, tmmB: a flat ladder over all 8^3 triples (only the
  // matching one survives `if constexpr`); distinctness is checked up front.
  template <int D, int A, int B>
  HINA_AMX_FN void dp_bf16() {
    static_assert(D >= 0 && D < 8 && A >= 0 && A < 8 && B >= 0 && B < 8, "tile number");
    static_assert(D != A && D != B && A != B, "TDPBF16PS operands must be distinct tiles");
#define HINA_DB(d, a, b) if constexpr (D == d && A == a && B == b) _tile_dpbf16ps(d, a, b);
#define HINA_DA(d, a) HINA_DB(d, a, 0) HINA_DB(d, a, 1) HINA_DB(d, a, 2) HINA_DB(d, a, 3) \
                      HINA_DB(d, a, 4) HINA_DB(d, a, 5) HINA_DB(d, a, 6) HINA_DB(d, a, 7)
#define HINA_DD(d) HINA_DA(d, 0) HINA_DA(d, 1) HINA_DA(d, 2) HINA_DA(d, 3) \
                   HINA_DA(d, 4) HINA_DA(d, 5) HINA_DA(d, 6) HINA_DA(d, 7)
    HINA_AMX_LADDER8(HINA_DD)
#undef HINA_DD
#undef HINA_DA
#undef HINA_DB
  }

  // TDPB[SU][SU]D tmmD, tmmA, tmmB (first letter: A's bytes, second: B's).
#define HINA_I8_DB(insn, d, a, b) if constexpr (D == d && A == a && B == b) insn(d, a, b);
#define HINA_I8_DA(insn, d, a) HINA_I8_DB(insn, d, a, 0) HINA_I8_DB(insn, d, a, 1) HINA_I8_DB(insn, d, a, 2) \
    HINA_I8_DB(insn, d, a, 3) HINA_I8_DB(insn, d, a, 4) HINA_I8_DB(insn, d, a, 5) HINA_I8_DB(insn, d, a, 6) \
    HINA_I8_DB(insn, d, a, 7)
#define HINA_I8_DD(insn, d) HINA_I8_DA(insn, d, 0) HINA_I8_DA(insn, d, 1) HINA_I8_DA(insn, d, 2) \
    HINA_I8_DA(insn, d, 3) HINA_I8_DA(insn, d, 4) HINA_I8_DA(insn, d, 5) HINA_I8_DA(insn, d, 6) HINA_I8_DA(insn, d, 7)
#define HINA_I8_ALL(insn) HINA_I8_DD(insn, 0) HINA_I8_DD(insn, 1) HINA_I8_DD(insn, 2) HINA_I8_DD(insn, 3) \
    HINA_I8_DD(insn, 4) HINA_I8_DD(insn, 5) HINA_I8_DD(insn, 6) HINA_I8_DD(insn, 7)
#define HINA_I8_METHOD(name, insn)                                                             \
  template <int D, int A, int B>                                                               \
  HINA_AMX_I8_FN void name() {                                                                 \
    static_assert(D >= 0 && D < 8 && A >= 0 && A < 8 && B >= 0 && B < 8, "tile number");       \
    static_assert(D != A && D != B && A != B, #insn " operands must be distinct tiles");        \
    HINA_I8_ALL(insn)                                                                          \
  }
  HINA_I8_METHOD(dp_ssd, _tile_dpbssd)
  HINA_I8_METHOD(dp_sud, _tile_dpbsud)
  HINA_I8_METHOD(dp_usd, _tile_dpbusd)
  HINA_I8_METHOD(dp_uud, _tile_dpbuud)
#undef HINA_I8_METHOD
#undef HINA_I8_ALL
#undef HINA_I8_DD
#undef HINA_I8_DA
#undef HINA_I8_DB

  HINA_AMX_FN void staged(const void* p) { asm volatile("" : : "r"(p) : "memory"); }
  HINA_AMX_FN void release() { _tile_release(); }
};

}  // namespace amx
}  // namespace hinamoe
