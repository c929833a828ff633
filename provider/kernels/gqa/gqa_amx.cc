// The AMX GQA chunk kernel instantiated over real AMX instructions. Compiled
// on every build; runs only where amx_unavailable_reason() == "".
// Shared headers come before the target pragma (DESIGN.md §5: keep ISA
// flags away from shared inline code), as in amx/hina_microkernel_amx.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../amx/tile_ops.h"
#include "../dtype.h"
#include "gqa.h"
#include "gqa_amx.h"

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")

#include "../amx/tile_ops_amx.h"
#include "gqa_amx_impl.h"

namespace hinamoe {

void gqa_chunk_bf16_amx(const GqaChunkArgs& a) {
  amx::AmxTileOps ops;
  gqa_amx::chunk_bf16(ops, a);  // configures, and releases before returning
}

}  // namespace hinamoe

#pragma GCC pop_options
