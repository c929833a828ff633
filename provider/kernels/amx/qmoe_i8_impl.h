// The AMX-INT8 QMoE block kernel, written once over a TileOps policy
// (tile_ops.h) like the bf16 HiNa kernel, and instantiated for real tiles
// (qmoe_i8_amx.cc) and for the emulator (qmoe_i8_emu.cc).
//
// C^T = W * X^T per block of K: the codes W [N, K] are the A operand (tile
// rows = output rows, colsb = the k-step ks = min(64, block) bytes), the
// tokens the B operand in the int8 VNNI layout (ks/4 rows of 4-byte groups,
// up to 16 tokens per tile). Tiles as in Algorithm 1: tmm0-1 tokens, tmm2-3
// weights (rows n..n+15, n+16..n+31), tmm4-7 int32 accumulators. The int32
// accumulators of one block are stored, turned into float with the block's
// scales and zero point, added to a float block, and zeroed for the next.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "qmoe_i8.h"
#include "tile_ops.h"

namespace hinamoe {
namespace amx {

// Zero point of block b of row n (ORT's block-wise packing; see AmxI8Weight).
inline int32_t i8_zero_point(const AmxI8Weight& w, int64_t n, int64_t b) {
  if (w.zero_points == nullptr) return 1 << (w.bits - 1);
  const int64_t pack = 8 / w.bits, nb = w.K / w.block, per_row = w.zp_ld ? w.zp_ld : (nb + pack - 1) / pack;
  const uint8_t byte = w.zero_points[n * per_row + b / pack];
  return (byte >> ((b % pack) * w.bits)) & ((1 << w.bits) - 1);
}

template <class Ops>
class QI8MicroKernel {
 public:
  explicit QI8MicroKernel(Ops& ops) : ops_(ops) {}

  // out[r][c] (row stride 32) = the block sum of the header for weight row
  // n + r (r < rows <= 32) and token mb + c (c < mt <= 32).
  void run(const AmxI8Weight& w, const AmxI8Tokens& x, int64_t n, int rows, int64_t mb, int mt, float* out) {
    const int ra0 = std::min(rows, 16), ra1 = rows - ra0;
    const int mt0 = std::min(mt, 16), mt1 = mt - mt0;
    const int ks = int(std::min<int64_t>(64, w.block));
    reshape(ks, ra0, ra1, mt0, mt1);
    const bool w1 = ra1 > 0, t1 = mt1 > 0;
    const int64_t rb = w.code_ld ? w.code_ld : w.K * w.bits / 8, ldb = 4 * x.M, nb = w.K / w.block;
    const uint8_t* A0 = w.codes + n * rb;
    const uint8_t* A1 = w1 ? A0 + 16 * rb : A0;
    const int8_t* tb = x.q + 4 * mb;
    const bool stream = x.M <= 32;  // each code is used once: keep it out of the cache
    for (int r = 0; r < rows; ++r) std::fill(out + r * 32, out + r * 32 + mt, 0.0f);
    for (int64_t b = 0; b < nb; ++b) {
      zero_acc(w1, t1);
      for (int64_t k = b * w.block; k < (b + 1) * w.block; k += ks) {
        const int8_t* bk = tb + (k / 4) * ldb;
        ops_.template load<0>(bk, ldb);
        if (t1) ops_.template load<1>(bk + 64, ldb);
        if (w.bits == 8) {  // the codes where they lie
          load_w<2>(A0 + k, rb, stream);
          if (w1) load_w<3>(A1 + k, rb, stream);
        } else {
          widen4(A0, ra0, rb, k, ks, &stage_[0]);
          if (w1) widen4(A1, ra1, rb, k, ks, &stage_[16]);
          ops_.staged(stage_);
          ops_.template load<2>(stage_[0], 64);
          if (w1) ops_.template load<3>(stage_[16], 64);
        }
        ops_.template dp_usd<4, 2, 0>();
        if (t1) ops_.template dp_usd<5, 2, 1>();
        if (w1) ops_.template dp_usd<6, 3, 0>();
        if (w1 && t1) ops_.template dp_usd<7, 3, 1>();
      }
      constexpr int64_t ldc = 32 * 4;
      ops_.template store<4>(acc_[0], ldc);
      if (t1) ops_.template store<5>(&acc_[0][16], ldc);
      if (w1) ops_.template store<6>(acc_[16], ldc);
      if (w1 && t1) ops_.template store<7>(&acc_[16][16], ldc);
      for (int r = 0; r < rows; ++r) {
        const float sw = w.scales[(n + r) * nb + b];
        const int32_t zp = i8_zero_point(w, n + r, b);
        float* o = out + r * 32;
        for (int c = 0; c < mt; ++c) {
          const int64_t i = (mb + c) * nb + b;
          // The tile's int32 sum cannot wrap: |code * q| <= 255 * 128 and a
          // block has <= 65536 codes (2139095040 < 2^31); zp * sum needs int64.
          const int64_t dot = int64_t(acc_[r][c]) - int64_t(zp) * x.sum[i];
          o[c] += sw * x.scale[i] * float(dot);
        }
      }
    }
  }

 private:
  template <int T>
  void load_w(const uint8_t* p, int64_t stride, bool stream) {
    if (stream) ops_.template stream_load<T>(p, stride);
    else ops_.template load<T>(p, stride);
  }

  void zero_acc(bool w1, bool t1) {
    ops_.template zero<4>();
    if (t1) ops_.template zero<5>();
    if (w1) ops_.template zero<6>();
    if (w1 && t1) ops_.template zero<7>();
  }

  // Codes [k, k + ks) of `rows` 4-bit rows (stride rb bytes) as one byte
  // per code, in k order (element 2i is the low nibble of byte i). SSE2
  // (baseline x86-64): 16 packed bytes -> 32 codes in four instructions.
  static void widen4(const uint8_t* A, int rows, int64_t rb, int64_t k, int ks, uint8_t (*dst)[64]) {
#if defined(__SSE2__)
    const __m128i lo4 = _mm_set1_epi8(0x0f);
    for (int r = 0; r < rows; ++r) {
      const uint8_t* src = A + r * rb + k / 2;
      if (ks == 16) {  // 8 packed bytes
        const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src));
        const __m128i lo = _mm_and_si128(v, lo4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), lo4);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst[r]), _mm_unpacklo_epi8(lo, hi));
        continue;
      }
      for (int i = 0; i < ks / 2; i += 16) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
        const __m128i lo = _mm_and_si128(v, lo4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), lo4);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst[r] + 2 * i), _mm_unpacklo_epi8(lo, hi));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst[r] + 2 * i + 16), _mm_unpackhi_epi8(lo, hi));
      }
    }
#else
    for (int r = 0; r < rows; ++r) {
      const uint8_t* src = A + r * rb + k / 2;
      for (int i = 0; i < ks / 2; ++i) {
        dst[r][2 * i] = src[i] & 0x0f;
        dst[r][2 * i + 1] = src[i] >> 4;
      }
    }
#endif
  }

  // LDTILECFG only when the shape changes (it also zeroes the tiles).
  void reshape(int ks, int ra0, int ra1, int mt0, int mt1) {
    const int want[5] = {ks, ra0, ra1, mt0, mt1};
    if (have_ && std::memcmp(want, cur_, sizeof(want)) == 0) return;
    TileConfig c = blank_palette1();
    set_tile(&c, 0, ks / 4, 4 * mt0);
    if (mt1) set_tile(&c, 1, ks / 4, 4 * mt1);
    set_tile(&c, 2, ra0, ks);
    if (ra1) set_tile(&c, 3, ra1, ks);
    set_tile(&c, 4, ra0, 4 * mt0);
    if (mt1) set_tile(&c, 5, ra0, 4 * mt1);
    if (ra1) set_tile(&c, 6, ra1, 4 * mt0);
    if (ra1 && mt1) set_tile(&c, 7, ra1, 4 * mt1);
    ops_.configure(c);
    std::memcpy(cur_, want, sizeof(want));
    have_ = true;
  }

  Ops& ops_;
  bool have_ = false;
  int cur_[5] = {};
  alignas(64) uint8_t stage_[32][64];  // widened 4-bit codes of one k-step
  alignas(64) int32_t acc_[32][32];    // one block's int32 sums [row][token]
};

// y[m*ldy + (n - n0)] for n in [n0, n1), m < x.M: panels of 32 rows, 32
// tokens at a time (M > 32 re-reads a panel, from cache).
template <class Ops>
void qmoe_i8_block(Ops& ops, const AmxI8Weight& w, const AmxI8Tokens& x, int64_t n0, int64_t n1, float* y,
                   int64_t ldy) {
  if (x.M <= 0 || n0 >= n1) return;
  QI8MicroKernel<Ops> mk(ops);
  alignas(64) float out[32 * 32];
  for (int64_t n = n0; n < n1; n += 32) {
    const int rows = int(std::min<int64_t>(32, n1 - n));
    for (int64_t mb = 0; mb < x.M; mb += 32) {
      const int mt = int(std::min<int64_t>(32, x.M - mb));
      mk.run(w, x, n, rows, mb, mt, out);
      for (int c = 0; c < mt; ++c)
        for (int r = 0; r < rows; ++r) y[(mb + c) * ldy + (n - n0) + r] = out[r * 32 + c];
    }
  }
}

}  // namespace amx
}  // namespace hinamoe
