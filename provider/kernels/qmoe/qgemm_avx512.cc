// The avx512 tier's quantised kernels on zmm registers, codes decoded in
// registers from the packed rows where they lie (as the avx2 kernels):
//   float path, 4-bit: 16 bytes of codes zero-extended to 16 int32 by one
//     load; vpermps looks each nibble up in a 16-entry table of the row's
//     dequantised values (q - zp) * s for the block: the low nibbles as they
//     are (vpermps reads only an index's low 4 bits), the high ones after one
//     shift. 32 weights cost four instructions and no int-to-float
//     conversion. Tokens in EvenOdd32 order.
//   float path, 8-bit: 16 codes -> 16 int32 -> float -> weights by one FMA
//     (q * s - zp * s), shared by the tokens.
//   int8 tokens (accuracy_level 4) on AVX512-VNNI vpdpbusd, blocks of 32
//     without zero points: 4-bit four blocks per 64-byte load (Quad32, a
//     block per 128-bit lane), 8-bit two (a block per 256-bit half).
//   From 12 tokens per expert on, both paths transpose the tokens once per
//     call and broadcast each dequantised weight (each 4 codes) against 16
//     tokens at a time.
// This file is the table: which kernel family a weight and a token count
// get. The families: qgemm_avx512_f.cc (float tokens, tiles),
// qgemm_avx512_f_transposed.cc, qgemm_avx512_i8.cc (int8 tokens, tiles),
// qgemm_avx512_i8_transposed.cc; their shared helpers: qgemm_avx512.h.
// Weights these do not cover (groups that do not divide the blocks, the int8
// path with zero points or other block sizes, CPUs without AVX512-VNNI) run
// on the avx2 tier's kernels; the order functions below say which order each
// case reads, so the driver gathers the tokens to match.
#include "qgemm_avx512.h"

namespace hinamoe {
namespace {

using namespace qz;

// Chosen once: the check builds strings, and the kernels ask per work item.
const QuantKernels& fallback() {
  static const QuantKernels& k = avx_vnni_unavailable_reason().empty() ? quant_avx2_vnni() : quant_avx2();
  return k;
}

bool has_vnni() {
  static const bool v = avx512_vnni_unavailable_reason().empty();
  return v;
}

// The zmm float kernels take blocks (K when row-wise) and K in whole groups of 32.
bool zmm_float(int64_t block, int64_t K) { return K % 32 == 0 && block % 32 == 0; }

// The zmm int8-token kernels: blocks of 32 without zero points, K a multiple of 64.
bool zmm_i8(int64_t block, int64_t K, bool zero_points) {
  return has_vnni() && !zero_points && block == 32 && K % 64 == 0;
}

TokenOrder avx512_f_order(int bits, int64_t block, int64_t K, bool zero_points) {
  if (!zmm_float(block, K)) return fallback().f_order(bits, block, K, zero_points);
  return bits == 4 ? TokenOrder::EvenOdd32 : TokenOrder::KOrder;
}

TokenOrder avx512_i8_order(int bits, int64_t block, int64_t K, bool zero_points) {
  if (!zmm_i8(block, K, zero_points)) return fallback().i8_order(bits, block, K, zero_points);
  return bits == 4 ? TokenOrder::Quad32 : TokenOrder::KOrder;
}

template <int BITS>
void qgemm_avx512(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M, float* Y,
                  int64_t ldy) {
  if (!zmm_float(w.block, w.K)) return fallback().gemm[BITS == 8](w, n0, n1, X, ldx, M, Y, ldy);
  if (M >= kTTTokens) f_transposed(w, n0, n1, X, ldx, M, Y, ldy);
  else f_tiles(w, n0, n1, X, ldx, M, Y, ldy);
}

template <int BITS>
void qgemm_i8_avx512(const QWeight& w, int64_t n0, int64_t n1, const QTokens& X, int64_t M, float* Y,
                     int64_t ldy) {
  // The order check: fc1 and fc3 share tokens gathered for zero points when
  // either has them, so a weight without them may meet the avx2 order.
  if (!zmm_i8(w.block, w.K, w.zero_points != nullptr) || X.order != avx512_i8_order(BITS, w.block, w.K, false))
    return fallback().gemm_i8[BITS == 8](w, n0, n1, X, M, Y, ldy);
  // 6-10 tokens on the transposed path: no gain (4-bit: up to 2x slower)
  if (M >= kTTTokens) i8_transposed(w, n0, n1, X, M, Y, ldy);
  else i8_tiles(w, n0, n1, X, M, Y, ldy);
}

}  // namespace

const QuantKernels& quant_avx512() {
  static const QuantKernels q = [] {
    QuantKernels t;
    t.name = has_vnni() ? "avx512-vnni" : "avx512";
    t.gemm[0] = qgemm_avx512<4>;
    t.gemm[1] = qgemm_avx512<8>;
    t.gemm_i8[0] = qgemm_i8_avx512<4>;
    t.gemm_i8[1] = qgemm_i8_avx512<8>;
    t.f_order = avx512_f_order;
    t.i8_order = avx512_i8_order;
    return t;
  }();
  return q;
}

}  // namespace hinamoe
