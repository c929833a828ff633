// Independent reference for the MoE block, written from the op definition:
// float32 softmax (as the op specifies), top-k by (p desc, index desc), the
// FFN in float64.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace ref {

struct Route {
  int expert;
  float weight;
};

// Softmax in float32 exactly as specified, then k picks by repeated argmax
// with ties going to the higher index. Empty result when a p is NaN.
inline std::vector<Route> route(const std::vector<float>& l, int64_t k, bool normalize) {
  const int64_t E = int64_t(l.size());
  float mx = l[0];
  for (int64_t j = 0; j < E; ++j) mx = l[j] > mx ? l[j] : mx;
  std::vector<float> p(E);
  float sum = 0.0f;
  for (int64_t j = 0; j < E; ++j) {
    p[j] = std::exp(l[j] - mx);
    sum += p[j];
  }
  for (int64_t j = 0; j < E; ++j) {
    p[j] = p[j] / sum;
    if (std::isnan(p[j])) return {};
  }
  std::vector<bool> used(E, false);
  std::vector<Route> out;
  for (int64_t s = 0; s < k; ++s) {
    int64_t best = -1;
    for (int64_t j = 0; j < E; ++j) {
      if (used[j]) continue;
      if (best < 0 || p[j] > p[best] || (p[j] == p[best] && j > best)) best = j;
    }
    used[best] = true;
    out.push_back({int(best), p[best]});
  }
  if (normalize) {
    float d = 0.0f;
    for (auto& r : out) d += r.weight;
    for (auto& r : out) r.weight = r.weight / d;
  }
  return out;
}

inline double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608 * (x + 0.044715 * x * x * x))); }
inline double sigm(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// act: 0 relu 1 gelu 2 silu 3 identity 4 swiglu 5 geglu 6 relu2
inline double act1(int act, double x) {
  switch (act) {
    case 0: return x > 0 ? x : 0;
    case 1: return gelu(x);
    case 2: return x * sigm(x);
    case 6: return x > 0 ? x * x : 0;
    default: return x;
  }
}

struct Params {
  int act = 0, layout = 0;  // layout: 0 separate 1 interleaved 2 stacked
  bool normalize = false, limit_after = false;
  double alpha = 1, beta = 0, limit = INFINITY;
};

inline double act2(const Params& P, double g, double u) {
  if (P.act == 5) return gelu(g) * u;
  const double L = std::fmin(std::fmax(u, -P.limit), P.limit);
  if (P.limit_after) return std::fmin(g * sigm(P.alpha * g), P.limit) * (L + P.beta);
  const double G = std::fmin(g, P.limit);
  return G * sigm(P.alpha * G) * (L + P.beta);
}

// All arrays hold the exact input values. Biases/fc3 may be empty.
inline std::vector<double> moe(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, const Params& P,
                               const std::vector<double>& x, const std::vector<double>& logits,
                               const std::vector<double>& w1, const std::vector<double>& b1,
                               const std::vector<double>& w2, const std::vector<double>& b2,
                               const std::vector<double>& w3, const std::vector<double>& b3) {
  const bool gated = P.act == 4 || P.act == 5;
  const int64_t N1 = gated && P.layout != 0 ? 2 * I : I;
  std::vector<double> out(T * H, 0.0), h(I), y(H);
  auto dot = [&](const std::vector<double>& w, int64_t row, int64_t t) {
    double s = 0;
    for (int64_t c = 0; c < H; ++c) s += w[row * H + c] * x[t * H + c];
    return s;
  };
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> l(E);
    for (int64_t j = 0; j < E; ++j) l[j] = float(logits[t * E + j]);
    for (const Route& r : route(l, k, P.normalize)) {
      if (!(r.weight > 0)) continue;
      const int64_t e = r.expert;
      for (int64_t j = 0; j < I; ++j) {
        if (!gated) {
          double v = dot(w1, e * N1 + j, t) + (b1.empty() ? 0 : b1[e * N1 + j]);
          h[j] = act1(P.act, v);
          continue;
        }
        int64_t gr, ur;  // rows of gate and up
        if (P.layout == 1) { gr = 2 * j; ur = 2 * j + 1; }
        else { gr = j; ur = I + j; }
        const double g = dot(w1, e * N1 + gr, t) + (b1.empty() ? 0 : b1[e * N1 + gr]);
        double u;
        if (P.layout == 0) u = dot(w3, e * I + j, t) + (b3.empty() ? 0 : b3[e * I + j]);
        else u = dot(w1, e * N1 + ur, t) + (b1.empty() ? 0 : b1[e * N1 + ur]);
        h[j] = act2(P, g, u);
      }
      for (int64_t n = 0; n < H; ++n) {
        double s = b2.empty() ? 0 : b2[e * H + n];
        for (int64_t j = 0; j < I; ++j) s += w2[(e * H + n) * I + j] * h[j];
        out[t * H + n] += double(r.weight) * s;
      }
    }
  }
  return out;
}

}  // namespace ref
