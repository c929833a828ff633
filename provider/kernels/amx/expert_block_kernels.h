// The AMX tiers' expert block kernels, for the tier tables (tiers.cc).
#pragma once

#include "../tier.h"

namespace hinamoe {

const ExpertBlockKernels& amx_expert_blocks();      // real tiles: only where the amx tier runs
const ExpertBlockKernels& amx_emu_expert_blocks();  // the software tile emulator

}  // namespace hinamoe
