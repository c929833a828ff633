// The three layout transforms of the HiNa kernel (paper §4.1), as plain
// functions shared by the real and the emulated instantiations:
//   1. gather routed tokens straight into the VNNI B layout;
//   2. store activated gate/up values (bf16) in the VNNI layout the down
//      projection reads as its B operand;
//   3. store the down accumulators [h][m] transposed to row-major [m][h],
//      scaled by each token's routing weight.
//
// VNNI layout of a K x M token operand ("xv", "actv"): bf16 element (k, m)
// at index (k/2)*(2*M) + 2*m + (k%2); K is padded to Kp = round_up(K, 32)
// with zeros so every k-block of the kernel is a full 16-row B tile.
#pragma once

#include <cstdint>

#include "../dtype.h"

namespace hinamoe {
namespace amx {

inline int64_t round_up32(int64_t k) { return (k + 31) / 32 * 32; }
// bf16 elements of a VNNI buffer for K x M (K padded to 32).
inline int64_t vnni_elems(int64_t K, int64_t M) { return round_up32(K) * M; }
inline int64_t vnni_index(int64_t k, int64_t m, int64_t M) { return (k / 2) * (2 * M) + 2 * m + (k & 1); }

// Transform 1. Rows rows[0..M) of x [*, K] (f32/f16/bf16, row stride K) are
// rounded to bf16 (RNE) and written to xv in VNNI order; k in [K, Kp) gets 0.
void gather_vnni(const void* x, DType dtype, int64_t K, const int32_t* rows, int64_t M, uint16_t* xv);

// Zeroes k in [K, round_up32(K)) of a K x M VNNI buffer (its padding).
void vnni_zero_tail(int64_t K, int64_t M, uint16_t* v);

// Transform 2. src is a float block [r][c] (row stride ld) holding
// features k = k0 + r (r < rows) of tokens m = m0 + c (c < cols); each is
// rounded to bf16 and stored at vnni_index(k, m, M) of v.
void store_vnni_block(const float* src, int64_t ld, int64_t rows, int64_t cols, int64_t k0, int64_t m0,
                      int64_t M, uint16_t* v);

// Transform 3. acc is a float block [r][c] (row stride ld): output feature
// h0 + r of token m0 + c. Writes (or adds, if accumulate)
//   y[(m0 + c)*ldy + h0 + r] = w[m0 + c] * (acc[r][c] + bias[r])
// with w == nullptr meaning 1 and bias == nullptr meaning 0.
void store_transposed(const float* acc, int64_t ld, int64_t rows, int64_t cols, const float* bias,
                      const float* w, int64_t h0, int64_t m0, bool accumulate, float* y, int64_t ldy);

}  // namespace amx
}  // namespace hinamoe
