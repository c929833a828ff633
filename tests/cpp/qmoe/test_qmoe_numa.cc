// QMoE under NUMA partitioning: K slices of quantised weights and tokens
// (QWeight::slice, QTokens::slice) on every tier's kernels add up to the
// whole row's float64 dot, and qmoe_ffn under fake 2/4/8-node topologies
// with small pages (many segments, weights starting mid-page) gives the
// float64 reference and the unpartitioned result, for 4/8-bit, row- and
// block-wise scales, zero points, float and int8 tokens, every gate layout.
#include <memory>

#include "amx/amx_detect.h"
#include "numa/plan_cache.h"
#include "numa/topology.h"
#include "qmoe/qmoe_test_helpers.h"
#include "thread_pool.h"

using namespace hinamoe;
using namespace hinamoe::qt;

namespace {

std::vector<const QuantKernels*> slice_tiers() {
  std::vector<const QuantKernels*> v = tiers();
  v.push_back(&quant_amx_emu());
  return v;
}

// Cut points of [0, K) at random multiples of g (always 0 and K).
std::vector<int64_t> random_cuts(int64_t K, int64_t g) {
  std::vector<int64_t> c{0};
  for (int64_t k = g; k < K; k += g)
    if (ht::randint(0, 2) == 0) c.push_back(k);
  if (c.size() == 1 && K > g) c.push_back(g);
  c.push_back(K);
  return c;
}

const numa::Topology& fake(int nodes) {
  static std::unique_ptr<numa::Topology> t[9];
  if (!t[nodes]) t[nodes] = numa::select_topology("fake:" + std::to_string(nodes), nullptr);
  return *t[nodes];
}

// bytes copied to `offset` bytes past a 4 KiB boundary (weights mid-page).
struct Placed {
  std::vector<uint8_t> store;
  uint8_t* p = nullptr;
  Placed(const std::vector<uint8_t>& b, size_t offset) {
    store.resize(b.size() + offset + 4096);
    p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(store.data()) + 4095) & ~uintptr_t(4095)) + offset;
    std::copy(b.begin(), b.end(), p);
  }
};

}  // namespace

// The contract the NUMA path's slices rely on (QuantKernels).
TEST(qmoe_token_orders_depend_on_k_modulo_128_only) {
  for (const QuantKernels* qk : slice_tiers())
    for (int bits : {4, 8})
      for (int64_t block : {0, 16, 32, 64, 128, 256})
        for (bool zp : {false, true})
          for (int64_t K = 16; K <= 512; K += 16) {
            const int64_t J = K + 128 * ht::randint(1, 40);
            const int64_t bk = block ? block : K, bj = block ? block : J;
            CHECK_MSG(qk->f_order(bits, bk, K, zp) == qk->f_order(bits, bj, J, zp) &&
                          qk->i8_order(bits, bk, K, zp) == qk->i8_order(bits, bj, J, zp),
                      std::string(qk->name) + " bits=" + std::to_string(bits) + " block=" + std::to_string(block) +
                          " K=" + std::to_string(K) + " vs " + std::to_string(J));
          }
}

TEST(qmoe_k_slices_add_up_to_the_whole_row) {
  for (const QuantKernels* qk : slice_tiers())
    for (int bits : {4, 8})
      for (int64_t block : {0, 16, 32, 64, 128})
        for (bool zp : {false, true})
          for (bool i8 : {false, true}) {
            if (i8 && block == 0) continue;  // int8 tokens: block-wise weights only
            const int64_t g = std::max<int64_t>(128, block ? (zp && bits == 4 ? 2 * block : block) : 1);
            // Whole granules and a tail: any multiple of 64 (the int8 kernels'
            // pairs), else K odd in 16s or whole blocks.
            const int64_t tail = block ? block * ht::randint(0, 2) : 16 * ht::randint(0, 7);
            const int64_t K = g * ht::randint(2, 4) + (i8 ? tail / 64 * 64 : tail);
            const int64_t N = ht::randint(1, 9), M = ht::randint(1, 6);
            const QW w = make_qw(bits, N, K, block, zp, int(ht::randint(0, 2)));
            const QWeight wv = w.view();
            // Slices read the whole row's token order (what cut_granule checks).
            auto order = [&](int64_t k) {
              const int64_t blk = block ? block : k;
              return i8 ? qk->i8_order(bits, blk, k, zp) : qk->f_order(bits, blk, k, zp);
            };
            const std::vector<int64_t> cuts = order(g) == order(K) && order(g + K % g) == order(K)
                                                  ? random_cuts(K, g)
                                                  : std::vector<int64_t>{0, K};
            std::vector<double> X(size_t(M * K));
            for (auto& v : X) v = ht::uniform(-1, 1);
            std::vector<float> sum(size_t(M * N), 0.0f);
            // Float tokens in the order the whole row's kernel reads, or int8 codes.
            const int64_t ld = K + 64;
            std::vector<float> Xf(size_t(M * ld), std::nanf(""));
            std::vector<int8_t> Xq(size_t(M * ld), 0);
            std::vector<float> xs(size_t(M * wv.nb));
            std::vector<int32_t> xsum(size_t(M * wv.nb), 0);
            std::vector<double> Xd(X.size());  // what the reference multiplies
            const TokenOrder fo = qk->f_order(bits, wv.block, K, zp), io = qk->i8_order(bits, wv.block, K, zp);
            for (int64_t m = 0; m < M; ++m) {
              for (int64_t b = 0; b < wv.nb; ++b) xs[size_t(m * wv.nb + b)] = float(ht::uniform(0.002, 0.02));
              for (int64_t k = 0; k < K; ++k) {
                const double v = X[size_t(m * K + k)];
                if (!i8) {
                  Xf[size_t(m * ld + token_pos(fo, k, K))] = float(v);
                  Xd[size_t(m * K + k)] = double(float(v));
                } else {
                  const int8_t c = int8_t(std::lround(v * 127));
                  Xq[size_t(m * ld + token_pos(io, k, K))] = c;
                  xsum[size_t(m * wv.nb + k / wv.block)] += c;
                  Xd[size_t(m * K + k)] = double(c) * xs[size_t(m * wv.nb + k / wv.block)];
                }
              }
            }
            QTokens xt;
            xt.q = Xq.data();
            xt.scale = xs.data();
            xt.sum = xsum.data();
            xt.ld = ld;
            xt.nb = wv.nb;
            xt.block = wv.block;
            xt.order = io;
            const int64_t n0 = ht::randint(0, N - 1), n1 = ht::randint(n0 + 1, N);
            for (size_t c = 0; c + 1 < cuts.size(); ++c) {
              const int64_t k0 = cuts[c], k1 = cuts[c + 1];
              std::vector<float> Y(size_t(M * N), std::nanf(""));
              const QWeight s = wv.slice(k0, k1);
              if (i8) qk->gemm_i8[bits == 8](s, n0, n1, xt.slice(k0, k1 - k0), M, Y.data(), N);
              else qk->gemm[bits == 8](s, n0, n1, Xf.data() + k0, ld, M, Y.data(), N);
              for (int64_t m = 0; m < M; ++m)
                for (int64_t n = n0; n < n1; ++n) sum[size_t(m * N + n)] += Y[size_t(m * N + n - n0)];
            }
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = n0; n < n1; ++n) {
                const auto [ref, mag] = w.dot(n, [&](int64_t k) { return Xd[size_t(m * K + k)]; });
                const double got = sum[size_t(m * N + n)];
                CHECK_MSG(std::fabs(got - ref) <= 1e-5 * mag + 1e-6,
                          std::string(qk->name) + " slices bits=" + std::to_string(bits) + " block=" +
                              std::to_string(block) + " zp=" + std::to_string(zp) + " i8=" + std::to_string(i8) +
                              " K=" + std::to_string(K) + " pieces=" + std::to_string(cuts.size() - 1) + " got " +
                              std::to_string(got) + " want " + std::to_string(ref));
              }
          }
}

TEST(qmoe_ffn_numa_matches_reference_and_plain_path) {
  ThreadPool pool(3);
  std::vector<const KernelTier*> ks{&ref_tier(), &amx_emu_tier()};
  if (tier_unavailable_reason("avx2").empty()) ks.push_back(&avx2_tier());
  if (tier_unavailable_reason("avx512").empty()) ks.push_back(&avx512_tier());
  for (const KernelTier* tier : ks)
    for (int nodes : {2, 4, 8})
      for (int bits : {4, 8})
        for (int64_t block : {0, 32, 64})
          for (int layout : {0, 1, 2}) {  // interleaved SwiGLU (against ref_qmoe), separate fc3, relu
            const bool i8 = block != 0 && ht::randint(0, 1) == 1;
            const bool zp = ht::randint(0, 1) == 1;
            MoEShape s;
            s.tokens = ht::randint(1, 12);
            s.hidden = 128 * ht::randint(2, 5);
            s.inter = 128 * ht::randint(1, 3) + (block ? 0 : 32);  // row-wise: a tail past the last 128
            s.experts = ht::randint(2, 5);
            QMoEAttrs a;
            a.bits = bits;
            a.block_size = block;
            a.int8_activations = i8;
            a.moe.k = ht::randint(1, s.experts);
            a.moe.activation = layout == 2 ? Activation::Relu : Activation::SwiGLU;
            a.moe.gate_layout = layout == 0 ? GateLayout::Interleaved : GateLayout::Separate;
            a.moe.alpha = 1.702f;
            a.moe.beta = 1.0f;
            a.moe.limit = 7.0f;
            const int64_t N1 = layout == 0 ? 2 * s.inter : s.inter;
            std::vector<QW> fc1, fc2, fc3;
            for (int64_t e = 0; e < s.experts; ++e) {
              fc1.push_back(make_qw(bits, N1, s.hidden, block, zp, 0));
              fc2.push_back(make_qw(bits, s.hidden, s.inter, block, zp, 0));
              if (layout == 1) fc3.push_back(make_qw(bits, s.inter, s.hidden, block, zp, 0));
            }
            std::vector<float> x(size_t(s.tokens * s.hidden)), lg(size_t(s.tokens * s.experts)),
                b1(size_t(s.experts * N1)), b2(size_t(s.experts * s.hidden));
            for (auto& v : x) v = float(ht::uniform(-1, 1));
            for (auto& v : lg) v = float(ht::uniform(-2, 2));
            for (auto& v : b1) v = float(ht::uniform(-0.5, 0.5));
            for (auto& v : b2) v = float(ht::uniform(-0.5, 0.5));
            auto offset = [] { return size_t(ht::randint(0, 63) * 8); };
            const Placed c1(cat_bytes(fc1, [](const QW& w) { return w.codes; }), offset());
            const Placed c2(cat_bytes(fc2, [](const QW& w) { return w.codes; }), offset());
            const Placed c3(cat_bytes(fc3, [](const QW& w) { return w.codes; }), offset());
            const auto s1 = cat_bytes(fc1, [](const QW& w) { return w.scales.raw; });
            const auto s2 = cat_bytes(fc2, [](const QW& w) { return w.scales.raw; });
            const auto s3 = cat_bytes(fc3, [](const QW& w) { return w.scales.raw; });
            const auto z1 = cat_bytes(fc1, [](const QW& w) { return w.zp; });
            const auto z2 = cat_bytes(fc2, [](const QW& w) { return w.zp; });
            const auto z3 = cat_bytes(fc3, [](const QW& w) { return w.zp; });
            QMoETensors t;
            t.input = x.data();
            t.router = lg.data();
            t.fc1_w = c1.p;
            t.fc1_s = s1.data();
            t.fc1_zp = zp ? z1.data() : nullptr;
            t.fc1_b = b1.data();
            t.fc2_w = c2.p;
            t.fc2_s = s2.data();
            t.fc2_zp = zp ? z2.data() : nullptr;
            t.fc2_b = b2.data();
            if (layout == 1) {
              t.fc3_w = c3.p;
              t.fc3_s = s3.data();
              t.fc3_zp = zp ? z3.data() : nullptr;
              t.fc3_nb = fc3[0].nb;
            }
            t.fc1_nb = fc1[0].nb;
            t.fc2_nb = fc2[0].nb;
            std::vector<float> plain(size_t(s.tokens * s.hidden), std::nanf("")), part(plain);
            t.output = plain.data();
            std::string err = qmoe_ffn(s, a, t, *tier, pool.parallel());
            CHECK_MSG(err.empty(), err);
            numa::PlanCache plans;
            MoEStats stats;
            MoEOptions opt;
            opt.topology = &fake(nodes);
            opt.plans = &plans;
            opt.page_size = 64 << ht::randint(0, 3);  // 64..512 bytes: rows split mid-row
            opt.stats = &stats;
            t.output = part.data();
            err = qmoe_ffn(s, a, t, *tier, pool.parallel(), opt);
            CHECK_MSG(err.empty(), err);
            if (!err.empty()) continue;
            const std::string what = std::string(tier->name) + " nodes=" + std::to_string(nodes) + " bits=" +
                                     std::to_string(bits) + " block=" + std::to_string(block) + " layout=" +
                                     std::to_string(layout) + " i8=" + std::to_string(i8) + " zp=" + std::to_string(zp);
            CHECK_MSG(stats.partitioned_phases == 2 && stats.partition_items > 0, what);
            CHECK_MSG(plans.size() > 0, what);
            double scale = 1e-3;
            for (float v : plain) scale = std::max(scale, double(std::fabs(v)));
            // Partial sums per node only regroup float additions; with int8
            // tokens that can move an activation across a rounding boundary
            // of its fc2 code, which shifts the route's whole output row.
            const double tol = (i8 ? 3e-2 : 2e-5) * scale;
            for (size_t i = 0; i < plain.size(); ++i)
              CHECK_MSG(std::fabs(part[i] - plain[i]) <= tol,
                        what + " partitioned " + std::to_string(part[i]) + " plain " + std::to_string(plain[i]));
            if (layout == 1) continue;  // ref_qmoe has no fc3; the plain path is checked against the op elsewhere
            // Against float64, int8 tokens also carry their rounding: the plain
            // path itself sits up to 3.5% of the largest output away at these
            // sizes (12 runs, 2026-12-02), so 8% here; partitioning is held
            // to the plain path above.
            const double ref_tol = i8 ? 8e-2 * scale : tol;
            const std::vector<double> ref = ref_qmoe(s, a, x, lg, fc1, fc2, b1, b2);
            for (size_t i = 0; i < ref.size(); ++i)
              CHECK_MSG(std::fabs(part[i] - ref[i]) <= ref_tol,
                        what + " got " + std::to_string(part[i]) + " want " + std::to_string(ref[i]));
          }
}
