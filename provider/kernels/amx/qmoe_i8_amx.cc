// The AMX-INT8 QMoE block kernel over real AMX instructions. Compiled on
// every build; runs only where amx_int8_unavailable_reason() == "".
// As in hina_microkernel_amx.cc, shared headers come before the target
// pragma so only the Ops-templated kernel is compiled with AMX enabled.
#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "qmoe_i8.h"
#include "tile_ops.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,amx-int8")

#include "qmoe_i8_impl.h"
#include "tile_ops_amx.h"

namespace hinamoe {

void amx_qmoe_i8_block_amx(const AmxI8Weight& w, const AmxI8Tokens& x, int64_t n0, int64_t n1, float* y,
                           int64_t ldy) {
  amx::AmxTileOps ops;
  amx::qmoe_i8_block(ops, w, x, n0, n1, y, ldy);
  ops.release();  // back to the init state: cheap context switches
}

}  // namespace hinamoe

#pragma GCC pop_options
