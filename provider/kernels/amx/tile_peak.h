// AMX tile-rate probe: the compute roofline of the tile kernels, beside the
// FMA probe (fma_peak.h) of the vector ones. At n tokens per expert every
// weight takes n multiply-adds, so a tile kernel cannot stream weights faster
// than (this rate / n) elements per second.
#pragma once

namespace hinamoe {

// Multiply-adds per second that `threads` std::threads reach together with
// TDPBF16PS (int8 = false: 16x16x32 bf16 pairs per instruction) or TDPBUSD
// (int8 = true: 16x16x64 byte products), four independent accumulators on
// operands already in tiles: the issue-rate peak, best of a few rounds. 0
// where this process cannot run AMX (amx_unavailable_reason,
// amx_int8_unavailable_reason).
double tile_peak_per_s(int threads, bool int8 = false);

}  // namespace hinamoe
