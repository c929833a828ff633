// The token side of a quantised GEMM: rows of float tokens in the order a
// tier's kernel reads them (token_pos), plus their int8 codes per weight
// block for the int8-token kernels (accuracy_level 4). Shared by the QMoE
// driver (one operand per projection input) and MatMulNBits.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "../aligned_buffer.h"
#include "../parallel.h"
#include "../scratch.h"
#include "qmoe_ffn.h"

namespace hinamoe {
namespace detail {

// Symmetric int8 per block (max |x| -> 127) of rows [p0, p1) of x [*, ldx]
// into the QTokens buffers (quantize_rows in qoperand.cc).
void quantize_rows(const float* x, int64_t ldx, int64_t K, int64_t block, const int32_t* pos, int64_t p0,
                   int64_t p1, int8_t* q, float* scale, int32_t* sum, int64_t ldq, int64_t nb);

// The rows of one GEMM operand (a QMoE projection input, a MatMulNBits A).
struct Operand {
  AlignedVector<float> x;   // [R, ld] float rows
  int64_t ld = 0, K = 0, block = 0, nb = 1;
  AlignedVector<int8_t> q;  // [R, ldq] int8 codes (int8 kernels)
  std::vector<int32_t> qpos;  // where code k goes (empty: k order)
  int64_t ldq = 0;          // a multiple of 64: rows on cache lines
  std::vector<float> qscale;
  std::vector<int32_t> qsum;
  bool int8 = false;
  bool zero_points = false;                 // the orders are those for weights with zero points
  TokenOrder order = TokenOrder::KOrder;    // of the int8 codes
  TokenOrder x_order = TokenOrder::KOrder;  // of the float rows
  std::vector<int32_t> xpos;                // where element k of a float row goes (empty: k order)
  std::pair<TokenOrder, int64_t> xpos_of{TokenOrder::KOrder, 0}, qpos_of{TokenOrder::KOrder, 0};
  // Tile kernel (prefill): the rows [p0, p1) of a group of at least
  // tile_min rows as bf16 in the kernel's 32-token VNNI blocks from
  // xv + p0 * Kp (build_tiles; amx/qgemm_tiles.h).
  QGemmTilesFn tiles = nullptr;
  void (*tile_tokens)(const float* const*, int, int64_t, int64_t, uint32_t*, int64_t) = nullptr;
  int64_t tile_min = 0, Kp = 0;
  AlignedVector<uint16_t> xv;

  // The orders come from the tier's kernels for this operand's weights
  // (int8 operands quantise x from k order). Buffers may come from an
  // earlier call (Scratch): everything is set again here.
  // bf16_tiles: the tier's tile kernel may run groups of tile_min rows or more.
  void init(const QuantKernels& qk, int bits, int64_t R, int64_t K_, int64_t nb_, int64_t block_size, bool int8_,
            bool zero_points_, bool bf16_tiles = false) {
    tiles = bf16_tiles ? qk.gemm_tiles : nullptr;
    tile_tokens = qk.tile_tokens;
    tile_min = (int8_ ? qk.tile_min_tokens_i8 : qk.tile_min_tokens)[bits == 8 ? 1 : 0];
    Kp = (K_ + 31) / 32 * 32;
    if (tiles && R >= tile_min) xv.resize(size_t(R * Kp));
    K = K_;
    nb = nb_;
    block = nb == 1 ? K : block_size;
    ld = padded_ld(K);
    ldq = (K + 63) / 64 * 64 + (K % 4096 == 0 ? 64 : 0);  // off 4 KiB multiples, as padded_ld
    int8 = int8_;
    zero_points = zero_points_;
    order = int8 ? qk.i8_order(bits, block, K, zero_points_) : TokenOrder::KOrder;
    x_order = int8 ? TokenOrder::KOrder : qk.f_order(bits, block, K, zero_points_);
    positions(xpos, xpos_of, x_order, K);
    positions(qpos, qpos_of, int8 ? order : TokenOrder::KOrder, K);
    x.assign(size_t(R * ld), 0.0f);
    if (int8) {
      q.assign(size_t(R * ldq), 0);
      qscale.assign(size_t(R * nb), 0.0f);
      qsum.assign(size_t(R * nb), 0);
    }
  }
  int64_t pos(int64_t k) const { return xpos.empty() ? k : xpos[size_t(k)]; }
  // pos's table for (order, K), kept from the last call when they match:
  // at one token, K entries rebuilt per call are a visible share of a small
  // node's time.
  static void positions(std::vector<int32_t>& pos, std::pair<TokenOrder, int64_t>& of, TokenOrder o, int64_t K) {
    if (o == TokenOrder::KOrder) {
      pos.clear();
    } else if (of != std::pair<TokenOrder, int64_t>(o, K) || pos.size() != size_t(K)) {
      pos.clear();
      pos.reserve(size_t(K));
      for (int64_t k = 0; k < K; ++k) pos.push_back(int32_t(token_pos(o, k, K)));
    }
    of = {o, K};
  }
  friend size_t heap_bytes(const Operand& o) {
    return heap_bytes(o.x) + heap_bytes(o.q) + heap_bytes(o.qpos) + heap_bytes(o.qscale) + heap_bytes(o.qsum) +
           heap_bytes(o.xpos) + heap_bytes(o.xv);
  }
  // The int8 codes of rows [p0, p1) after x is written.
  void finish(int64_t p0, int64_t p1) {
    if (int8)
      quantize_rows(x.data(), ld, K, block, qpos.empty() ? nullptr : qpos.data(), p0, p1, q.data(), qscale.data(),
                    qsum.data(), ldq, nb);
  }
  // Whether a GEMM over the M rows from p0 runs on the tile kernel.
  bool on_tiles(int64_t M) const { return tiles != nullptr && M >= tile_min; }
  // The VNNI copy of tokens [m0, m1) (default: all) of the group [p0, p1)
  // after x is written (when on_tiles(p1 - p0)); from src instead of x when
  // given (float rows in k order, lds apart, row 0 = token p0).
  void build_tiles(int64_t p0, int64_t p1, int64_t m0 = 0, int64_t m1 = -1, const float* src = nullptr,
                   int64_t lds = 0);
  QTokens tokens(int64_t p0) const {
    QTokens t;
    t.q = q.data() + p0 * ldq;
    t.scale = qscale.data() + p0 * nb;
    t.sum = qsum.data() + p0 * nb;
    t.ld = ldq;
    t.nb = nb;
    t.block = block;
    t.order = order;
    return t;
  }
};

// One GEMM of rows [n0, n1) of w, columns [k0, k1) (default: all), for the
// M routes starting at p0.
void run_gemm(const QuantKernels& qk, const QWeight& w, const Operand& op, int64_t p0, int64_t M, int64_t n0,
              int64_t n1, float* Y, int64_t ldy, int64_t k0 = 0, int64_t k1 = -1);

}  // namespace detail
}  // namespace hinamoe
