// Shared by the QMoE C++ tests: random quantised weights packed as ORT
// packs them (values kept for float64 references), the quantised kernel
// tables this CPU runs, and a float64 QMoE block from the op's definition.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "qmoe/qmoe_ffn.h"
#include "test_util.h"

namespace hinamoe {
namespace qt {

// A random quantised weight [N, K] with its values kept for the reference.
struct QW {
  int bits = 4;
  int64_t N = 0, K = 0, nb = 1, block = 0;  // nb = ceil(K / block): the last block may be partial
  std::vector<uint8_t> codes, zp;
  ht::Buf scales;
  std::vector<int> q, z;  // unpacked codes [N, K], zero points [N, nb] (-1 = default)
  bool has_zp = false;

  QWeight view() const {
    QWeight w;
    w.codes = codes.data();
    w.scales = scales.data();
    w.zero_points = has_zp ? zp.data() : nullptr;
    w.scale_dtype = DType(scales.dtype);
    w.bits = bits;
    w.K = K;
    w.nb = nb;
    w.block = nb == 1 ? K : block;
    return w;
  }
  double deq(int64_t n, int64_t k) const {
    const int64_t b = nb == 1 ? 0 : k / block;
    const int zpv = has_zp ? z[size_t(n * nb + b)] : 1 << (bits - 1);
    return double(q[size_t(n * K + k)] - zpv) * scales.val[size_t(n * nb + b)];
  }
  // The float64 dot of dequantised row n with tokens x(k), and the sum of
  // the terms' magnitudes (what a float tolerance scales with).
  template <class X>
  std::pair<double, double> dot(int64_t n, X&& x) const {
    double sum = 0, mag = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double t = deq(n, k) * x(k);
      sum += t;
      mag += std::fabs(t);
    }
    return {sum, mag};
  }
};

// Packs codes and zero points exactly as ORT lays them out.
inline QW make_qw(int bits, int64_t N, int64_t K, int64_t block, bool has_zp, int sdt) {
  QW w;
  w.bits = bits;
  w.N = N;
  w.K = K;
  w.nb = block ? (K + block - 1) / block : 1;
  w.block = block;
  w.has_zp = has_zp;
  const int qmax = (1 << bits) - 1;
  w.q.resize(size_t(N * K));
  for (auto& v : w.q) v = int(ht::randint(0, qmax));
  w.codes.assign(size_t(N * K * bits / 8), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int v = w.q[size_t(n * K + k)];
      if (bits == 8) w.codes[size_t(n * K + k)] = uint8_t(v);
      else w.codes[size_t(n * (K / 2) + k / 2)] |= uint8_t(v << (4 * (k % 2)));
    }
  w.scales = ht::random_buf(sdt, size_t(N * w.nb), 0.125);
  w.z.resize(size_t(N * w.nb));
  for (auto& v : w.z) v = int(ht::randint(0, qmax));
  const int pack = 8 / bits;
  if (has_zp) {
    if (w.nb == 1) {
      w.zp.assign(size_t((N + pack - 1) / pack), 0);
      for (int64_t n = 0; n < N; ++n) w.zp[size_t(n / pack)] |= uint8_t(w.z[size_t(n)] << (bits * (n % pack)));
    } else {
      const int64_t bpp = (w.nb + pack - 1) / pack;
      w.zp.assign(size_t(N * bpp), 0);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t b = 0; b < w.nb; ++b)
          w.zp[size_t(n * bpp + b / pack)] |= uint8_t(w.z[size_t(n * w.nb + b)] << (bits * (b % pack)));
    }
  }
  return w;
}

// M token rows of X (K elements, rows ldx apart) placed in a kernel's token
// order (token_pos); the padding between rows NaN, so a kernel reading it shows.
inline std::vector<float> in_token_order(const std::vector<float>& X, int64_t M, int64_t ldx, int64_t K,
                                         TokenOrder order) {
  std::vector<float> Xk(X.size(), std::nanf(""));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t k = 0; k < K; ++k) Xk[size_t(m * ldx + token_pos(order, k, K))] = X[size_t(m * ldx + k)];
  return Xk;
}

inline std::vector<const QuantKernels*> tiers() {
  std::vector<const QuantKernels*> v{&quant_ref()};
  if (tier_unavailable_reason("avx2").empty()) v.push_back(&quant_avx2());
  if (avx_vnni_unavailable_reason().empty()) v.push_back(&quant_avx2_vnni());
  if (tier_unavailable_reason("avx512").empty()) v.push_back(&quant_avx512());
  return v;
}

// float64 QMoE block from the definition (f32 tensors, SwiGLU interleaved or relu).
inline std::vector<double> ref_qmoe(const MoEShape& s, const QMoEAttrs& a, const std::vector<float>& x,
                             const std::vector<float>& logits, const std::vector<QW>& fc1,
                             const std::vector<QW>& fc2, const std::vector<float>& b1, const std::vector<float>& b2) {
  const int64_t H = s.hidden, I = s.inter, E = s.experts, k = a.moe.k;
  const bool gated = is_gated(a.moe.activation);
  const int64_t N1 = gated ? 2 * I : I;
  std::vector<double> out(size_t(s.tokens * H), 0.0);
  for (int64_t t = 0; t < s.tokens; ++t) {
    std::vector<int> idx(static_cast<size_t>(E));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int p, int q) {
      const float lp = logits[size_t(t * E + p)], lq = logits[size_t(t * E + q)];
      return lp != lq ? lp > lq : p > q;
    });
    std::vector<double> wt(static_cast<size_t>(k));
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += wt[size_t(j)] = std::exp(double(logits[size_t(t * E + idx[size_t(j)])] - logits[size_t(t * E + idx[0])]));
    for (int64_t j = 0; j < k; ++j) {
      const int e = idx[size_t(j)];
      const double rw = wt[size_t(j)] / sum;
      std::vector<double> h(static_cast<size_t>(N1)), act(static_cast<size_t>(I));
      for (int64_t n = 0; n < N1; ++n) {
        double acc = b1[size_t(e * N1 + n)];
        for (int64_t c = 0; c < H; ++c) acc += fc1[size_t(e)].deq(n, c) * x[size_t(t * H + c)];
        h[size_t(n)] = acc;
      }
      for (int64_t i = 0; i < I; ++i) {
        if (!gated) {
          act[size_t(i)] = std::max(0.0, h[size_t(i)]);
          continue;
        }
        const double g = std::min(h[size_t(2 * i)], double(a.moe.limit));
        const double u = std::min(std::max(h[size_t(2 * i + 1)], -double(a.moe.limit)), double(a.moe.limit));
        act[size_t(i)] = g / (1 + std::exp(-a.moe.alpha * g)) * (u + a.moe.beta);
      }
      for (int64_t n = 0; n < H; ++n) {
        double acc = b2[size_t(e * H + n)];
        for (int64_t i = 0; i < I; ++i) acc += fc2[size_t(e)].deq(n, i) * act[size_t(i)];
        out[size_t(t * H + n)] += rw * acc;
      }
    }
  }
  return out;
}

// Stacks the experts' packed codes, scales and zero points as [E, ...].
template <class F>
std::vector<uint8_t> cat_bytes(const std::vector<QW>& v, F&& f) {
  std::vector<uint8_t> out;
  for (const QW& w : v) {
    const auto& b = f(w);
    out.insert(out.end(), b.begin(), b.end());
  }
  return out;
}

}  // namespace qt
}  // namespace hinamoe
