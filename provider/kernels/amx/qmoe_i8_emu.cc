// The AMX-INT8 QMoE block kernel over the software tile emulator.
#include "qmoe_i8.h"
#include "qmoe_i8_impl.h"
#include "tile_ops_emu.h"

namespace hinamoe {

void amx_qmoe_i8_block_emu(const AmxI8Weight& w, const AmxI8Tokens& x, int64_t n0, int64_t n1, float* y,
                           int64_t ldy) {
  amx::TileEmulator emu;  // a fresh register file per call, like a fresh thread
  amx::EmuTileOps ops(emu);
  amx::qmoe_i8_block(ops, w, x, n0, n1, y, ldy);
  ops.release();
}

}  // namespace hinamoe
