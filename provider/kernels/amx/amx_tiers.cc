// The two AMX tiers: bf16 weights go through the HiNa micro-kernel (real
// tiles or the emulator); f32/f16 weights, which AMX BF16 cannot take in
// place, use the best row-streaming tier this CPU has; the dense MatMul
// runs the avx512 tier's kernels.
#include <algorithm>
#include <iterator>

#include "../tier.h"
#include "block_epilogue.h"
#include "hina_microkernel.h"

namespace hinamoe {
namespace {

KernelTier make_tier(const char* name, const ExpertBlockKernels* blocks) {
  const KernelTier& rows = tier_unavailable_reason("avx2").empty() ? avx2_tier() : ref_tier();
  KernelTier t = rows;
  t.name = name;
  if (tier_unavailable_reason("avx512").empty())  // every AMX CPU: the dense MatMul's zmm kernels
  {
    std::copy(std::begin(avx512_tier().gemm_kn), std::end(avx512_tier().gemm_kn), std::begin(t.gemm_kn));
    t.gemm_kn_bf16 = avx512_tier().gemm_kn_bf16;
  }
  t.bf16_blocks = blocks;
  return t;
}

constexpr int64_t kTileRows = 32;  // two 16-row weight tiles per micro-kernel step

}  // namespace

const KernelTier& amx_tier() {
  static const ExpertBlockKernels blocks{amx_vnni_elems,       amx_gather_vnni,         amx_gate_up_block_amx,
                                         amx_down_block_amx,   kTileRows,               amx_node_partial_amx,
                                         amx::amx_gate_up_finish, amx::amx_down_finish};
  static const KernelTier tier = make_tier("amx", &blocks);
  return tier;
}

const KernelTier& amx_emu_tier() {
  static const ExpertBlockKernels blocks{amx_vnni_elems,       amx_gather_vnni,         amx_gate_up_block_emu,
                                         amx_down_block_emu,   kTileRows,               amx_node_partial_emu,
                                         amx::amx_gate_up_finish, amx::amx_down_finish};
  static const KernelTier tier = make_tier("amx-emu", &blocks);
  return tier;
}

}  // namespace hinamoe
