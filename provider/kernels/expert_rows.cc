// Per-route expert outputs for the row-streaming tiers (ref, avx2, and the
// f32/f16 weights of the AMX tiers): phase 1 gate/up GEMM + bias +
// activation, phase 2 down GEMM + bias, as (expert, row block) items, run
// as one pass over the pool (run_up_then_down).
//
// NUMA (more than one node): each GEMM phase becomes (a) node-partitioned
// items (node, expert, row block): a worker claims the items of the node it
// runs on first, then steals the other nodes' (nodes without CPUs, fake
// topologies), and computes partial sums over that node's local segments of
// the expert weight (segment table from the plan cache) into the node's
// partial buffer (node 0's is the phase's output buffer itself); then (b) per
// (expert, row block) the partials of nodes 1.. are added in node order and
// the epilogue (bias, activation) runs. One node: the plain path.
#include <cstring>
#include <functional>
#include <memory>

#include "activation.h"
#include "aligned_buffer.h"
#include "moe_work.h"
#include "numa/segment_table.h"
#include "scratch.h"

namespace hinamoe {
namespace detail {
namespace {

// One node's partial of rows [r0, r1) of W [*, K]:
//   P[m*ldp + (r - r0)] = sum over the node's segments (r, k0, k1) of
//                         sum_{k in [k0, k1)} W[r*K + k] * X[m*ldx + k]
// (0 for rows without a local segment). Rows r and r + Tx (Tx = the table's
// period) have the same segments, so each segment of a residue row is one
// strided GEMM over the rows r, r + Tx, ... < r1 (ldw = Tx*K): straight into
// P when Tx == 1 and the row has one segment, else via tmp.
void node_partial(const numa::SegmentTable& tb, int node, const KernelTier& tier, DType dt, const void* W,
                  int64_t K, int64_t r0, int64_t r1, const float* X, int64_t ldx, int64_t M, float* P, int64_t ldp,
                  std::vector<float>& tmp) {
  if (M <= 0 || r1 <= r0) return;
  const size_t es = dtype_size(dt);
  const char* w = static_cast<const char*>(W);
  const GemmRowsStridedFn strided = tier.gemm_rows_strided[int(dt)];
  const GemmRowsFn rows = tier.gemm_rows[int(dt)];
  // out[m*ldo + i] = segment dot of row r + i*step, i < cnt.
  auto seg = [&](int64_t r, int64_t step, int64_t cnt, int64_t k0, int64_t k1, float* out, int64_t ldo) {
    const char* wp = w + size_t(r * K + k0) * es;
    if (strided != nullptr) {
      strided(wp, step * K, k1 - k0, 0, cnt, X + k0, ldx, M, out, ldo);
    } else {
      for (int64_t i = 0; i < cnt; ++i) rows(wp + size_t(i * step * K) * es, k1 - k0, 0, 1, X + k0, ldx, M, out + i, ldo);
    }
  };
  const int64_t Tx = std::max<int64_t>(1, tb.period_rows);
  const bool have = node < tb.nodes;
  const int64_t rlim = std::min(r1, r0 + Tx);  // one row per residue class present in [r0, r1)
  for (int64_t r = r0; r < rlim; ++r) {
    const int64_t rho = r % Tx;
    const int64_t s0 = have ? tb.row_begin[size_t(node)][size_t(rho)] : 0;
    const int64_t s1 = have ? tb.row_begin[size_t(node)][size_t(rho) + 1] : 0;
    const int64_t cnt = (r1 - r + Tx - 1) / Tx;
    if (Tx == 1 && s1 - s0 == 1) {
      const numa::Segment& sg = tb.segments[size_t(node)][size_t(s0)];
      seg(r, 1, cnt, sg.k_start, sg.k_end, P + (r - r0), ldp);
      continue;
    }
    if (s1 == s0) {
      for (int64_t m = 0; m < M; ++m)
        for (int64_t i = 0; i < cnt; ++i) P[m * ldp + (r - r0) + i * Tx] = 0.0f;
      continue;
    }
    if (tmp.size() < size_t(M * cnt)) tmp.resize(size_t(M * cnt));
    for (int64_t si = s0; si < s1; ++si) {
      const numa::Segment& sg = tb.segments[size_t(node)][size_t(si)];
      seg(r, Tx, cnt, sg.k_start, sg.k_end, tmp.data(), cnt);
      for (int64_t m = 0; m < M; ++m) {
        float* p = P + m * ldp + (r - r0);
        const float* q = tmp.data() + m * cnt;
        if (si == s0) {
          for (int64_t i = 0; i < cnt; ++i) p[i * Tx] = q[i];
        } else {
          for (int64_t i = 0; i < cnt; ++i) p[i * Tx] += q[i];
        }
      }
    }
  }
}

// bf16 experts on a tier that multiplies bf16 pairs (tier.gemm_rows_bf16)
// take that path from this many tokens per active expert on average: the
// tokens and the activations are then kept as bf16 rows (the activations
// rounded once, as on the AMX tiers' tiles). Fewer tokens stream the weights
// from DRAM either way, and keep float activations.
constexpr int64_t kPairsMinTokensPerExpert = 4;

}  // namespace

// Row-streaming tiers: per-route expert outputs y [R, H] (float) from
// gemm_rows over the weight rows in place.
void expert_outputs_rows(const MoEShape& shape, const MoEAttrs& at, const MoETensors& t, int64_t t0,
                         const Routes& routes, const KernelTier& tier, const Parallel& par, NumaRun* nr,
                         std::vector<float>* y_out) {
  const int64_t H = shape.hidden, I = shape.inter, E = shape.experts;
  const bool gated = is_gated(at.activation);
  const int64_t N1 = gated ? 2 * I : I;  // scratch row: [gate | up] or interleaved pairs
  // fc1 rows per expert: 2I when gate and up are fused in fc1, else I.
  const int64_t F1 = gated && at.gate_layout != GateLayout::Separate ? 2 * I : I;
  const DType dt = t.dtype;
  const size_t es = dtype_size(dt);
  const GemmRowsFn gemm = tier.gemm_rows[int(dt)];
  const int64_t R = routes.count();
  const int64_t* begin = routes.expert_begin.data();
  int64_t active = 0;
  for (int64_t e = 0; e < E; ++e) active += begin[e + 1] > begin[e];
  const GemmRowsBf16Fn pairs = dt == DType::BF16 && nr == nullptr && R >= kPairsMinTokensPerExpert * active
                                   ? tier.gemm_rows_bf16
                                   : nullptr;

  // xs: gathered inputs [R, ldx]; act: activations [R, lda]; y: the
  // per-route down outputs [R, H]. y is its own buffer: with gate/up and down
  // in one pass, an expert's down items write while other experts' gate/up
  // items still read their inputs.
  const int64_t ldx = padded_ld(H), lda = padded_ld(I);
  // With `pairs`, xs16 / act16 (bf16 rows) replace xs / act.
  Scratch<AlignedVector<float>> xs_s, act_s;
  Scratch<std::vector<float>> h1_s;
  Scratch<std::vector<uint16_t>> xs16_s, act16_s;
  AlignedVector<float> &xs = *xs_s, &act = *act_s;
  std::vector<uint16_t> &xs16 = *xs16_s, &act16 = *act16_s;
  std::vector<float>& h1 = *h1_s;
  std::vector<float>& y = *y_out;
  if (pairs != nullptr) {
    xs16.assign(size_t(R * ldx), 0);
    act16.assign(size_t(R * lda), 0);
  } else {
    xs.assign(size_t(R * ldx), 0.0f);
    act.assign(size_t(R * lda), 0.0f);
  }
  h1.assign(size_t(R * N1), 0.0f);
  y.assign(size_t(R * H), 0.0f);

  if (pairs != nullptr) {  // gather the tokens as they are (bf16)
    const uint16_t* in = static_cast<const uint16_t*>(t.input) + t0 * H;
    maybe_parallel(par, R, R * H, [&](size_t p) {
      std::memcpy(&xs16[p * ldx], in + routes.token[p] * H, size_t(H) * 2);
    });
  } else {  // gather each expert's tokens (grouped order) as float rows
    const int64_t chunk = 16;
    const char* in = static_cast<const char*>(t.input) + t0 * H * es;
    maybe_parallel(par, (R + chunk - 1) / chunk, R * H, [&](size_t c) {
      const int64_t p1 = std::min(R, int64_t(c) * chunk + chunk);
      for (int64_t p = int64_t(c) * chunk; p < p1; ++p) {
        const int64_t tok = routes.token[p];
        float* dst = &xs[p * ldx];
        if (dt == DType::F32) {
          std::memcpy(dst, in + tok * H * 4, size_t(H) * 4);
        } else {
          for (int64_t h = 0; h < H; ++h) dst[h] = load_as_f32(in, tok * H + h, dt);
        }
      }
    });
  }

  // Phase 1: gate/up GEMM, fc1/fc3 bias, activation -> act [R, I]. Without
  // NUMA its per-item work goes into `up` and runs fused with phase 2 below.
  const std::vector<Item> up_items = make_items(routes, E, I, par.threads);
  std::function<void(const Item&)> up;
  const char* fc1 = static_cast<const char*>(t.fc1_w);
  const char* fc3 = static_cast<const char*>(t.fc3_w);
  // Epilogue of an item: bias (per fc1/fc3 row), then the activation.
  auto epilogue = [&](const Item& it) {
    const int64_t e = it.expert, j0 = it.b0, j1 = it.b1;
    const int64_t p0 = begin[e], M = begin[e + 1] - p0;
    const float* Y = &h1[p0 * N1];
    for (int64_t m = 0; m < M; ++m) {
      const float* y = Y + m * N1;
      float* a = pairs ? nullptr : &act[(p0 + m) * lda];
      uint16_t* a16 = pairs ? &act16[(p0 + m) * lda] : nullptr;
      auto put = [&](int64_t j, float v) {
        if (a16 != nullptr) a16[j] = f32_to_bf16(v);
        else a[j] = v;
      };
      if (!gated) {
        for (int64_t j = j0; j < j1; ++j) {
          const float b = t.fc1_b ? load_as_f32(t.fc1_b, e * F1 + j, dt) : 0.0f;
          put(j, activate(at.activation, y[j] + b));
        }
        continue;
      }
      const bool inter = at.gate_layout == GateLayout::Interleaved;
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t gi = inter ? 2 * j : j, ui = inter ? 2 * j + 1 : I + j;
        float g = y[gi], u = y[ui];
        if (t.fc1_b) g += load_as_f32(t.fc1_b, e * F1 + gi, dt);
        if (at.gate_layout == GateLayout::Separate) {
          if (t.fc3_b) u += load_as_f32(t.fc3_b, e * I + j, dt);
        } else if (t.fc1_b) {
          u += load_as_f32(t.fc1_b, e * F1 + ui, dt);
        }
        put(j, activate_gated(at, g, u));
      }
    }
  };
  if (nr == nullptr) {
    up = [&](const Item& it) {
      const int64_t e = it.expert, j0 = it.b0, j1 = it.b1;
      const int64_t p0 = begin[e], M = begin[e + 1] - p0;
      float* Y = &h1[p0 * N1];
      // Rows [r0, r1) of weight w (H columns) into Y's columns from r0 + shift.
      auto rows = [&](const char* w, int64_t r0, int64_t r1, int64_t shift) {
        if (pairs != nullptr)
          pairs(reinterpret_cast<const uint16_t*>(w), H, r0, r1, &xs16[p0 * ldx], ldx, M, Y + r0 + shift, N1);
        else
          gemm(w, H, r0, r1, &xs[p0 * ldx], ldx, M, Y + r0 + shift, N1);
      };
      const char* w1 = fc1 + e * F1 * H * es;
      if (!gated) {
        rows(w1, j0, j1, 0);
      } else if (at.gate_layout == GateLayout::Interleaved) {
        rows(w1, 2 * j0, 2 * j1, 0);
      } else if (at.gate_layout == GateLayout::Stacked) {
        rows(w1, j0, j1, 0);
        rows(w1, I + j0, I + j1, 0);
      } else {
        rows(w1, j0, j1, 0);
        rows(fc3 + e * I * H * es, j0, j1, I);
      }
      epilogue(it);
    };
  } else {
    // (a) node partials: node 0 into h1, node n > 0 into part[n - 1].
    const int nodes = nr->nodes;
    std::vector<std::shared_ptr<const numa::SegmentTable>> tab1(static_cast<size_t>(E)), tab3(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      if (begin[e + 1] == begin[e]) continue;
      tab1[e] = weight_table(*nr, fc1 + e * F1 * H * es, F1, H, dt);
      if (gated && at.gate_layout == GateLayout::Separate) tab3[e] = weight_table(*nr, fc3 + e * I * H * es, I, H, dt);
    }
    const int64_t stride = R * N1;
    std::vector<float> part(size_t((nodes - 1) * stride));
    run_node_items(par, *nr, up_items.size(), [&](int node, size_t i, std::vector<float>& tmp) {
      const Item it = up_items[i];
      const int64_t e = it.expert, j0 = it.b0, j1 = it.b1;
      const int64_t p0 = begin[e], M = begin[e + 1] - p0;
      const float* X = &xs[p0 * ldx];
      float* Y = (node == 0 ? h1.data() : &part[(node - 1) * stride]) + p0 * N1;
      const void* w1 = fc1 + e * F1 * H * es;
      const numa::SegmentTable& t1 = *tab1[e];
      if (!gated) {
        node_partial(t1, node, tier, dt, w1, H, j0, j1, X, ldx, M, Y + j0, N1, tmp);
      } else if (at.gate_layout == GateLayout::Interleaved) {
        node_partial(t1, node, tier, dt, w1, H, 2 * j0, 2 * j1, X, ldx, M, Y + 2 * j0, N1, tmp);
      } else if (at.gate_layout == GateLayout::Stacked) {
        node_partial(t1, node, tier, dt, w1, H, j0, j1, X, ldx, M, Y + j0, N1, tmp);
        node_partial(t1, node, tier, dt, w1, H, I + j0, I + j1, X, ldx, M, Y + I + j0, N1, tmp);
      } else {
        node_partial(t1, node, tier, dt, w1, H, j0, j1, X, ldx, M, Y + j0, N1, tmp);
        node_partial(*tab3[e], node, tier, dt, fc3 + e * I * H * es, H, j0, j1, X, ldx, M, Y + I + j0, N1, tmp);
      }
    });
    // (b) reduction in node order, then the epilogue.
    par.for_each(up_items.size(), [&](size_t i) {
      const Item it = up_items[i];
      const int64_t e = it.expert, j0 = it.b0, j1 = it.b1;
      const int64_t p0 = begin[e], M = begin[e + 1] - p0;
      float* Y = &h1[p0 * N1];
      const float* Pp = part.data() + p0 * N1;
      if (!gated) {
        add_partials(Y, Pp, nodes, stride, M, N1, j0, j1);
      } else if (at.gate_layout == GateLayout::Interleaved) {
        add_partials(Y, Pp, nodes, stride, M, N1, 2 * j0, 2 * j1);
      } else {
        add_partials(Y, Pp, nodes, stride, M, N1, j0, j1);
        add_partials(Y, Pp, nodes, stride, M, N1, I + j0, I + j1);
      }
      epilogue(it);
    });
  }

  // Phase 2: down GEMM + fc2 bias -> per-route rows y.
  float* yr = y.data();
  {
    const std::vector<Item> items = make_items(routes, E, H, par.threads);
    const char* fc2 = static_cast<const char*>(t.fc2_w);
    auto add_bias = [&](const Item& it) {
      if (!t.fc2_b) return;
      const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
      for (int64_t n = it.b0; n < it.b1; ++n) {
        const float b = load_as_f32(t.fc2_b, e * H + n, dt);
        for (int64_t m = 0; m < M; ++m) yr[(p0 + m) * H + n] += b;
      }
    };
    if (nr == nullptr) {
      run_up_then_down(par, up_items, items, E, up, [&](const Item& it) {
        const int64_t e = it.expert, n0 = it.b0, n1 = it.b1;
        const int64_t p0 = begin[e], M = begin[e + 1] - p0;
        const char* w2 = fc2 + e * H * I * es;
        if (pairs != nullptr)
          pairs(reinterpret_cast<const uint16_t*>(w2), I, n0, n1, &act16[p0 * lda], lda, M, yr + p0 * H + n0, H);
        else
          gemm(w2, I, n0, n1, &act[p0 * lda], lda, M, yr + p0 * H + n0, H);
        add_bias(it);
      });
    } else {
      const int nodes = nr->nodes;
      std::vector<std::shared_ptr<const numa::SegmentTable>> tab2(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e)
        if (begin[e + 1] > begin[e]) tab2[e] = weight_table(*nr, fc2 + e * H * I * es, H, I, dt);
      const int64_t stride = R * H;
      std::vector<float> part(size_t((nodes - 1) * stride));
      run_node_items(par, *nr, items.size(), [&](int node, size_t i, std::vector<float>& tmp) {
        const Item it = items[i];
        const int64_t e = it.expert, n0 = it.b0, n1 = it.b1;
        const int64_t p0 = begin[e], M = begin[e + 1] - p0;
        float* Y = (node == 0 ? yr : &part[(node - 1) * stride]) + p0 * H;
        node_partial(*tab2[e], node, tier, dt, fc2 + e * H * I * es, I, n0, n1, &act[p0 * lda], lda, M, Y + n0, H,
                     tmp);
      });
      par.for_each(items.size(), [&](size_t i) {
        const Item it = items[i];
        const int64_t p0 = begin[it.expert], M = begin[it.expert + 1] - p0;
        add_partials(yr + p0 * H, part.data() + p0 * H, nodes, stride, M, H, it.b0, it.b1);
        add_bias(it);
      });
    }
  }
}

}  // namespace detail
}  // namespace hinamoe
