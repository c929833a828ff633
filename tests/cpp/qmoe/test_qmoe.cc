// QMoE kernels against float64 scalar references written from the op's
// definition: the quantised GEMMs of every tier (4/8-bit, row/block-wise,
// zero points, f32/f16/bf16 scales, 1..7 tokens), their int8-token variant,
// QMoE routing, and the whole qmoe_ffn block.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "amx/qgemm_tiles.h"
#include "qmoe/qmoe_routing.h"
#include "qmoe/qmoe_test_helpers.h"
#include "thread_pool.h"

using namespace hinamoe;
using namespace hinamoe::qt;

TEST(qmoe_gemm_float_matches_float64) {
  for (const QuantKernels* qk : tiers())
    for (int bits : {4, 8})
      for (int64_t block : {0, 16, 32, 64, 128})
        for (bool zp : {false, true})
          for (bool whole : {false, true}) {
          const int sdt = int(ht::randint(0, 2));
          const int64_t N = ht::randint(1, 13);
          // Block-wise K: whole blocks or a partial last one of any even length;
          // whole: K a multiple of 32 (block 32: the avx2 block-sum kernel).
          const int64_t K = whole ? 32 * ht::randint(1, 9)
                            : block ? block * ht::randint(1, 4) - 2 * ht::randint(0, block / 2 - 1)
                                    : 2 * ht::randint(1, 150);
          const int64_t M = ht::randint(1, 7);
          const QW w = make_qw(bits, N, K, block, zp, sdt);
          const int64_t ldx = K + ht::randint(0, 5);
          std::vector<float> X(size_t(M * ldx));
          for (auto& v : X) v = float(ht::uniform(-1, 1));
          const int64_t n0 = ht::randint(0, N - 1), n1 = ht::randint(n0 + 1, N);
          const int64_t ldy = (n1 - n0) + ht::randint(0, 3);
          std::vector<float> Y(size_t(M * ldy), std::nanf(""));
          // The kernel's token order (even_odd for 4-bit where it asks).
          const std::vector<float> Xk = in_token_order(X, M, ldx, K, qk->f_order(bits, w.view().block, K, zp));
          qk->gemm[bits == 8](w.view(), n0, n1, Xk.data(), ldx, M, Y.data(), ldy);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = n0; n < n1; ++n) {
              const auto [ref, mag] = w.dot(n, [&](int64_t k) { return X[size_t(m * ldx + k)]; });
              const double got = Y[size_t(m * ldy + n - n0)];
              CHECK_MSG(std::fabs(got - ref) <= 1e-6 * mag + 1e-7,
                        std::string(qk->name) + " bits=" + std::to_string(bits) + " block=" + std::to_string(block) +
                            " zp=" + std::to_string(zp) + " got " + std::to_string(got) + " want " +
                            std::to_string(ref));
            }
        }
}

// Long rows with several token tiles: the avx512 float kernels cut K into
// slices (a tile's tokens over 32 KiB) and add the slices' sums into Y.
TEST(qmoe_gemm_float_long_rows_in_k_slices) {
  for (const QuantKernels* qk : tiers())
    for (int bits : {4, 8})
      for (int64_t block : {0, 32, 128}) {
        const int64_t N = ht::randint(3, 14), K = 32 * ht::randint(64, 100), M = ht::randint(5, 11);
        const QW w = make_qw(bits, N, K, block, ht::randint(0, 1) == 1, int(ht::randint(0, 2)));
        const int64_t ldx = K + 16;
        std::vector<float> X(size_t(M * ldx));
        for (auto& v : X) v = float(ht::uniform(-1, 1));
        const std::vector<float> Xk = in_token_order(X, M, ldx, K, qk->f_order(bits, w.view().block, K, w.has_zp));
        std::vector<float> Y(size_t(M * N), std::nanf(""));
        qk->gemm[bits == 8](w.view(), 0, N, Xk.data(), ldx, M, Y.data(), N);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 0; n < N; ++n) {
            const auto [ref, mag] = w.dot(n, [&](int64_t k) { return X[size_t(m * ldx + k)]; });
            CHECK_MSG(std::fabs(Y[size_t(m * N + n)] - ref) <= 1e-6 * mag + 1e-7,
                      std::string(qk->name) + " long rows bits=" + std::to_string(bits) + " block=" +
                          std::to_string(block) + " K=" + std::to_string(K) + " M=" + std::to_string(M));
          }
      }
}

// Many tokens: the avx512 float path transposes the tokens (12 tokens on,
// groups of 32) and dequantises rows in blocks of 24 / 12, then 8 / 4,
// then 1, over columns in chunks of 256.
TEST(qmoe_gemm_float_many_tokens) {
  for (const QuantKernels* qk : tiers())
    for (int bits : {4, 8})
      for (int64_t block : {0, 32, 64, 512}) {
        const int64_t N = ht::randint(1, 70), M = ht::randint(10, 75);
        const int64_t K = block == 512 ? 512 * ht::randint(1, 3) : 32 * ht::randint(1, 24);
        const QW w = make_qw(bits, N, K, block, ht::randint(0, 1) == 1, int(ht::randint(0, 2)));
        const int64_t ldx = K + ht::randint(0, 17), n0 = ht::randint(0, N - 1), n1 = ht::randint(n0 + 1, N);
        const int64_t ldy = (n1 - n0) + ht::randint(0, 3);
        std::vector<float> X(size_t(M * ldx));
        for (auto& v : X) v = float(ht::uniform(-1, 1));
        const std::vector<float> Xk = in_token_order(X, M, ldx, K, qk->f_order(bits, w.view().block, K, w.has_zp));
        std::vector<float> Y(size_t(M * ldy), std::nanf(""));
        qk->gemm[bits == 8](w.view(), n0, n1, Xk.data(), ldx, M, Y.data(), ldy);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = n0; n < n1; ++n) {
            const auto [ref, mag] = w.dot(n, [&](int64_t k) { return X[size_t(m * ldx + k)]; });
            CHECK_MSG(std::fabs(Y[size_t(m * ldy + n - n0)] - ref) <= 1e-6 * mag + 1e-7,
                      std::string(qk->name) + " many tokens bits=" + std::to_string(bits) + " block=" +
                          std::to_string(block) + " K=" + std::to_string(K) + " M=" + std::to_string(M) +
                          " n=" + std::to_string(n) + " m=" + std::to_string(m));
          }
      }
}

TEST(qmoe_gemm_int8_tokens_exact_integer_math) {
  for (const QuantKernels* qk : tiers())
    for (int bits : {4, 8})
      for (int64_t block : {16, 32, 64, 128})
        for (bool zp : {false, true})
          for (bool pairs : {false, true})
            for (bool many : {false, true}) {
          // K = whole blocks, or a partial last block of 2..block-2 elements
          // (the avx2 kernel's 32/16-element steps, then its scalar tail);
          // pairs: K a multiple of 64 (block 32: the Pair32 kernels); many:
          // 10-45 tokens (the avx512 kernel's transposed tokens from 12 on).
          const int64_t N = ht::randint(1, many ? 30 : 11), M = many ? ht::randint(10, 45) : ht::randint(1, 7);
          const int64_t K = pairs ? 64 * ht::randint(1, many ? 20 : 5) : block * ht::randint(2, 4) - 2 * ht::randint(0, block / 2 - 1);
          const QW w = make_qw(bits, N, K, block, zp, int(ht::randint(0, 2)));
          const int64_t nb = w.nb, ld = K + 16 * ht::randint(0, 2);
          std::vector<int8_t> xq(size_t(M * ld), 0), stored(size_t(M * ld), 0);
          std::vector<float> xsc(size_t(M * nb));
          std::vector<int32_t> xsum(size_t(M * nb), 0);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t k = 0; k < K; ++k) {
              const int8_t c = int8_t(ht::randint(-127, 127));
              xq[size_t(m * ld + k)] = c;
              xsum[size_t(m * nb + k / block)] += c;
              const int64_t pos = token_pos(qk->i8_order(bits, block, K, zp), k, K);
              stored[size_t(m * ld + pos)] = c;
            }
          for (auto& v : xsc) v = float(ht::uniform(0.001, 0.02));
          QTokens x;
          x.q = stored.data();
          x.scale = xsc.data();
          x.sum = xsum.data();
          x.ld = ld;
          x.nb = nb;
          x.block = block;
          x.order = qk->i8_order(bits, block, K, zp);
          std::vector<float> Y(size_t(M * N), std::nanf(""));
          qk->gemm_i8[bits == 8](w.view(), 0, N, x, M, Y.data(), N);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              const auto [ref, mag] = w.dot(
                  n, [&](int64_t k) { return double(xsc[size_t(m * nb + k / block)]) * xq[size_t(m * ld + k)]; });
              CHECK_MSG(std::fabs(Y[size_t(m * N + n)] - ref) <= 1e-5 * mag + 1e-6,
                        std::string(qk->name) + " i8 bits=" + std::to_string(bits) + " block=" + std::to_string(block));
            }
        }
}

TEST(qmoe_routing_topk_on_logits_softmax_over_k) {
  ThreadPool pool(2);
  for (bool with_rw : {false, true})
    for (bool norm : {false, true}) {
      const int64_t T = ht::randint(1, 200), E = ht::randint(1, 40), k = ht::randint(1, std::min<int64_t>(E, 8));
      ht::Buf lg = ht::random_buf(0, size_t(T * E), 4.0);
      for (auto& v : lg.val) v = std::round(v * 2) / 2;  // many ties
      ht::encode(lg);
      ht::Buf rw = ht::random_buf(0, size_t(T * E), 1.0);
      for (auto& v : rw.val) v = double(float(std::fabs(v) + 0.01));  // mixing weights are probabilities
      ht::encode(rw);
      Routes R;
      const std::string err = compute_qmoe_routes(lg.data(), with_rw ? rw.data() : nullptr, DType::F32, T, E, k, norm,
                                                  pool.parallel(), &R);
      CHECK(err.empty());
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int> idx(static_cast<size_t>(E));
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
          const double la = lg.val[size_t(t * E + a)], lb = lg.val[size_t(t * E + b)];
          return la != lb ? la > lb : a > b;  // ties: higher index first
        });
        std::vector<double> wt(static_cast<size_t>(k));
        double sum = 0;
        for (int64_t s = 0; s < k; ++s) {
          wt[size_t(s)] = with_rw ? rw.val[size_t(t * E + idx[size_t(s)])]
                                  : std::exp(lg.val[size_t(t * E + idx[size_t(s)])] - lg.val[size_t(t * E + idx[0])]);
          sum += wt[size_t(s)];
        }
        for (int64_t s = 0; s < k; ++s) {
          double want = wt[size_t(s)];
          if (!with_rw || norm) want = sum == 0 ? 0 : want / sum;
          const int64_t p = R.slot_pos[size_t(t * k + s)];
          if (!(want > 1e-8)) {
            CHECK(p < 0 || std::fabs(R.weight[size_t(p)]) <= 1e-8 * 1.01);
            continue;
          }
          if (!CHECK(p >= 0)) continue;
          const int e = idx[size_t(s)];
          CHECK(R.expert_begin[size_t(e)] <= p && p < R.expert_begin[size_t(e) + 1]);
          CHECK(std::fabs(R.weight[size_t(p)] - want) <= 1e-6 * std::fabs(want) + 1e-7);
        }
      }
    }
  std::vector<float> bad = {0.0f, std::nanf(""), 1.0f, 2.0f};
  Routes R;
  const std::string err = compute_qmoe_routes(bad.data(), nullptr, DType::F32, 2, 2, 1, false, serial(), &R);
  CHECK_MSG(err.find("NaN at token 0") != std::string::npos, err);
}

TEST(qmoe_ffn_matches_float64_reference) {
  ThreadPool pool(3);
  std::vector<const KernelTier*> ks{&ref_tier()};
  if (tier_unavailable_reason("avx2").empty()) ks.push_back(&avx2_tier());
  if (tier_unavailable_reason("avx512").empty()) ks.push_back(&avx512_tier());
  for (const KernelTier* tier : ks)
    for (int bits : {4, 8})
      for (int64_t block : {0, 32})
        for (bool swiglu : {false, true})
          for (bool i8 : {false, true}) {
            MoEShape s;
            s.tokens = ht::randint(0, 9);
            // 48 / 80 at block 32: partial last blocks in fc1 and fc2.
            s.hidden = ht::randint(0, 1) ? 64 : 48;
            s.inter = ht::randint(0, 1) ? 32 : 80;
            s.experts = ht::randint(2, 6);
            QMoEAttrs a;
            a.bits = bits;
            a.block_size = block;
            a.int8_activations = i8;
            a.moe.k = ht::randint(1, s.experts);
            a.moe.activation = swiglu ? Activation::SwiGLU : Activation::Relu;
            a.moe.gate_layout = swiglu ? GateLayout::Interleaved : GateLayout::Separate;
            a.moe.alpha = 1.702f;
            a.moe.beta = 1.0f;
            a.moe.limit = 7.0f;
            const int64_t N1 = swiglu ? 2 * s.inter : s.inter;
            const bool zp = ht::randint(0, 1) == 1;
            std::vector<QW> fc1, fc2;
            for (int64_t e = 0; e < s.experts; ++e) {
              fc1.push_back(make_qw(bits, N1, s.hidden, block, zp, 0));
              fc2.push_back(make_qw(bits, s.hidden, s.inter, block, zp, 0));
            }
            std::vector<float> x(size_t(s.tokens * s.hidden)), lg(size_t(s.tokens * s.experts)),
                b1(size_t(s.experts * N1)), b2(size_t(s.experts * s.hidden));
            for (auto& v : x) v = float(ht::uniform(-1, 1));
            for (auto& v : lg) v = float(ht::uniform(-2, 2));
            for (auto& v : b1) v = float(ht::uniform(-0.5, 0.5));
            for (auto& v : b2) v = float(ht::uniform(-0.5, 0.5));
            const auto c1 = cat_bytes(fc1, [](const QW& w) { return w.codes; });
            const auto c2 = cat_bytes(fc2, [](const QW& w) { return w.codes; });
            const auto s1 = cat_bytes(fc1, [](const QW& w) { return w.scales.raw; });
            const auto s2 = cat_bytes(fc2, [](const QW& w) { return w.scales.raw; });
            const auto z1 = cat_bytes(fc1, [](const QW& w) { return w.zp; });
            const auto z2 = cat_bytes(fc2, [](const QW& w) { return w.zp; });
            std::vector<float> out(size_t(s.tokens * s.hidden), std::nanf(""));
            QMoETensors t;
            t.input = x.data();
            t.router = lg.data();
            t.fc1_w = c1.data();
            t.fc1_s = s1.data();
            t.fc1_zp = zp ? z1.data() : nullptr;
            t.fc1_b = b1.data();
            t.fc2_w = c2.data();
            t.fc2_s = s2.data();
            t.fc2_zp = zp ? z2.data() : nullptr;
            t.fc2_b = b2.data();
            t.fc1_nb = fc1[0].nb;
            t.fc2_nb = fc2[0].nb;
            t.output = out.data();
            const std::string err = qmoe_ffn(s, a, t, *tier, pool.parallel());
            CHECK_MSG(err.empty(), err);
            if (!err.empty()) continue;
            const std::vector<double> ref = ref_qmoe(s, a, x, lg, fc1, fc2, b1, b2);
            double scale = 1e-3;
            for (double v : ref) scale = std::max(scale, std::fabs(v));
            // int8 tokens: 8% of the largest output, as in test_qmoe_numa.cc;
            // at 3% about 1 run in 200 failed on every tier, ref included
            // (8-bit codes with zero points: -1273 against -1207 of 1525).
            const double tol = (i8 && block ? 8e-2 : 2e-5) * scale;
            for (size_t i = 0; i < ref.size(); ++i)
              CHECK_MSG(std::fabs(out[i] - ref[i]) <= tol,
                        std::string(tier->name) + " bits=" + std::to_string(bits) + " block=" + std::to_string(block) +
                            " i8=" + std::to_string(i8) + " got " + std::to_string(out[i]) + " want " +
                            std::to_string(ref[i]));
          }
}

TEST(qmoe_validate_rejects_bad_parameters) {
  MoEShape s;
  s.tokens = 1;
  s.hidden = 64;
  s.inter = 32;
  s.experts = 2;
  QMoEAttrs a;
  a.moe.k = 1;
  uint8_t dummy[4] = {};
  QMoETensors t;
  t.input = t.router = t.output = dummy;
  t.fc1_w = t.fc2_w = dummy;
  t.fc1_s = t.fc2_s = dummy;
  CHECK(validate_qmoe(s, a, t).empty());
  a.bits = 2;
  CHECK(validate_qmoe(s, a, t).find("expert_weight_bits=2") != std::string::npos);
  a.bits = 4;
  a.block_size = 24;
  CHECK(validate_qmoe(s, a, t).find("power of two") != std::string::npos);
  a.block_size = 32;
  t.fc1_nb = 3;
  CHECK(validate_qmoe(s, a, t).find("do not fit") != std::string::npos);
  s.hidden = 80;  // ceil(80 / 32) = 3 blocks, the last of 16
  CHECK(validate_qmoe(s, a, t).empty());
  t.fc1_nb = 2;
  CHECK(validate_qmoe(s, a, t).find("ceil(K/block_size)") != std::string::npos);
  s.hidden = 64;
  t.fc1_nb = 1;
  a.moe.k = 3;
  CHECK(validate_qmoe(s, a, t).find("exceeds") != std::string::npos);
}

TEST(qmoe_tiers_map_to_quantised_kernels) {
  CHECK(std::string(quant_kernels_for(ref_tier()).name) == "ref");
  const std::string want = tier_unavailable_reason("avx2").empty() ? "avx2" : "ref";
  CHECK(std::string(quant_kernels_for(amx_emu_tier()).name) == "amx-emu");  // AMX-INT8 emulator for int8 tokens
  if (want == "avx2") {
    // avx2's int8-token path on AVX-VNNI where the CPU has it.
    const std::string got = quant_kernels_for(avx2_tier()).name;
    CHECK(got == (avx_vnni_unavailable_reason().empty() ? "avx2-vnni" : "avx2"));
  }
  CHECK(quant_kernels_for(amx_emu_tier()).gemm[0] == quant_kernels_for(avx2_tier()).gemm[0]);  // float path
  if (tier_unavailable_reason("avx512").empty())  // the avx512 tier: zmm kernels, int8 tokens on VNNI where it has it
    CHECK(std::string(quant_kernels_for(avx512_tier()).name) ==
          (avx512_vnni_unavailable_reason().empty() ? "avx512-vnni" : "avx512"));
  // amx on silicon: the avx512 tier's kernels (the AMX-INT8 one is slower
  // there) and the bf16 tile kernel for many tokens.
  if (tier_unavailable_reason("amx").empty() && avx512_bf16_unavailable_reason().empty()) {
    const QuantKernels& amx = quant_kernels_for(amx_tier());
    CHECK(std::string(amx.name) == "avx512+tiles" && amx.gemm_tiles == qgemm_tiles_amx);
    CHECK(amx.gemm[0] == quant_kernels_for(avx512_tier()).gemm[0]);
  }
  CHECK(quant_kernels_for(amx_emu_tier()).gemm_tiles == qgemm_tiles_emu);
  for (const QuantKernels* qk : {&quant_ref(), &quant_kernels_for(amx_emu_tier())})
    for (int b = 0; b < 2; ++b) CHECK(qk->gemm[b] != nullptr && qk->gemm_i8[b] != nullptr);
}
