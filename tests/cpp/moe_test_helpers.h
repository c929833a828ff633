// Helpers shared by the MoE driver tests.
#pragma once

#include <string>
#include <vector>

#include "moe/moe_ffn.h"
#include "test_util.h"
#include "tier.h"
#include "tiers_here.h"

// A small float32 MoE (relu, k = 2, no biases) with random inputs and
// weights; `t` points at them and at `out`.
struct SmallMoE {
  hinamoe::MoEShape s;
  hinamoe::MoEAttrs a;
  hinamoe::MoETensors t;
  ht::Buf x, lg, w1, w2;
  std::vector<float> out;

  SmallMoE(const SmallMoE&) = delete;  // t points into this object
  SmallMoE(int64_t T, int64_t H, int64_t I, int64_t E)
      : s{T, H, I, E},
        x(ht::random_buf(0, size_t(T * H), 1.0)),
        lg(ht::random_buf(0, size_t(T * E), 1.0)),
        w1(ht::random_buf(0, size_t(E * I * H), 0.25)),
        w2(ht::random_buf(0, size_t(E * H * I), 0.25)),
        out(size_t(T * H)) {
    a.k = 2;
    t.input = x.data(); t.router = lg.data(); t.fc1_w = w1.data(); t.fc2_w = w2.data();
    t.output = out.data();
  }
};
