// The AMX-INT8 path of QMoE (paper §8.1: symmetric group-wise int8), as
// plain entry points over one expert weight block.
//
// Per expert with M routed tokens the caller
//   1. quantises the tokens per block of K into int8, straight into the
//      VNNI B layout (amx_i8_gather_tokens), or re-lays int8 tokens it has
//      already quantised row-major (amx_i8_tokens_to_vnni);
//   2. calls amx_qmoe_i8_block_* on ranges [n0, n1) of output rows:
//        y[m*ldy + (n - n0)] = sum over blocks b of
//            scale_w[n][b] * scale_x[m][b] * sum_{k in b} (code[n][k] - zp[n][b]) * q[m][k]
//      in exact int32 per block, then float.
// The weights are QMoE's packed codes [N, K*bits/8] read where they lie as
// the A operand: 8-bit codes are uint8, so TDPBUSD (uint8 weights x int8
// tokens) and the zero point comes off afterwards as zp * sum_k q[m][k] (a
// per-token, per-block sum the gather precomputes); 4-bit codes are widened
// to bytes into a 2 KiB staging buffer per k-step (tiles cannot read
// nibbles). The tile k-step is min(64, block) bytes, so each TDPBUSD stays
// inside one block (block 16 / 32: colsb 16 / 32).
//
// The outputs are the plain projections (no bias, activation or routing
// weight): the caller's QMoE epilogue applies them (the bf16 kernel's fused
// gate/up epilogue would have to requantise the activations per block of I,
// which needs whole blocks of j: left to the caller).
//
// *_emu run through the software tile emulator (any x86-64 CPU; slow;
// amx::TileError on a tile misuse). *_amx run real AMX-INT8 and may only be
// called after amx_int8_unavailable_reason() returned "".
#pragma once

#include <cstdint>
#include <string>

#include "../dtype.h"

namespace hinamoe {

// One expert weight in QMoE's layout, scales already in float.
struct AmxI8Weight {
  const uint8_t* codes = nullptr;        // [N, K*bits/8]; 4-bit: element 2i in the low nibble of byte i
  const float* scales = nullptr;         // [N, K/block]
  const uint8_t* zero_points = nullptr;  // null: 2^(bits-1); else ORT's block-wise packing
                                         // [N, ceil(nb/pack)], block b of row n in byte
                                         // n*ceil(nb/pack) + b/pack at bit (b%pack)*bits, pack = 8/bits
  int bits = 4;                          // 4 or 8
  int64_t N = 0, K = 0, block = 0;       // block: a power of two in [16, 65536]; K % block == 0
  int64_t code_ld = 0;                   // bytes from row n's codes to row n+1's (0: K*bits/8)
  int64_t zp_ld = 0;                     // the same for zero points (0: ceil(nb/pack))
};

// Tokens quantised per block of K: element (k, m) of q at vnni_i8_index(k, m, M).
struct AmxI8Tokens {
  const int8_t* q = nullptr;      // K*M bytes, VNNI B layout
  const float* scale = nullptr;   // [M, K/block]: x[m][k] ~ scale * q
  const int32_t* sum = nullptr;   // [M, K/block]: sum of the block's q
  int64_t M = 0, K = 0, block = 0;
};

// VNNI int8 layout: 4 consecutive k of one token in one dword.
inline int64_t vnni_i8_index(int64_t k, int64_t m, int64_t M) { return (k / 4) * (4 * M) + 4 * m + (k & 3); }

// "" when w and x fit these kernels (bits, block, K, shapes agree), else why not.
std::string amx_i8_unsupported_reason(const AmxI8Weight& w, const AmxI8Tokens& x);

// Quantises rows[0..M) (rows == nullptr: rows 0..M-1) of x [*, K] (f32, f16
// or bf16, row stride K) symmetrically per block: scale = amax / 127,
// q = round-to-nearest-even(v * 127 / amax) in [-127, 127] (all zero and
// scale 0 for an all-zero block; a block holding a NaN or inf gets scale NaN
// and q 0, so its outputs are NaN, not garbage). Writes q (K*M bytes, VNNI),
// scale and sum ([M, K/block]). K must be a multiple of block (>= 4, and a
// multiple of 4).
void amx_i8_gather_tokens(const void* x, DType dtype, int64_t K, const int32_t* rows, int64_t M, int64_t block,
                          int8_t* q, float* scale, int32_t* sum);

// Re-lays int8 tokens quantised elsewhere, src[m*ld + k], into the VNNI
// layout (K a multiple of 4).
void amx_i8_tokens_to_vnni(const int8_t* src, int64_t ld, int64_t M, int64_t K, int8_t* q);

// y[m*ldy + (n - n0)] for n in [n0, n1), m < x.M, as in the header comment.
// Only those entries of y are written. Any M (blocks of 32 tokens); any n0,
// n1 in [0, w.N] (edge tiles of fewer rows). Inputs must pass
// amx_i8_unsupported_reason.
void amx_qmoe_i8_block_emu(const AmxI8Weight& w, const AmxI8Tokens& x, int64_t n0, int64_t n1, float* y,
                           int64_t ldy);
void amx_qmoe_i8_block_amx(const AmxI8Weight& w, const AmxI8Tokens& x, int64_t n0, int64_t n1, float* y,
                           int64_t ldy);

}  // namespace hinamoe
