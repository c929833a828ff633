// The QMoE driver: QMoE routing -> gather (float, plus int8 copies for
// accuracy_level 4) -> the expert pipeline (moe/expert_pipeline.h) over the
// quantised weight format below -> weighted combine. Only the GEMMs, the
// operands and the NUMA cuts differ from the MoE driver.
#include "qmoe_ffn.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "../aligned_buffer.h"
#include "../moe/expert_pipeline.h"
#include "../scratch.h"
#include "qmoe_routing.h"
#include "qoperand.h"

namespace hinamoe {
namespace {

using namespace detail;

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

// The quantised weights of one call (expert_pipeline.h's weight format):
// block-quantised codes read in place by the tier's kernels against the
// operands in1 (gathered tokens) and in2 (activations).
struct QuantFormat {
  const QuantKernels& qk;
  const QMoETensors& t;
  int bits;
  int64_t block_size, H, I, F1;
  Operand& in1;
  Operand& in2;
  const int64_t* begin;  // routes.expert_begin
  std::vector<std::shared_ptr<const numa::SegmentTable>> tabs[3];  // fc1, fc3, fc2 (NUMA: [E] each)

  QWeight weight(int fc, int64_t e) const {
    if (fc == 1) return expert_weight(t.fc1_w, t.fc1_s, t.fc1_zp, t.scale_dtype, bits, F1, H, t.fc1_nb, block_size, e);
    if (fc == 3) return expert_weight(t.fc3_w, t.fc3_s, t.fc3_zp, t.scale_dtype, bits, I, H, t.fc3_nb, block_size, e);
    return expert_weight(t.fc2_w, t.fc2_s, t.fc2_zp, t.scale_dtype, bits, H, I, t.fc2_nb, block_size, e);
  }
  const Operand& operand(int fc) const { return fc == 2 ? in2 : in1; }
  void gemm(int fc, int64_t e, int64_t r0, int64_t r1, int64_t p0, int64_t M, float* Y, int64_t ldy) const {
    run_gemm(qk, weight(fc, e), operand(fc), p0, M, r0, r1, Y, ldy);
  }
  void prepare_numa(NumaRun& nr, int64_t e) {
    auto table = [&](int fc, int64_t rows) {
      const QWeight w = weight(fc, e);
      return weight_table(nr, w.codes, rows, w.K, w.bits, cut_granule(qk, w, operand(fc)));
    };
    tabs[0][size_t(e)] = table(1, F1);
    if (t.fc3_w) tabs[1][size_t(e)] = table(3, I);
    tabs[2][size_t(e)] = table(2, H);
  }
  void node_gemm(int node, int fc, int64_t e, int64_t r0, int64_t r1, int64_t p0, int64_t M, float* Y, int64_t ldy,
                 std::vector<float>& tmp) const {
    node_partial(*tabs[fc == 1 ? 0 : fc == 3 ? 1 : 2][size_t(e)], node, qk, weight(fc, e), operand(fc), p0, M, r0,
                 r1, Y, ldy, tmp);
  }
  void put(int64_t p, int64_t j, float v) const { in2.x[size_t(p * in2.ld + in2.pos(j))] = v; }
  // The int8 codes of the fc2 operand need a route's whole activation row,
  // written by several gate/up items: quantised once the expert's last one ends.
  void activations_done(int64_t e) const {
    in2.finish(begin[e], begin[e + 1]);
    in2.build_tiles(begin[e], begin[e + 1]);
  }
};

std::string run_chunk(const MoEShape& shape, const QMoEAttrs& qa, const QMoETensors& t, int64_t t0,
                      int64_t tokens, const QuantKernels& qk, const Parallel& par, NumaRun* nr) {
  const MoEAttrs& at = qa.moe;
  const ExpertDims d(shape, at);
  const int64_t H = d.H, I = d.I, E = d.E, N1 = d.N1, k = at.k;
  const DType dt = t.dtype;
  const size_t es = dtype_size(dt);

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

  QuantFormat f{qk, t, qa.bits, qa.block_size, H, I, d.F1, in1, in2, begin, {}};
  if (nr != nullptr)
    for (auto& tb : f.tabs) tb.resize(size_t(E));
  run_expert_pipeline(d, at, ExpertBiases{t.fc1_b, t.fc3_b, t.fc2_b, dt}, routes, par, nr, f, h1.data(), y.data());
  combine_routes(routes, y.data(), tokens, k, H, dt, static_cast<char*>(t.output) + t0 * H * es, par);
  return "";
}

}  // namespace

const QuantKernels& quant_kernels_for(const KernelTier& tier) { return tier.quant ? *tier.quant : quant_ref(); }

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
  // Per route: the two operands (float rows and int8 codes), gate/up sums, output row.
  auto route_floats = [](const ExpertDims& d) { return 2 * d.H + d.N1 + 2 * d.I + 64; };
  return run_token_chunks(shape, attrs.moe, route_floats, opt, [&](int64_t t0, int64_t n, NumaRun* nr) {
    return run_chunk(shape, attrs, t, t0, n, qk, par, nr);
  });
}

}  // namespace hinamoe
