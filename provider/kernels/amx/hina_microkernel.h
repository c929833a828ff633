// HiNa AMX expert FFN kernels (paper §4, Algorithm 1) — public entry points.
//
// Per expert with M routed tokens, the driver calls
//   amx_gather_vnni      once:   tokens -> xv   (VNNI bf16, K = H)
//   amx_gate_up_block    per j-block [j0, j1):   W1 (+W3) * xv -> actv (VNNI bf16, K = I)
//   amx_down_block       per h-block [h0, h1):   W2 * actv -> y rows [m][h] (float)
// Weights are bf16, row-major [out, in], used in place as the AMX A operand.
// Buffers: xv has amx_vnni_elems(H, M) and actv amx_vnni_elems(I, M) bf16
// elements; blocks of one expert may run concurrently on distinct ranges.
//
// *_emu run the kernel through the software tile emulator (any x86-64 CPU;
// slow; throws amx::TileError on a tile misuse). *_amx run real AMX and may
// only be called after amx_unavailable_reason() returned "" (it also asks
// the kernel for tile-data permission). The templates over a TileOps policy
// are in hina_microkernel_impl.h.
#pragma once

#include <cstdint>

#include "../dtype.h"
#include "../moe/moe_ffn.h"
#include "../numa/segment_table.h"
#include "amx_layout.h"

namespace hinamoe {

// bf16 elements of a K x M VNNI token buffer (K padded to a multiple of 32).
inline int64_t amx_vnni_elems(int64_t K, int64_t M) { return amx::vnni_elems(K, M); }

// Gathers rows[0..M) of input x [*, H] (f32, f16 or bf16) into xv, already
// in the VNNI B layout xv[(k/2)*2M + 2m + k%2] as bf16 (RNE), zero past H.
inline void amx_gather_vnni(const void* x, DType dtype, int64_t H, const int32_t* rows, int64_t M,
                            uint16_t* xv) {
  amx::gather_vnni(x, dtype, H, rows, M, xv);
}

// Gate/up projection of one expert for intermediate indices [j0, j1):
//   non-gated:  a_j = act(W1[j].x + b1[j])
//   gated:      a_j = act(g, u), g/u rows per attrs.gate_layout:
//               Interleaved W1 rows 2j / 2j+1; Stacked W1 rows j / I+j;
//               Separate W1 row j / W3 row j (b3 for u).
// fc1_w: this expert's W1 [N1, H] (N1 = 2I for Interleaved/Stacked gated,
// else I); fc1_b [N1] or null; fc3_w/fc3_b [I, H]/[I] (Separate gated only)
// or null; biases have type bias_dtype. Writes a_j of every token as bf16
// into actv (VNNI, K = I); the call whose j1 == I also zeroes actv's padding.
void amx_gate_up_block_emu(const MoEAttrs& attrs, int64_t H, int64_t I, const uint16_t* fc1_w,
                           const void* fc1_b, const uint16_t* fc3_w, const void* fc3_b, DType bias_dtype,
                           const uint16_t* xv, int64_t M, int64_t j0, int64_t j1, uint16_t* actv);
void amx_gate_up_block_amx(const MoEAttrs& attrs, int64_t H, int64_t I, const uint16_t* fc1_w,
                           const void* fc1_b, const uint16_t* fc3_w, const void* fc3_b, DType bias_dtype,
                           const uint16_t* xv, int64_t M, int64_t j0, int64_t j1, uint16_t* actv);

// Down projection of one expert for output rows [h0, h1):
//   v = route_weight[m] * (W2[h].a_m + b2[h])
//   y[m*ldy + h] = v, or += v when accumulate
// fc2_w: this expert's W2 [H, I] bf16; fc2_b [H] or null (bias_dtype);
// route_weight [M] or null (= 1). Only columns [h0, h1) of rows 0..M-1 of
// y are touched.
void amx_down_block_emu(int64_t H, int64_t I, const uint16_t* fc2_w, const void* fc2_b, DType bias_dtype,
                        const uint16_t* actv, int64_t M, int64_t h0, int64_t h1, const float* route_weight,
                        bool accumulate, float* y, int64_t ldy);
void amx_down_block_amx(int64_t H, int64_t I, const uint16_t* fc2_w, const void* fc2_b, DType bias_dtype,
                        const uint16_t* actv, int64_t M, int64_t h0, int64_t h1, const float* route_weight,
                        bool accumulate, float* y, int64_t ldy);

// NUMA (paper §5.3, Algorithm 2): one node's partial sums of rows [r0, r1)
// of a bf16 weight W [*, K] over the node's local segments of `table` (the
// weight's segment table, numa/segment_table.h), tokens tok in the VNNI
// layout (K, M):
//   P[(r - r0)*ldp + m] = sum over the node's segments (r, k0, k1) of
//                         sum_{k in [k0, k1)} W[r*K + k] * tok(k, m)
// for m < M (0 for rows with no local segment). Segment ends need not be
// multiples of 32 (or even 2): partly covered k-blocks are staged with zeros
// outside the segment. The sums of all nodes' partials (node order) go to
// amx::amx_gate_up_finish / amx_down_finish (block_epilogue.h).
void amx_node_partial_emu(const numa::SegmentTable& table, int node, const uint16_t* W, int64_t K, int64_t r0,
                          int64_t r1, const uint16_t* tok, int64_t M, float* P, int64_t ldp);
void amx_node_partial_amx(const numa::SegmentTable& table, int node, const uint16_t* W, int64_t K, int64_t r0,
                          int64_t r1, const uint16_t* tok, int64_t M, float* P, int64_t ldp);

}  // namespace hinamoe
