// The kernel library's dispatch knobs in one place: where a driver switches
// path and how it cuts its work. The measurements behind each value are in
// docs/kernels.md, "Tuning knobs"; a kernel's register blocking stays beside
// its code. The macros can be set at build time for A/B builds
// (-DHINAMOE_QTT_MIN=8 ...).
#pragma once

#include <cstdint>

#ifndef HINAMOE_QTT_MIN
#define HINAMOE_QTT_MIN 12
#endif
#ifndef HINAMOE_QAVX2_MANY
#define HINAMOE_QAVX2_MANY 16
#endif
#ifndef HINAMOE_QTT_CHUNK
#define HINAMOE_QTT_CHUNK 256
#endif

namespace hinamoe {
namespace tuning {

// Threads and work items.
constexpr int64_t kParallelMinElems = int64_t(1) << 16;  // a phase touching fewer elements runs serially
constexpr int64_t kItemsPerThread = 8;   // expert items per thread: dynamic claiming evens out slow threads
constexpr int64_t kItemStreamCost = 4;   // an expert row's weight stream costs as much as this many tokens' FMAs

// Scratch per call; larger batches run in token chunks.
constexpr int64_t kExpertScratchBytes = int64_t(256) << 20;  // MoE / QMoE token, activation and output rows
constexpr int64_t kDenseScratchBytes = int64_t(64) << 20;    // MatMul / MatMulNBits copies of A, split-K partials

// MoE, bf16 experts: bf16 tokens and activations on the bf16-pair kernel
// (AVX512-BF16) from this many tokens per active expert on average.
constexpr int64_t kPairsMinTokensPerExpert = 4;

// Dense MatMul: up to this many tokens the rows of B (K) are split over the
// threads, each reading one contiguous block; above, the columns (N).
constexpr int64_t kSplitKMaxTokens = 8;

// QMoE / MatMulNBits float-token kernels: from this many tokens the avx512
// tier transposes the tokens once and dequantises HINAMOE_QTT_CHUNK columns
// at a time (both 4- and 8-bit); the avx2 tier from HINAMOE_QAVX2_MANY.
constexpr int64_t kTransposedMinTokensAvx512 = HINAMOE_QTT_MIN;
constexpr int64_t kTransposedChunkAvx512 = HINAMOE_QTT_CHUNK;
constexpr int64_t kTransposedMinTokensAvx2 = HINAMOE_QAVX2_MANY;

// QMoE on the amx tier: bf16 tiles from this many tokens per expert, for
// 4- and 8-bit codes, over the float-token and the int8-token kernels.
constexpr int64_t kTileMinTokens[2] = {16, 32};
constexpr int64_t kTileMinTokensI8[2] = {64, 128};

// GroupQueryAttention work split.
constexpr int64_t kGqaTileRows = 64;      // query rows (heads x tokens) per work item, at most
constexpr int64_t kGqaPieceKeys = 128;    // keys per chunk-kernel call (scores stay in L1/L2)
constexpr int64_t kGqaMinSplitKeys = 256; // a key range is split across items only above this

}  // namespace tuning
}  // namespace hinamoe
