// The AMX GQA chunk kernel over the software tile emulator, and the two
// AMX GQA tiers.
#include "../amx/tile_ops_emu.h"
#include "../tier.h"
#include "gqa_amx.h"
#include "gqa_amx_impl.h"

namespace hinamoe {

gqa_amx::Scratch& gqa_amx::scratch() {
  static thread_local Scratch s;
  return s;
}

void gqa_chunk_bf16_emu(const GqaChunkArgs& a) {
  amx::TileEmulator emu;  // a fresh register file per call, like a fresh thread
  amx::EmuTileOps ops(emu);
  gqa_amx::chunk_bf16(ops, a);
}

namespace {

GqaTier make_tier(const char* name, GqaChunkFn bf16) {
  GqaTier t = tier_unavailable_reason("avx2").empty() ? gqa_avx2_tier() : gqa_ref_tier();
  t.name = name;
  t.chunk_bf16 = bf16;
  return t;
}

}  // namespace

const GqaTier& gqa_amx_tier() {
  static const GqaTier t = make_tier("amx", gqa_chunk_bf16_amx);
  return t;
}

const GqaTier& gqa_amx_emu_tier() {
  static const GqaTier t = make_tier("amx-emu", gqa_chunk_bf16_emu);
  return t;
}

}  // namespace hinamoe
