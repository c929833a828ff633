// The AMX GQA chunk kernel for bf16 K/V (GqaChunkFn, contract in gqa.h),
// written once against the tile-ops policy (amx/tile_ops.h) and
// instantiated over real AMX (gqa_amx.cc) and the emulator (gqa_amx_emu.cc).
//
// Per block of 16 query rows (G heads x tokens, zero-padded):
//   1. scores^T [16 keys x 16 rows] = K [16 keys x d] . Q^T. K is the A
//      operand, loaded straight from the cache rows (stride = kv row
//      stride); Q^T is the B operand, converted into the VNNI layout
//      (amx/amx_layout.h) once per decode step: the later calls of a work
//      item (same_q) keep it. Q is float (scaled, rotated), so it is
//      split into bf16 hi + lo parts and multiplied twice: ~16 mantissa bits
//      of Q, so the only roundings left are float32 sums (K is exact bf16).
//      A head-dim tail (d % 32) uses narrower tiles, so nothing past d is read.
//   2. Online softmax on the float scores (scalar code): softcap, bias,
//      per-row visible range, running max / sum as gqa.h defines them.
//   3. acc [16 x d] += P . V: P (hi + lo bf16 split again) is the A operand
//      as it lies (row = query row, keys along the row); V is the B operand,
//      whose VNNI rows pair two consecutive keys, so the chunk's V rows are
//      interleaved into a staging buffer once per call (transform on load).
// Keys of a chunk not filling a 16-key tile are staged zero-padded; the
// softmax gives padded keys weight 0.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "../amx/tile_ops.h"
#include "../dtype.h"
#include "gqa.h"
#include "gqa_amx_steps.h"

namespace hinamoe {
namespace gqa_amx {

constexpr int kRowBlock = 16;  // query rows per tile (N of the scores GEMM, M of P.V)
constexpr int kKeyTile = 16;   // keys per scores tile (M of the scores GEMM)
constexpr int kPairK = 32;     // bf16 contraction elements per tile (64 bytes)

// Tile numbers.
constexpr int kC = 0;      // scores^T / output accumulator, 16 x 16 f32
constexpr int kA = 1;      // K rows (32 dims) / P hi (32 keys)
constexpr int kBhi = 2;    // Q^T hi (32 dims) / V pairs (32 keys x 16 dims)
constexpr int kBlo = 3;    // Q^T lo
constexpr int kAtail = 4;  // K rows, the d % 32 tail dims
constexpr int kBhiT = 5;   // Q^T hi, tail
constexpr int kBloT = 6;   // Q^T lo, tail
constexpr int kAlo = 7;    // P lo

// Per-thread buffers (grow once).
struct Scratch {
  std::vector<uint16_t> qhi, qlo;  // [dp/2][16][2] VNNI Q^T of one row block
  std::vector<uint16_t> ktail;     // [16][d] the last partial key tile
  std::vector<uint16_t> zrow;      // [d] zeros: the partner of an odd last key
  std::vector<uint16_t> vv;        // [keys_pad/2][dv][2] VNNI V of the chunk
  std::vector<uint16_t> phi, plo;  // [16][keys_pad] P of one row block
  std::vector<float> out;          // [16][dv] accumulators of one row block
  std::vector<float> st;           // [keys_pad16][16] scores^T of the chunk (rows in lanes)
  bool q_kept = false;             // qhi/qlo hold the whole query block of the last call
};
// Defined out of line in gqa_amx_emu.cc: an inline definition here would be
// compiled with and without the AMX target (DESIGN.md §5).
Scratch& scratch();

template <class Ops>
void chunk_bf16(Ops& ops, const GqaChunkArgs& a) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t d = a.d, k0 = a.k0, nk = a.k1 - a.k0;
  Scratch& s = scratch();
  if (nk <= 0 || a.rows <= 0) {
    s.q_kept = s.q_kept && a.same_q;  // another q: what is kept is stale now
    return;
  }
  const int64_t dfull = d / kPairK * kPairK, dtail = d - dfull;  // dtail in {0, 8, 16, 24}
  const int64_t dp = dfull + (dtail ? kPairK : 0);               // Q^T rows padded to whole pairs
  const int64_t dv = (d + 15) / 16 * 16;                         // output columns padded to tiles
  const int64_t kpad = (nk + kPairK - 1) / kPairK * kPairK;      // keys padded for P.V
  const int64_t nk16 = (nk + kKeyTile - 1) / kKeyTile * kKeyTile;
  const uint16_t* K = static_cast<const uint16_t*>(a.k);
  const uint16_t* V = static_cast<const uint16_t*>(a.v);
  const int64_t kvs = a.kv_stride;

  // V of the whole chunk as VNNI pairs of consecutive keys (padded keys and
  // dims zero).
  s.vv.resize(size_t(kpad * dv));
  s.zrow.resize(size_t(d));  // never written: grows with zeros
  for (int64_t j = 0; j < kpad; j += 2) {
    const uint16_t* v0 = j < nk ? V + (k0 + j) * kvs : s.zrow.data();
    const uint16_t* v1 = j + 1 < nk ? V + (k0 + j + 1) * kvs : s.zrow.data();
    interleave_pair(v0, v1, d, dv, s.vv.data() + j * dv);
  }
  // The last partial key tile of K, zero-padded (full tiles load in place).
  const int64_t nk_full = nk / kKeyTile * kKeyTile;
  if (nk_full < nk) {
    s.ktail.assign(size_t(kKeyTile * d), 0);
    for (int64_t j = nk_full; j < nk; ++j)
      std::memcpy(s.ktail.data() + (j - nk_full) * d, K + (k0 + j) * kvs, size_t(d) * 2);
  }

  amx::TileConfig cfg = amx::blank_palette1();
  amx::set_tile(&cfg, kC, 16, 64);
  amx::set_tile(&cfg, kA, 16, 64);
  amx::set_tile(&cfg, kBhi, 16, 64);
  amx::set_tile(&cfg, kBlo, 16, 64);
  amx::set_tile(&cfg, kAlo, 16, 64);
  if (dtail) {
    amx::set_tile(&cfg, kAtail, 16, int(dtail * 2));
    amx::set_tile(&cfg, kBhiT, int(dtail / 2), 64);
    amx::set_tile(&cfg, kBloT, int(dtail / 2), 64);
  }
  ops.configure(cfg);

  s.qhi.resize(size_t(dp * kRowBlock));
  s.qlo.resize(size_t(dp * kRowBlock));
  s.phi.resize(size_t(kRowBlock * kpad));
  s.plo.resize(size_t(kRowBlock * kpad));
  s.out.resize(size_t(kRowBlock * dv));
  s.st.resize(size_t(nk16 * kRowBlock));

  // Is every key of the chunk visible to every row, with no softcap or bias?
  bool plain = a.softcap <= 0.0f && !a.bias;
  for (int64_t r = 0; r < a.rows && plain; ++r) plain = a.lo[r] <= k0 && a.hi[r] >= a.k1;

  // Decode has at most 16 query rows per call (G <= 16): their operands are
  // built on the first call of a step and kept for its next keys.
  const bool keep_q = a.same_q && s.q_kept && a.rows <= kRowBlock;
  s.q_kept = a.rows <= kRowBlock;
  for (int64_t r0 = 0; r0 < a.rows; r0 += kRowBlock) {
    const int64_t nr = std::min<int64_t>(kRowBlock, a.rows - r0);
    // Q^T in VNNI, hi and lo parts; the columns of missing rows stay 0.
    if (!keep_q && nr < kRowBlock) {
      std::fill(s.qhi.begin(), s.qhi.end(), uint16_t(0));
      std::fill(s.qlo.begin(), s.qlo.end(), uint16_t(0));
    }
    if (!keep_q)
      for (int64_t n = 0; n < nr; ++n) q_to_vnni(a.q + (r0 + n) * d, d, n, s.qhi.data(), s.qlo.data());
    ops.staged(s.qhi.data());
    ops.staged(s.qlo.data());
    ops.staged(s.ktail.data());

    // 1. Scores^T, 16 keys at a time, stored as they come out of the tile:
    //    st[key][row], the rows of a key side by side for the softmax.
    for (int64_t j0 = 0; j0 < nk; j0 += kKeyTile) {
      const bool full = j0 < nk_full;
      const uint16_t* kb = full ? K + (k0 + j0) * kvs : s.ktail.data();
      const int64_t ks = full ? kvs : d;  // elements between key rows
      ops.template zero<kC>();
      for (int64_t c0 = 0; c0 < dfull; c0 += kPairK) {
        ops.template load<kA>(kb + c0, ks * 2);
        ops.template load<kBhi>(s.qhi.data() + (c0 / 2) * 32, 64);
        ops.template load<kBlo>(s.qlo.data() + (c0 / 2) * 32, 64);
        ops.template dp_bf16<kC, kA, kBhi>();
        ops.template dp_bf16<kC, kA, kBlo>();
      }
      if (dtail) {
        ops.template load<kAtail>(kb + dfull, ks * 2);
        ops.template load<kBhiT>(s.qhi.data() + (dfull / 2) * 32, 64);
        ops.template load<kBloT>(s.qlo.data() + (dfull / 2) * 32, 64);
        ops.template dp_bf16<kC, kAtail, kBhiT>();
        ops.template dp_bf16<kC, kAtail, kBloT>();
      }
      ops.template store<kC>(s.st.data() + j0 * kRowBlock, 64);
    }
    ops.staged(s.st.data());  // the reads below must see the tile stores

    // 2. Softcap, bias and the visible ranges (only where a node has them:
    //    hidden keys become -inf), then the online softmax, 4 rows at once.
    if (!plain) {
      for (int64_t n = 0; n < nr; ++n) {
        const int64_t r = r0 + n;
        for (int64_t j = 0; j < nk; ++j) {
          float& x = s.st[size_t(j * kRowBlock + n)];
          if (k0 + j < a.lo[r] || k0 + j >= a.hi[r]) {
            x = kNegInf;
            continue;
          }
          if (a.softcap > 0.0f) x = a.softcap * std::tanh(x / a.softcap);
          if (a.bias) x += a.bias[r][k0 + j];
        }
      }
    }
    for (int64_t n0 = 0; n0 < nr; n0 += 4)
      softmax_rows4(s.st.data() + n0, kRowBlock, nk, std::min<int64_t>(4, nr - n0), a.m + r0 + n0,
                    a.l + r0 + n0, a.acc + (r0 + n0) * d, d, s.out.data() + n0 * dv, dv,
                    s.phi.data() + n0 * kpad, s.plo.data() + n0 * kpad, kpad);
    ops.staged(s.phi.data());
    ops.staged(s.plo.data());
    ops.staged(s.vv.data());
    ops.staged(s.out.data());

    // 3. out += P . V, 16 output dims at a time.
    for (int64_t c0 = 0; c0 < dv; c0 += 16) {
      ops.template load<kC>(s.out.data() + c0, dv * 4);
      for (int64_t j0 = 0; j0 < kpad; j0 += kPairK) {
        ops.template load<kA>(s.phi.data() + j0, kpad * 2);
        ops.template load<kAlo>(s.plo.data() + j0, kpad * 2);
        ops.template load<kBhi>(s.vv.data() + (j0 / 2) * dv * 2 + c0 * 2, dv * 4);
        ops.template dp_bf16<kC, kA, kBhi>();
        ops.template dp_bf16<kC, kAlo, kBhi>();
      }
      ops.template store<kC>(s.out.data() + c0, dv * 4);
    }
    ops.staged(s.out.data());
    for (int64_t n = 0; n < nr; ++n) std::memcpy(a.acc + (r0 + n) * d, s.out.data() + n * dv, size_t(d) * 4);
  }
  ops.release();
}

}  // namespace gqa_amx
}  // namespace hinamoe
