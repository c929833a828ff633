// The HiNa micro-kernel and the two per-expert phases, written once over a
// TileOps policy (tile_ops.h). Everything here is a template on Ops, so the
// real instantiation can be compiled under an AMX target pragma without
// touching code shared with other translation units.
//
// C^T = W * I^T (DESIGN.md §4): the weight W [N, K] row-major is the A
// operand exactly where it lies (tile rows = output features, 64 bytes = 32
// bf16 along K, stride K*2 bytes); the tokens are the B operand, already in
// VNNI order. Tiles (Algorithm 1): tmm0-1 tokens, tmm2-3 W, tmm4-7 fp32
// accumulators, m_r = n_r = 32, or m_r = M (down to 1: colsb = 4) for small M.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../moe/activation.h"
#include "../numa/segment_table.h"
#include "amx_layout.h"
#include "block_epilogue.h"
#include "tile_ops.h"

namespace hinamoe {
namespace amx {

// Accumulator block written by the micro-kernel: fp32 [32 rows of W][32 tokens].
constexpr int kAccLd = 32;

template <class Ops>
class HinaMicroKernel {
 public:
  explicit HinaMicroKernel(Ops& ops) : ops_(ops) {}

  // C[r][c] = sum_{k<K} A(r, k) * tok(k, mb + c) for r < ra0 + ra1, c < mt,
  // where A rows 0..ra0-1 are A0[r*K + k] and rows 16..16+ra1-1 are
  // A1[(r-16)*K + k] (ra0 <= 16, ra1 <= 16, ra1 > 0 only if ra0 == 16 or the
  // caller keeps gate rows 0..15 / up rows 16..31 apart). tok is a VNNI
  // buffer (K padded to 32) of M tokens. Rows of C past ra0 (up to 16) are
  // not written. stream: load W with TILELOADDT1. A staged operand may be
  // laid out otherwise: rows lda elements apart (0: K) and consecutive
  // 32-column blocks kpitch elements apart (K a multiple of 32 then).
  void run(const uint16_t* A0, int ra0, const uint16_t* A1, int ra1, int64_t K, const uint16_t* tok,
           int64_t M, int64_t mb, int mt, bool stream, float* C, int64_t lda_elems = 0, int64_t kpitch = 32) {
    const int mt0 = std::min(mt, 16), mt1 = mt - mt0;
    reshape(ra0, ra1, mt0, mt1);
    const bool w1 = ra1 > 0, t1 = mt1 > 0;
    ops_.template zero<4>();
    if (t1) ops_.template zero<5>();
    if (w1) ops_.template zero<6>();
    if (w1 && t1) ops_.template zero<7>();

    const int64_t lda = (lda_elems ? lda_elems : K) * 2, ldb = 4 * M;  // bytes
    const char* tb = reinterpret_cast<const char*>(tok + 2 * mb);
    const int64_t kfull = K / 32 * 32;
    for (int64_t kb = 0; kb < kfull; kb += 32) {
      const char* bk = tb + (kb / 2) * ldb;
      const int64_t ka = kb / 32 * kpitch;
      ops_.template load<0>(bk, ldb);
      if (t1) ops_.template load<1>(bk + 64, ldb);
      load_w<2>(A0 + ka, lda, stream);
      if (w1) load_w<3>(A1 + ka, lda, stream);
      dot(w1, t1);
    }
    if (kfull < K) {
      // K tail: the only place W is staged — the last K%32 columns of these
      // rows, zero-padded, so tile shapes (and the live accumulators) stay.
      alignas(64) uint16_t st[32][32];
      std::memset(st, 0, sizeof(st));
      const size_t tail = size_t(K - kfull) * 2;
      for (int r = 0; r < ra0; ++r) std::memcpy(st[r], A0 + r * K + kfull, tail);
      for (int r = 0; r < ra1; ++r) std::memcpy(st[16 + r], A1 + r * K + kfull, tail);
      ops_.staged(st);
      const char* bk = tb + (kfull / 2) * ldb;  // token side is zero-padded to 32
      ops_.template load<0>(bk, ldb);
      if (t1) ops_.template load<1>(bk + 64, ldb);
      ops_.template load<2>(st[0], 64);
      if (w1) ops_.template load<3>(st[16], 64);
      dot(w1, t1);
    }
    store_acc(w1, t1, C);
  }

  // NUMA variant (paper §5.3, Algorithm 2): C[r][c] = sum over the segments
  // [k0, k1) in segs[0..nseg) of sum_{k in [k0, k1)} A(r, k) * tok(k, mb + c),
  // where A rows 0..ra0-1 are A0[r*lda + k] and rows 16.. are A1[(r-16)*lda + k]
  // (lda in elements: Tx*K for the rows r, r + Tx, ... that share a period
  // row's segments). The accumulators stay live across all segments. k-steps
  // follow the token buffer's 32-blocks; a block the segment only partly
  // covers is staged with zeros outside [k0, k1) on both operands, so W is
  // read only inside the segment (locality, and no read past a row's end) and
  // tokens outside it contribute exactly nothing (no 0 * inf).
  void run_segments(const uint16_t* A0, int ra0, const uint16_t* A1, int ra1, int64_t lda,
                    const numa::Segment* segs, int64_t nseg, const uint16_t* tok, int64_t M, int64_t mb, int mt,
                    bool stream, float* C) {
    const int mt0 = std::min(mt, 16), mt1 = mt - mt0;
    reshape(ra0, ra1, mt0, mt1);
    const bool w1 = ra1 > 0, t1 = mt1 > 0;
    ops_.template zero<4>();
    if (t1) ops_.template zero<5>();
    if (w1) ops_.template zero<6>();
    if (w1 && t1) ops_.template zero<7>();

    const int64_t ldab = lda * 2, ldb = 4 * M;  // bytes
    const char* tb = reinterpret_cast<const char*>(tok + 2 * mb);
    for (int64_t s = 0; s < nseg; ++s) {
      const int64_t k0 = segs[s].k_start, k1 = segs[s].k_end;
      for (int64_t kb = k0 / 32 * 32; kb < k1; kb += 32) {
        if (kb >= k0 && kb + 32 <= k1) {  // a whole block inside the segment: straight from W
          const char* bk = tb + (kb / 2) * ldb;
          ops_.template load<0>(bk, ldb);
          if (t1) ops_.template load<1>(bk + 64, ldb);
          load_w<2>(A0 + kb, ldab, stream);
          if (w1) load_w<3>(A1 + kb, ldab, stream);
        } else {
          stage_edge(A0, ra0, A1, ra1, lda, tb, ldb, mt, kb, std::max(k0, kb), std::min(k1, kb + 32));
          ops_.template load<0>(stok_[0], 128);
          if (t1) ops_.template load<1>(&stok_[0][32], 128);
          ops_.template load<2>(stw_[0], 64);
          if (w1) ops_.template load<3>(stw_[16], 64);
        }
        dot(w1, t1);
      }
    }
    store_acc(w1, t1, C);
  }

 private:
  void store_acc(bool w1, bool t1, float* C) {
    constexpr int64_t ldc = kAccLd * 4;
    ops_.template store<4>(C, ldc);
    if (t1) ops_.template store<5>(C + 16, ldc);
    if (w1) ops_.template store<6>(C + 16 * kAccLd, ldc);
    if (w1 && t1) ops_.template store<7>(C + 16 * kAccLd + 16, ldc);
  }

  // Stages k in [lo, hi) of the 32-block at kb: W rows into stw_ (one tile
  // row of 32 bf16 per weight row), tokens mb.. into stok_ (VNNI rows of 32
  // tokens), zero elsewhere.
  void stage_edge(const uint16_t* A0, int ra0, const uint16_t* A1, int ra1, int64_t lda, const char* tb,
                  int64_t ldb, int mt, int64_t kb, int64_t lo, int64_t hi) {
    std::memset(stw_, 0, sizeof(stw_));
    std::memset(stok_, 0, sizeof(stok_));
    const size_t bytes = size_t(hi - lo) * 2;
    for (int r = 0; r < ra0; ++r) std::memcpy(&stw_[r][lo - kb], A0 + r * lda + lo, bytes);
    for (int r = 0; r < ra1; ++r) std::memcpy(&stw_[16 + r][lo - kb], A1 + r * lda + lo, bytes);
    for (int64_t k = lo; k < hi; ++k) {
      const int64_t i = (k - kb) / 2, h = k & 1;  // VNNI row and half of the pair
      const uint16_t* src = reinterpret_cast<const uint16_t*>(tb + (kb / 2 + i) * ldb) + h;
      for (int c = 0; c < mt; ++c) stok_[i][2 * c + h] = src[2 * c];
    }
    ops_.staged(stw_);
    ops_.staged(stok_);
  }

  template <int T>
  void load_w(const uint16_t* p, int64_t lda, bool stream) {
    if (stream) ops_.template stream_load<T>(p, lda);
    else ops_.template load<T>(p, lda);
  }

  void dot(bool w1, bool t1) {
    ops_.template dp_bf16<4, 2, 0>();
    if (t1) ops_.template dp_bf16<5, 2, 1>();
    if (w1) ops_.template dp_bf16<6, 3, 0>();
    if (w1 && t1) ops_.template dp_bf16<7, 3, 1>();
  }

  // LDTILECFG only when the edge shape changes (it also zeroes the tiles).
  void reshape(int ra0, int ra1, int mt0, int mt1) {
    const int want[4] = {ra0, ra1, mt0, mt1};
    if (have_ && std::memcmp(want, cur_, sizeof(want)) == 0) return;
    TileConfig c = blank_palette1();
    set_tile(&c, 0, 16, 4 * mt0);
    if (mt1) set_tile(&c, 1, 16, 4 * mt1);
    set_tile(&c, 2, ra0, 64);
    if (ra1) set_tile(&c, 3, ra1, 64);
    set_tile(&c, 4, ra0, 4 * mt0);
    if (mt1) set_tile(&c, 5, ra0, 4 * mt1);
    if (ra1) set_tile(&c, 6, ra1, 4 * mt0);
    if (ra1 && mt1) set_tile(&c, 7, ra1, 4 * mt1);
    ops_.configure(c);
    std::memcpy(cur_, want, sizeof(want));
    have_ = true;
  }

  Ops& ops_;
  bool have_ = false;
  int cur_[4] = {};
  alignas(64) uint16_t stw_[32][32];   // staged W block (run_segments edges)
  alignas(64) uint16_t stok_[16][64];  // staged token block: 16 VNNI rows x 32 tokens
};

// Token blocks of a W panel run forward on even panels and backward on odd
// ones: with M > 32 the last block has another shape, and this order needs
// one LDTILECFG per panel instead of two. The W panel itself is re-read
// from cache (not memory) for each token block. (A template on Ops only so
// that, like everything here, it is compiled per instantiation.)
template <class Ops>
inline int64_t zigzag(int64_t ib, int64_t nmb, int64_t panel) {
  return (panel & 1) ? nmb - 1 - ib : ib;
}

template <class Ops>
void gate_up_block(Ops& ops, const MoEAttrs& at, int64_t H, int64_t I, const uint16_t* fc1_w, const void* fc1_b,
                   const uint16_t* fc3_w, const void* fc3_b, DType bdt, const uint16_t* xv, int64_t M,
                   int64_t j0, int64_t j1, uint16_t* actv) {
  if (j1 == I) vnni_zero_tail(I, M, actv);
  if (M <= 0 || j0 >= j1) return;
  const bool gated = is_gated(at.activation);
  const bool inter = gated && at.gate_layout == GateLayout::Interleaved;
  const bool stacked = gated && at.gate_layout == GateLayout::Stacked;
  const uint16_t* upw = stacked ? fc1_w + I * H : fc3_w;  // Stacked / Separate up rows
  const bool stream = M <= 32;  // W is used once: keep it out of the cache
  const int64_t jstep = gated ? 16 : 32;

  HinaMicroKernel<Ops> mk(ops);
  alignas(64) float C[32 * kAccLd];
  alignas(64) float act[32 * kAccLd];
  float bg[32], bu[32];
  for (int64_t j = j0; j < j1; j += jstep) {
    const int jr = int(std::min(jstep, j1 - j));
    const uint16_t *A0, *A1;
    int ra0, ra1;
    if (!gated) {  // rows j..j+jr of W1
      A0 = fc1_w + j * H; ra0 = std::min(jr, 16);
      ra1 = jr - ra0;     A1 = ra1 ? A0 + 16 * H : A0;
    } else if (inter) {  // rows 2j..2j+2jr: gate/up pairs never straddle a tile
      A0 = fc1_w + 2 * j * H; ra0 = std::min(2 * jr, 16);
      ra1 = 2 * jr - ra0;     A1 = ra1 ? A0 + 16 * H : A0;
    } else {  // gate rows in tmm2, up rows in tmm3
      A0 = fc1_w + j * H; ra0 = jr;
      A1 = upw + j * H;   ra1 = jr;
    }
    gate_up_biases(at, I, fc1_b, fc3_b, bdt, j, jr, bg, bu);
    const int64_t nmb = (M + 31) / 32;
    for (int64_t ib = 0; ib < nmb; ++ib) {
      const int64_t mb = 32 * zigzag<Ops>(ib, nmb, (j - j0) / jstep);
      const int mt = int(std::min<int64_t>(32, M - mb));
      mk.run(A0, ra0, A1, ra1, H, xv, M, mb, mt, stream, C);
      // Epilogue on the accumulators: bias + activation, then transform 2.
      const int64_t gs = inter ? 2 * kAccLd : kAccLd;
      activate_rows(at, C, gs, inter ? C + kAccLd : C + 16 * kAccLd, gs, bg, bu, jr, mt, act, kAccLd);
      store_vnni_block(act, kAccLd, jr, mt, j, mb, M, actv);
    }
  }
}

template <class Ops>
void down_block(Ops& ops, int64_t H, int64_t I, const uint16_t* fc2_w, const void* fc2_b, DType bdt,
                const uint16_t* actv, int64_t M, int64_t h0, int64_t h1, const float* route_weight,
                bool accumulate, float* y, int64_t ldy) {
  (void)H;
  if (M <= 0 || h0 >= h1) return;
  const bool stream = M <= 32;
  HinaMicroKernel<Ops> mk(ops);
  alignas(64) float C[32 * kAccLd];
  float bias[32];
  for (int64_t h = h0; h < h1; h += 32) {
    const int hr = int(std::min<int64_t>(32, h1 - h));
    const int ra0 = std::min(hr, 16), ra1 = hr - ra0;
    const uint16_t* A0 = fc2_w + h * I;
    for (int r = 0; r < hr; ++r) bias[r] = fc2_b ? load_as_f32(fc2_b, h + r, bdt) : 0.0f;
    const int64_t nmb = (M + 31) / 32;
    for (int64_t ib = 0; ib < nmb; ++ib) {
      const int64_t mb = 32 * zigzag<Ops>(ib, nmb, (h - h0) / 32);
      const int mt = int(std::min<int64_t>(32, M - mb));
      mk.run(A0, ra0, ra1 ? A0 + 16 * I : A0, ra1, I, actv, M, mb, mt, stream, C);
      // Transform 3: [h][m] -> rows [m][h], times the routing weight.
      store_transposed(C, kAccLd, hr, mt, fc2_b ? bias : nullptr, route_weight, h, mb, accumulate, y, ldy);
    }
  }
}

// One NUMA node's partial of rows [r0, r1) of a bf16 weight W [*, K]
// (paper §5.3, Algorithm 2), tokens tok in the VNNI layout (K, M):
//   P[(r - r0)*ldp + m] = sum over the node's segments (r, k0, k1) of
//                         sum_{k in [k0, k1)} W[r*K + k] * tok(k, m)
// for m < M; rows without a local segment get 0. Tile rows are rows with
// the same segments: in a periodic table, rows r, r + Tx, ... (Tx = the
// period) have the segments of period row r mod Tx, so each residue class
// present in [r0, r1) is one A operand with row stride Tx*K; in a page-map
// table (any placement), runs of consecutive rows with equal segments (row
// stride K). Either is cut into panels of up to 32 rows; all of a row's
// segments accumulate in the tiles before one store.
template <class Ops>
void node_partial(Ops& ops, const numa::SegmentTable& tb, int node, const uint16_t* W, int64_t K, int64_t r0,
                  int64_t r1, const uint16_t* tok, int64_t M, float* P, int64_t ldp) {
  if (M <= 0 || r1 <= r0) return;
  const bool stream = M <= 32;
  const int64_t Tx = std::max<int64_t>(1, tb.period_rows);
  const bool have = node >= 0 && node < tb.nodes;
  HinaMicroKernel<Ops> mk(ops);
  alignas(64) float C[32 * kAccLd];
  const int64_t nmb = (M + 31) / 32;
  int64_t panel = 0;
  // Segments [s0, s1) of segments[node] that row r uses.
  auto segs_of = [&](int64_t r, int64_t* s0, int64_t* s1) {
    const int64_t rho = r % Tx;
    *s0 = have ? tb.row_begin[size_t(node)][size_t(rho)] : 0;
    *s1 = have ? tb.row_begin[size_t(node)][size_t(rho) + 1] : 0;
  };
  // Rows r, r + step, ... (cnt <= 32 of them) over segments [s0, s1).
  auto rows_panel = [&](int64_t r, int64_t step, int cnt, int64_t s0, int64_t s1) {
    if (s1 == s0) {
      for (int i = 0; i < cnt; ++i) std::fill(P + (r + i * step - r0) * ldp, P + (r + i * step - r0) * ldp + M, 0.0f);
      return;
    }
    const int ra0 = std::min(cnt, 16), ra1 = cnt - ra0;
    const uint16_t* A0 = W + r * K;
    const uint16_t* A1 = ra1 ? A0 + 16 * step * K : A0;
    const numa::Segment* segs = &tb.segments[size_t(node)][size_t(s0)];
    for (int64_t ib = 0; ib < nmb; ++ib) {
      const int64_t mb = 32 * zigzag<Ops>(ib, nmb, panel);
      const int mt = int(std::min<int64_t>(32, M - mb));
      mk.run_segments(A0, ra0, A1, ra1, step * K, segs, s1 - s0, tok, M, mb, mt, stream, C);
      for (int q = 0; q < cnt; ++q)
        std::memcpy(P + (r + q * step - r0) * ldp + mb, C + q * kAccLd, size_t(mt) * sizeof(float));
    }
    ++panel;
  };
  if (tb.periodic) {
    for (int64_t r = r0; r < std::min(r1, r0 + Tx); ++r) {
      int64_t s0, s1;
      segs_of(r, &s0, &s1);
      const int64_t cnt = (r1 - r + Tx - 1) / Tx;  // rows r + i*Tx < r1
      for (int64_t i0 = 0; i0 < cnt; i0 += 32)
        rows_panel(r + i0 * Tx, Tx, int(std::min<int64_t>(32, cnt - i0)), s0, s1);
    }
    return;
  }
  const std::vector<numa::Segment>* segv = have ? &tb.segments[size_t(node)] : nullptr;
  auto same = [&](int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
    if (a1 - a0 != b1 - b0) return false;
    for (int64_t i = 0; i < a1 - a0; ++i) {
      const numa::Segment &x = (*segv)[size_t(a0 + i)], &y = (*segv)[size_t(b0 + i)];
      if (x.k_start != y.k_start || x.k_end != y.k_end) return false;
    }
    return true;
  };
  for (int64_t r = r0; r < r1;) {
    int64_t s0, s1, t0, t1;
    segs_of(r, &s0, &s1);
    int cnt = 1;
    while (cnt < 32 && r + cnt < r1) {
      segs_of(r + cnt, &t0, &t1);
      if (!same(s0, s1, t0, t1)) break;
      ++cnt;
    }
    rows_panel(r, 1, cnt, s0, s1);
    r += cnt;
  }
}

}  // namespace amx
}  // namespace hinamoe
