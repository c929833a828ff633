// The AMX GQA chunk kernel for bf16 K/V (gqa_amx_impl.h) over real tiles and
// over the emulator, and the two GQA tiers that use it.
#pragma once

#include "gqa.h"

namespace hinamoe {

void gqa_chunk_bf16_amx(const GqaChunkArgs& a);  // only where tier_unavailable_reason("amx") is ""
void gqa_chunk_bf16_emu(const GqaChunkArgs& a);

// bf16 K/V on the tile kernel; f32/f16 K/V on the best row-streaming GQA
// kernels this CPU has (avx2, else ref), as the MoE AMX tiers do.
const GqaTier& gqa_amx_tier();      // only where tier_unavailable_reason("amx") is ""
const GqaTier& gqa_amx_emu_tier();

}  // namespace hinamoe
