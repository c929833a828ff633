// The HiNa kernel instantiated over real AMX instructions. Compiled on every
// build; runs only where amx_unavailable_reason() == "".
//
// Everything shared with other translation units (the standard library,
// dtype/activation helpers, the layout transforms) is included BEFORE the
// target pragma, so only the Ops-templated kernel code below is compiled
// with AMX enabled (DESIGN.md §5: keep ISA flags away from shared inline
// code). Those templates are instantiated with AmxTileOps nowhere else.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../moe/activation.h"
#include "../numa/segment_table.h"
#include "amx_layout.h"
#include "block_epilogue.h"
#include "hina_microkernel.h"
#include "qgemm_tiles.h"
#include "tile_ops.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")

#include "hina_microkernel_impl.h"
#include "qgemm_tiles_impl.h"
#include "tile_ops_amx.h"

namespace hinamoe {

void amx_gate_up_block_amx(const MoEAttrs& attrs, int64_t H, int64_t I, const uint16_t* fc1_w,
                           const void* fc1_b, const uint16_t* fc3_w, const void* fc3_b, DType bias_dtype,
                           const uint16_t* xv, int64_t M, int64_t j0, int64_t j1, uint16_t* actv) {
  amx::AmxTileOps ops;
  amx::gate_up_block(ops, attrs, H, I, fc1_w, fc1_b, fc3_w, fc3_b, bias_dtype, xv, M, j0, j1, actv);
  ops.release();  // back to the init state: cheap context switches
}

void amx_down_block_amx(int64_t H, int64_t I, const uint16_t* fc2_w, const void* fc2_b, DType bias_dtype,
                        const uint16_t* actv, int64_t M, int64_t h0, int64_t h1, const float* route_weight,
                        bool accumulate, float* y, int64_t ldy) {
  amx::AmxTileOps ops;
  amx::down_block(ops, H, I, fc2_w, fc2_b, bias_dtype, actv, M, h0, h1, route_weight, accumulate, y, ldy);
  ops.release();
}

void amx_node_partial_amx(const numa::SegmentTable& table, int node, const uint16_t* W, int64_t K, int64_t r0,
                          int64_t r1, const uint16_t* tok, int64_t M, float* P, int64_t ldp) {
  amx::AmxTileOps ops;
  amx::node_partial(ops, table, node, W, K, r0, r1, tok, M, P, ldp);
  ops.release();
}

void qgemm_tiles_amx(const QWeight& w, int64_t n0, int64_t n1, const uint16_t* xv, int64_t M, float* Y,
                     int64_t ldy) {
  amx::AmxTileOps ops;
  amx::qgemm_tiles(ops, dequant_rows_bf16_avx512, w, n0, n1, xv, M, Y, ldy);
  ops.release();
}

}  // namespace hinamoe

#pragma GCC pop_options
