// The AMX tiers' token-transforming expert kernels (tier.h's
// ExpertBlockKernels): the HiNa micro-kernel on real tiles or on the
// emulator, the same source.
#include "expert_block_kernels.h"

#include "block_epilogue.h"
#include "hina_microkernel.h"

namespace hinamoe {
namespace {

constexpr int64_t kTileRows = 32;  // two 16-row weight tiles per micro-kernel step

}  // namespace

const ExpertBlockKernels& amx_expert_blocks() {
  static const ExpertBlockKernels blocks{amx_vnni_elems,     amx_gather_vnni,         amx_gate_up_block_amx,
                                         amx_down_block_amx, kTileRows,               amx_node_partial_amx,
                                         amx::amx_gate_up_finish, amx::amx_down_finish};
  return blocks;
}

const ExpertBlockKernels& amx_emu_expert_blocks() {
  static const ExpertBlockKernels blocks{amx_vnni_elems,     amx_gather_vnni,         amx_gate_up_block_emu,
                                         amx_down_block_emu, kTileRows,               amx_node_partial_emu,
                                         amx::amx_gate_up_finish, amx::amx_down_finish};
  return blocks;
}

}  // namespace hinamoe
