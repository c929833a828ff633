// Quantised weights on AMX-BF16 tiles (prefill): rows of 4/8-bit codes are
// dequantised, 32 rows at a time, into a bf16 panel that stays in L1/L2,
// and every token of the call is multiplied against that panel with the
// HiNa micro-kernel (tokens in the VNNI layout, amx_layout.h). The codes are
// read in place once per call; the dequantisation is shared by all tokens,
// so it pays from about 16 tokens on (docs/kernels.md).
//
// Numerics: w = (q - zp) * scale is rounded to bf16 (RNE), tokens too; the
// products accumulate in float32. The _emu and _amx instantiations give
// bit-identical results (same panel bytes, same tile arithmetic order).
#pragma once

#include <cstdint>

#include "../qmoe/qmoe_ffn.h"

namespace hinamoe {

// Y[m*ldy + (n - n0)] = sum_k bf16(w[n, k]) * xv(k, m), n in [n0, n1), m < M;
// xv: the M tokens in blocks of 32 (the last one shorter), block j at
// xv + 32*j*Kp a K x mt VNNI bf16 buffer, column k at VNNI row tile_slot(k)/2
// (amx::vnni_index with M = mt at tile_slot(k); K padded to Kp =
// round_up32(K) with zeros): every tile row of tokens is 128 bytes from the
// next, whatever M.
void qgemm_tiles_amx(const QWeight& w, int64_t n0, int64_t n1, const uint16_t* xv, int64_t M, float* Y,
                     int64_t ldy);
void qgemm_tiles_emu(const QWeight& w, int64_t n0, int64_t n1, const uint16_t* xv, int64_t M, float* Y,
                     int64_t ldy);

// Within every block of 32 columns both operands hold the even columns
// first, then the odd ones: the slot of column k. A dot product does not
// care about the order of its terms, and in this one the low nibbles of 16
// code bytes (the even elements) and their high nibbles fill a tile row
// without an interleave.
inline int64_t tile_slot(int64_t k) {
  const int64_t j = k & 31;
  return (k & ~int64_t(31)) + ((j & 1) ? 16 + (j >> 1) : (j >> 1));
}

// Rows [n, n + rows) of w dequantised as bf16 into a tile-major panel:
// element (r, k) at panel[(k/32)*1024 + r*32 + tile_slot(k)%32], zero for
// k in [K, Kp); Kp a multiple of 32, rows <= 32. The avx512 version (AVX512-BF16)
// writes the same bytes as the scalar one (NaN payloads and denormals,
// which the instruction flushes, aside).
void dequant_rows_bf16_ref(const QWeight& w, int64_t n, int rows, int64_t Kp, uint16_t* panel);
void dequant_rows_bf16_avx512(const QWeight& w, int64_t n, int rows, int64_t Kp, uint16_t* panel);

// Tokens into a VNNI block: rows[i] (i < n <= 16, float, k order) become
// bf16 at half tile_slot(k)%2 of dst[(tile_slot(k)/2)*ld + i], zero for k
// in [K, Kp). The avx512 version writes the same bytes (NaN payloads and
// denormals aside).
void vnni_rows16_ref(const float* const* rows, int n, int64_t K, int64_t Kp, uint32_t* dst, int64_t ld);
void vnni_rows16_avx512(const float* const* rows, int n, int64_t K, int64_t Kp, uint32_t* dst, int64_t ld);

// This thread's panel buffer of 32 rows x Kp bf16 (128 KiB at K = 2048: in L2).
uint16_t* tile_panel(int64_t Kp);

}  // namespace hinamoe
