// The QMoE driver: QMoE routing -> gather (float, plus int8 copies for
// accuracy_level 4) -> gate/up items -> activation -> down items -> weighted
// combine. Reuses the MoE driver's work split (make_items, run_up_then_down)
// and activations; only the GEMMs differ (quantised kernels of the tier).
#include "qmoe_ffn.h"

#include "../amx/amx_detect.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "../activation.h"
#include "../aligned_buffer.h"
#include "../moe_work.h"
#include "../scratch.h"
#include "qmoe_routing.h"
#include "qoperand.h"

namespace hinamoe {
namespace {

using namespace detail;

constexpr int64_t kScratchBudgetBytes = int64_t(256) << 20;

// Expert e's weight of [E, rows, cols] with nb scale blocks per row.
// block: block_size (the last of the nb blocks may be shorter); ignored row-wise.
QWeight expert_weight(const uint8_t* codes, const void* scales, const uint8_t* zp, DType sdt, int bits,
                      int64_t rows, int64_t cols, int64_t nb, int64_t block, int64_t e) {
  QWeight w;
  w.bits = bits;
  w.K = cols;
  w.nb = nb;
  w.block = nb == 1 ? cols : block;
  w.scale_dtype = sdt;
  w.codes = codes + e * rows * w.row_bytes();
  w.scales = static_cast<const char*>(scales) + size_t(e * rows * nb) * dtype_size(sdt);
  if (zp != nullptr) {
    const int64_t pack = 8 / bits;
    const int64_t per_expert = nb == 1 ? (rows + pack - 1) / pack : rows * ((nb + pack - 1) / pack);
    w.zero_points = zp + e * per_expert;
  }
  return w;
}

// Where the NUMA path may cut w's rows (elements) for operand op: at
// multiples of the block (whole scales), of two blocks with 4-bit zero
// points (a byte holds two), and of 128, so every token order's group stays
// whole (token_pos maps k0 to k0). A slice's kernel must read op's order:
// the tiers' orders depend on K only modulo 128 (QuantKernels), so the
// inner slices (K a multiple of g) and the last (K mod g more) are checked
// once; where they differ (K = 272 runs the avx2 kernels on the avx512 tier,
// a slice of 256 the zmm ones), and with a partial last block: whole rows.
int64_t cut_granule(const QuantKernels& qk, const QWeight& w, const Operand& op) {
  if (w.K % w.block != 0) return w.K;
  int64_t g = 128;
  if (w.nb > 1) {  // block-wise
    g = std::max(g, w.block);
    if (w.zero_points != nullptr && w.bits == 4) g = std::max(g, 2 * w.block);
  }
  auto order = [&](int64_t K) {
    const int64_t block = w.nb > 1 ? w.block : K;
    return op.int8 ? qk.i8_order(w.bits, block, K, op.zero_points) : qk.f_order(w.bits, block, K, op.zero_points);
  };
  const TokenOrder want = op.int8 ? op.order : op.x_order;
  if (order(g) != want || order(g + w.K % g) != want) return w.K;
  return g;
}

// One node's partial of rows [r0, r1) of w (NUMA):
//   P[m*ldp + (r - r0)] = sum over the node's segments (r, k0, k1) of row r
//                         of the dot of w[r, k0:k1] with the route's tokens
// (0 for rows without a local segment). Neighbouring rows with the same
// segments (the rows of one page) share each kernel call.
void node_partial(const numa::SegmentTable& tb, int node, const QuantKernels& qk, const QWeight& w,
                  const Operand& op, int64_t p0, int64_t M, int64_t r0, int64_t r1, float* P, int64_t ldp,
                  std::vector<float>& tmp) {
  if (M <= 0 || r1 <= r0) return;
  const int64_t Tx = std::max<int64_t>(1, tb.period_rows);
  const bool have = node < tb.nodes;
  auto segs = [&](int64_t r, const numa::Segment** first) {
    if (!have) return int64_t(0);
    const std::vector<int64_t>& rb = tb.row_begin[size_t(node)];
    const int64_t rho = r % Tx, s0 = rb[size_t(rho)];
    *first = tb.segments[size_t(node)].data() + s0;
    return rb[size_t(rho) + 1] - s0;
  };
  auto same = [](const numa::Segment* a, const numa::Segment* b, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      if (a[i].k_start != b[i].k_start || a[i].k_end != b[i].k_end) return false;
    return true;
  };
  for (int64_t r = r0; r < r1;) {
    const numa::Segment* sg = nullptr;
    const int64_t ns = segs(r, &sg);
    int64_t e = r + 1;
    for (const numa::Segment* sg2 = nullptr; e < r1 && segs(e, &sg2) == ns && (ns == 0 || same(sg, sg2, ns));) ++e;
    float* out = P + (r - r0);
    if (ns == 0) {
      for (int64_t m = 0; m < M; ++m) std::fill(out + m * ldp, out + m * ldp + (e - r), 0.0f);
    } else {
      run_gemm(qk, w, op, p0, M, r, e, out, ldp, sg[0].k_start, sg[0].k_end);
      if (ns > 1) {
        const int64_t cnt = e - r;
        if (tmp.size() < size_t(M * cnt)) tmp.resize(size_t(M * cnt));
        for (int64_t i = 1; i < ns; ++i) {
          run_gemm(qk, w, op, p0, M, r, e, tmp.data(), cnt, sg[i].k_start, sg[i].k_end);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t c = 0; c < cnt; ++c) out[m * ldp + c] += tmp[size_t(m * cnt + c)];
        }
      }
    }
    r = e;
  }
}

std::string run_chunk(const MoEShape& shape, const QMoEAttrs& qa, const QMoETensors& t, int64_t t0,
                      int64_t tokens, const QuantKernels& qk, const Parallel& par, NumaRun* nr) {
  const MoEAttrs& at = qa.moe;
  const int64_t H = shape.hidden, I = shape.inter, E = shape.experts, k = at.k;
  const DType dt = t.dtype;
  const size_t es = dtype_size(dt);
  const bool gated = is_gated(at.activation);
  const int64_t N1 = gated ? 2 * I : I;
  const int64_t F1 = gated && at.gate_layout != GateLayout::Separate ? 2 * I : I;

  Routes routes;
  std::string err = compute_qmoe_routes(
      static_cast<const char*>(t.router) + t0 * E * es,
      t.router_weights ? static_cast<const char*>(t.router_weights) + t0 * E * es : nullptr, dt, tokens, E, k,
      at.normalize_routing_weights, par, &routes, t0);
  if (!err.empty()) return err;
  const int64_t R = routes.count();
  const int64_t* begin = routes.expert_begin.data();
  if (R == 0) {
    char* out = static_cast<char*>(t.output) + t0 * H * es;
    std::memset(out, 0, size_t(tokens * H) * es);  // +0.0 in every T
    return "";
  }

  // int8 tokens only for block-wise weights (row-wise ones keep float).
  const bool i8_1 = qa.int8_activations && t.fc1_nb > 1 && (!t.fc3_w || t.fc3_nb == t.fc1_nb);
  const bool i8_2 = qa.int8_activations && t.fc2_nb > 1;
  Scratch<Operand> in1_s, in2_s;
  Operand &in1 = *in1_s, &in2 = *in2_s;
  // fc1 and fc3 share the operand: an order for zero points when either has them.
  const bool zp1 = t.fc1_zp != nullptr || (t.fc3_w != nullptr && t.fc3_zp != nullptr);
  const bool tiles = qa.bf16_tiles && nr == nullptr;  // NUMA slices stay on the vector kernels
  in1.init(qk, qa.bits, R, H, t.fc1_nb, qa.block_size, i8_1, zp1, tiles);
  in2.init(qk, qa.bits, R, I, t.fc2_nb, qa.block_size, i8_2, t.fc2_zp != nullptr, tiles);
  Scratch<std::vector<float>> h1_s, y_s;
  std::vector<float> &h1 = *h1_s, &y = *y_s;
  h1.assign(size_t(R * N1), 0.0f);
  y.assign(size_t(R * H), 0.0f);

  // Gather each expert's tokens as float rows (+ int8 codes).
  {
    const int64_t chunk = 16;
    const char* in = static_cast<const char*>(t.input) + t0 * H * es;
    maybe_parallel(par, (R + chunk - 1) / chunk, R * H, [&](size_t c) {
      const int64_t q0 = int64_t(c) * chunk, q1 = std::min(R, q0 + chunk);
      for (int64_t p = q0; p < q1; ++p) {
        float* dst = &in1.x[size_t(p * in1.ld)];
        const int64_t tok = routes.token[size_t(p)];
        if (in1.x_order != TokenOrder::KOrder) {
          for (int64_t h = 0; h < H; ++h) dst[in1.pos(h)] = load_as_f32(in, tok * H + h, dt);
        } else {
          for (int64_t h = 0; h < H; ++h) dst[h] = load_as_f32(in, tok * H + h, dt);
        }
      }
      in1.finish(q0, q1);
    });
    maybe_parallel(par, E, R * H, [&](size_t e) { in1.build_tiles(begin[e], begin[e + 1]); });
  }

  auto w1 = [&](int64_t e) { return expert_weight(t.fc1_w, t.fc1_s, t.fc1_zp, t.scale_dtype, qa.bits, F1, H, t.fc1_nb, qa.block_size, e); };
  auto w3 = [&](int64_t e) { return expert_weight(t.fc3_w, t.fc3_s, t.fc3_zp, t.scale_dtype, qa.bits, I, H, t.fc3_nb, qa.block_size, e); };
  auto w2 = [&](int64_t e) { return expert_weight(t.fc2_w, t.fc2_s, t.fc2_zp, t.scale_dtype, qa.bits, H, I, t.fc2_nb, qa.block_size, e); };

  // Phase 1: gate/up GEMMs into h1 (gemm(weight, fc, rows, Y) per weight
  // row range, fc 1 or 3), then biases and the activation -> in2.x.
  auto up_gemms = [&](const Item& it, float* h, auto&& gemm) {
    const int64_t e = it.expert, j0 = it.b0, j1 = it.b1;
    float* Y = h + begin[e] * N1;
    const QWeight a = w1(e);
    if (!gated) {
      gemm(a, 1, j0, j1, Y + j0);
    } else if (at.gate_layout == GateLayout::Interleaved) {
      gemm(a, 1, 2 * j0, 2 * j1, Y + 2 * j0);
    } else if (at.gate_layout == GateLayout::Stacked) {
      gemm(a, 1, j0, j1, Y + j0);
      gemm(a, 1, I + j0, I + j1, Y + I + j0);
    } else {
      gemm(a, 1, j0, j1, Y + j0);
      gemm(w3(e), 3, j0, j1, Y + I + j0);
    }
  };
  auto activation = [&](const Item& it) {
    const int64_t e = it.expert, j0 = it.b0, j1 = it.b1;
    const int64_t p0 = begin[e], M = begin[e + 1] - p0;
    const float* Y = &h1[size_t(p0 * N1)];
    for (int64_t m = 0; m < M; ++m) {
      const float* yv = Y + m * N1;
      float* av = &in2.x[size_t((p0 + m) * in2.ld)];
      if (!gated) {
        for (int64_t j = j0; j < j1; ++j) {
          const float b = t.fc1_b ? load_as_f32(t.fc1_b, e * F1 + j, dt) : 0.0f;
          av[in2.pos(j)] = activate(at.activation, yv[j] + b);
        }
        continue;
      }
      const bool inter = at.gate_layout == GateLayout::Interleaved;
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t gi = inter ? 2 * j : j, ui = inter ? 2 * j + 1 : I + j;
        float g = yv[gi], u = yv[ui];
        if (t.fc1_b) g += load_as_f32(t.fc1_b, e * F1 + gi, dt);
        if (at.gate_layout == GateLayout::Separate) {
          if (t.fc3_b) u += load_as_f32(t.fc3_b, e * I + j, dt);
        } else if (t.fc1_b) {
          u += load_as_f32(t.fc1_b, e * F1 + ui, dt);
        }
        av[in2.pos(j)] = activate_gated(at, g, u);
      }
    }
  };
  // Phase 2: down GEMM into y, then the fc2 bias.
  auto down_bias = [&](const Item& it) {
    if (!t.fc2_b) return;
    const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
    for (int64_t n = it.b0; n < it.b1; ++n) {
      const float b = load_as_f32(t.fc2_b, e * H + n, dt);
      for (int64_t m = 0; m < M; ++m) y[size_t((p0 + m) * H + n)] += b;
    }
  };
  const std::vector<Item> up_items = make_items(routes, E, I, par.threads);
  const std::vector<Item> down_items = make_items(routes, E, H, par.threads);

  if (nr == nullptr) {
    // The int8 codes of the fc2 operand need a route's whole activation row,
    // written by several gate/up items: the thread that ends an expert's last
    // gate/up item quantises its rows before the expert's down items start.
    run_up_then_down(
        par, up_items, down_items, E,
        [&](const Item& it) {
          const int64_t p0 = begin[it.expert], M = begin[it.expert + 1] - p0;
          up_gemms(it, h1.data(), [&](const QWeight& w, int, int64_t n0, int64_t n1, float* Y) {
            run_gemm(qk, w, in1, p0, M, n0, n1, Y, N1);
          });
          activation(it);
        },
        [&](const Item& it) {
          const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
          run_gemm(qk, w2(e), in2, p0, M, it.b0, it.b1, &y[size_t(p0 * H + it.b0)], H);
          down_bias(it);
        },
        [&](int64_t e) {
          if (i8_2) in2.finish(begin[e], begin[e + 1]);
          in2.build_tiles(begin[e], begin[e + 1]);
        });
  } else {
    // NUMA: each phase as node-partitioned items (partial sums over the
    // node's segments of each weight: node 0 into h1 / y, node n into
    // part[n - 1]), then the partials added in node order and the epilogue.
    const int nodes = nr->nodes;
    std::vector<std::shared_ptr<const numa::SegmentTable>> tab1(static_cast<size_t>(E)), tab3(static_cast<size_t>(E)),
        tab2(static_cast<size_t>(E));
    auto table = [&](const QWeight& w, const Operand& op, int64_t rows) {
      return weight_table(*nr, w.codes, rows, w.K, w.bits, cut_granule(qk, w, op));
    };
    for (int64_t e = 0; e < E; ++e) {
      if (begin[e + 1] == begin[e]) continue;
      tab1[size_t(e)] = table(w1(e), in1, F1);
      if (t.fc3_w) tab3[size_t(e)] = table(w3(e), in1, I);
      tab2[size_t(e)] = table(w2(e), in2, H);
    }
    const int64_t stride1 = R * N1, stride2 = R * H;
    std::vector<float> part(size_t((nodes - 1) * std::max(stride1, stride2)));
    run_node_items(par, *nr, up_items.size(), [&](int node, size_t i, std::vector<float>& tmp) {
      const Item& it = up_items[i];
      const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
      float* h = node == 0 ? h1.data() : &part[size_t((node - 1) * stride1)];
      up_gemms(it, h, [&](const QWeight& w, int fc, int64_t n0, int64_t n1, float* Y) {
        node_partial(fc == 3 ? *tab3[size_t(e)] : *tab1[size_t(e)], node, qk, w, in1, p0, M, n0, n1, Y, N1, tmp);
      });
    });
    par.for_each(up_items.size(), [&](size_t i) {
      const Item& it = up_items[i];
      const int64_t p0 = begin[it.expert], M = begin[it.expert + 1] - p0;
      float* Y = &h1[size_t(p0 * N1)];
      const float* Pp = part.data() + p0 * N1;
      if (!gated) {
        add_partials(Y, Pp, nodes, stride1, M, N1, it.b0, it.b1);
      } else if (at.gate_layout == GateLayout::Interleaved) {
        add_partials(Y, Pp, nodes, stride1, M, N1, 2 * it.b0, 2 * it.b1);
      } else {
        add_partials(Y, Pp, nodes, stride1, M, N1, it.b0, it.b1);
        add_partials(Y, Pp, nodes, stride1, M, N1, I + it.b0, I + it.b1);
      }
      activation(it);
    });
    if (i8_2) maybe_parallel(par, E, R * I, [&](size_t e) { in2.finish(begin[e], begin[e + 1]); });
    run_node_items(par, *nr, down_items.size(), [&](int node, size_t i, std::vector<float>& tmp) {
      const Item& it = down_items[i];
      const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
      float* Y = (node == 0 ? y.data() : &part[size_t((node - 1) * stride2)]) + p0 * H;
      node_partial(*tab2[size_t(e)], node, qk, w2(e), in2, p0, M, it.b0, it.b1, Y + it.b0, H, tmp);
    });
    par.for_each(down_items.size(), [&](size_t i) {
      const Item& it = down_items[i];
      const int64_t p0 = begin[it.expert], M = begin[it.expert + 1] - p0;
      add_partials(y.data() + p0 * H, part.data() + p0 * H, nodes, stride2, M, H, it.b0, it.b1);
      down_bias(it);
    });
  }

  // Phase 3: out[t] = sum over its routes (slot order) of weight * y_route.
  {
    const int64_t chunk = 8;
    char* out = static_cast<char*>(t.output) + t0 * H * es;
    maybe_parallel(par, (tokens + chunk - 1) / chunk, tokens * H * k, [&](size_t c) {
      std::vector<float> acc(static_cast<size_t>(H));
      const int64_t q1 = std::min(tokens, int64_t(c) * chunk + chunk);
      for (int64_t q = int64_t(c) * chunk; q < q1; ++q) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t s = 0; s < k; ++s) {
          const int64_t p = routes.slot_pos[size_t(q * k + s)];
          if (p < 0) continue;
          const float wgt = routes.weight[size_t(p)];
          const float* yr = &y[size_t(p * H)];
          for (int64_t h = 0; h < H; ++h) acc[size_t(h)] += wgt * yr[h];
        }
        for (int64_t h = 0; h < H; ++h) store_from_f32(out, q * H + h, dt, acc[size_t(h)]);
      }
    });
  }
  return "";
}

}  // namespace

const QuantKernels& quant_kernels_for(const KernelTier& tier) {
  if (std::strcmp(tier.name, "ref") == 0) return quant_ref();
  // amx-emu: int8 tokens on emulated AMX-INT8 tiles, the float path on avx2.
  // amx on silicon runs the avx512 tier's kernels: on a Xeon with AMX
  // (2026-12-02, hinamoe_qmoe_bench, Qwen3 shape, int4, 2 threads) the AMX-INT8
  // block kernel took 4.9 ms at 1 token and 16.2 ms at 16 where avx512 took
  // 1.1 and 6.1. Until it is faster it runs only where called by name:
  // quant_amx() in the tests against the emulator and in hinamoe_qmoe_i8_bench.
  // avx512: the zmm kernels; avx2: the avx2 kernels where this CPU runs them,
  // their int8-token path on AVX-VNNI where it has that.
  if (std::strcmp(tier.name, "amx-emu") == 0) return quant_amx_emu();
  if (std::strcmp(tier.name, "amx") == 0 && amx_unavailable_reason().empty() &&
      avx512_bf16_unavailable_reason().empty())
    return quant_avx512_tiles();
  const bool zmm = std::strcmp(tier.name, "amx") == 0 || std::strcmp(tier.name, "avx512") == 0;
  if (zmm && tier_unavailable_reason("avx512").empty()) return quant_avx512();
  if (tier_unavailable_reason("avx2").empty()) return avx_vnni_unavailable_reason().empty() ? quant_avx2_vnni() : quant_avx2();
  return quant_ref();
}

std::string validate_qmoe(const MoEShape& s, const QMoEAttrs& a, const QMoETensors& t) {
  MoETensors mt;
  mt.dtype = t.dtype;
  mt.input = t.input;
  mt.router = t.router;
  mt.fc1_w = t.fc1_w;
  mt.fc2_w = t.fc2_w;
  mt.fc3_w = t.fc3_w;
  mt.fc3_b = t.fc3_b;
  mt.output = t.output;
  std::string err = validate_moe(s, a.moe, mt);
  if (!err.empty()) return err;
  if (a.bits != 4 && a.bits != 8) return "expert_weight_bits=" + std::to_string(a.bits) + " is not 4 or 8";
  if (a.block_size != 0 && (a.block_size < 16 || (a.block_size & (a.block_size - 1)) != 0))
    return "block_size=" + std::to_string(a.block_size) + " is not a power of two >= 16";
  auto check_k = [&](const char* what, int64_t K, int64_t nb) -> std::string {
    if (K * a.bits % 8 != 0) return std::string(what) + ": K=" + std::to_string(K) + " does not fill whole bytes";
    if (nb < 1) return std::string(what) + ": " + std::to_string(nb) + " scale blocks";
    // Block-wise: ceil(K / block_size) blocks, the last one may be partial.
    if (nb > 1 && (a.block_size == 0 || nb != (K + a.block_size - 1) / a.block_size))
      return std::string(what) + ": " + std::to_string(nb) + " scale blocks do not fit K=" + std::to_string(K) +
             " with block_size=" + std::to_string(a.block_size) + " (expected ceil(K/block_size))";
    return "";
  };
  for (const std::string& e : {check_k("fc1", s.hidden, t.fc1_nb), check_k("fc2", s.inter, t.fc2_nb),
                               t.fc3_w ? check_k("fc3", s.hidden, t.fc3_nb) : std::string()})
    if (!e.empty()) return e;
  if (s.tokens > 0 && (!t.fc1_s || !t.fc2_s || (t.fc3_w && !t.fc3_s))) return "scales are null";
  return "";
}

std::string qmoe_ffn(const MoEShape& shape, const QMoEAttrs& attrs, const QMoETensors& t, const KernelTier& tier,
                     const Parallel& par) {
  return qmoe_ffn(shape, attrs, t, tier, par, MoEOptions{});
}

std::string qmoe_ffn(const MoEShape& shape, const QMoEAttrs& attrs, const QMoETensors& t, const KernelTier& tier,
                     const Parallel& par, const MoEOptions& opt) {
  if (opt.stats) *opt.stats = MoEStats{};
  std::string err = validate_qmoe(shape, attrs, t);
  if (!err.empty()) return err;
  if (shape.tokens == 0) return "";
  const QuantKernels& qk = quant_kernels_for(tier);
  const int64_t N1 = is_gated(attrs.moe.activation) ? 2 * shape.inter : shape.inter;
  int64_t route_bytes = (2 * shape.hidden + N1 + 2 * shape.inter + 64) * int64_t(sizeof(float));
  std::unique_ptr<NumaRun> nr = make_numa_run(opt, &err);
  if (!err.empty()) return err;
  if (nr) route_bytes += (nr->nodes - 1) * std::max(N1, shape.hidden) * int64_t(sizeof(float));  // partials
  const int64_t chunk = std::max<int64_t>(1, kScratchBudgetBytes / (route_bytes * attrs.moe.k));
  for (int64_t t0 = 0; t0 < shape.tokens; t0 += chunk) {
    err = run_chunk(shape, attrs, t, t0, std::min(chunk, shape.tokens - t0), qk, par, nr.get());
    if (!err.empty()) break;
  }
  if (nr) nr->report(opt.stats);
  return err;
}

}  // namespace hinamoe
