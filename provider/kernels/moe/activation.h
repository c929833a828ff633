// Scalar activation epilogues in float32, as ORT's CPU MoE defines them.
#pragma once

#include <algorithm>
#include <cmath>

#include "moe_ffn.h"

namespace hinamoe {

inline float sigmoid_f(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float gelu_tanh_f(float x) {
  return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
}

// Non-gated activations of one fc1 output.
inline float activate(Activation a, float x) {
  switch (a) {
    case Activation::Relu: return std::max(0.0f, x);
    case Activation::Gelu: return gelu_tanh_f(x);
    case Activation::Silu: return x * sigmoid_f(x);
    case Activation::Relu2: { const float r = std::max(0.0f, x); return r * r; }
    default: return x;  // Identity
  }
}

// Gated activations of a (gate, up) pair.
inline float activate_gated(const MoEAttrs& at, float g, float u) {
  if (at.activation == Activation::GeGLU) return gelu_tanh_f(g) * u;
  const float L = std::min(std::max(u, -at.limit), at.limit);
  if (at.limit_after_activation) return std::min(g * sigmoid_f(at.alpha * g), at.limit) * (L + at.beta);
  const float G = std::min(g, at.limit);
  return G * sigmoid_f(at.alpha * G) * (L + at.beta);
}

}  // namespace hinamoe
