// The three layout transforms on their own: gather into VNNI, VNNI store of
// activated gate/up blocks, transposed + weighted down store.
#include <cstring>
#include <vector>

#include "amx/amx_layout.h"
#include "../test_util.h"

using namespace hinamoe;
using namespace hinamoe::amx;

TEST(layout_gather_vnni_all_dtypes) {
  auto& g = ht::rng();
  for (DType dt : {DType::F32, DType::F16, DType::BF16}) {
    for (int64_t K : {1, 2, 31, 32, 33, 64, 100}) {
      for (int64_t M : {1, 3, 16, 17, 40}) {
        const int64_t T = 9;
        std::vector<float> xf(size_t(T * K));
        std::vector<uint16_t> xh(size_t(T * K));
        for (auto& v : xf) v = std::uniform_real_distribution<float>(-4, 4)(g);
        for (size_t i = 0; i < xh.size(); ++i)
          xh[i] = dt == DType::F16 ? f32_to_f16(xf[i]) : f32_to_bf16(xf[i]);
        std::vector<int32_t> rows(static_cast<size_t>(M));
        for (auto& r : rows) r = int32_t(g() % T);  // repeats allowed
        std::vector<uint16_t> xv(size_t(vnni_elems(K, M)), 0xffff);
        gather_vnni(dt == DType::F32 ? static_cast<const void*>(xf.data()) : xh.data(), dt, K, rows.data(), M,
                    xv.data());
        bool ok = true;
        for (int64_t k = 0; k < round_up32(K); ++k)
          for (int64_t m = 0; m < M; ++m) {
            uint16_t want = 0;
            if (k < K) {
              const int64_t i = rows[m] * K + k;
              want = dt == DType::F32 ? f32_to_bf16(xf[i])
                     : dt == DType::F16 ? f32_to_bf16(f16_to_f32(xh[i])) : xh[i];
            }
            ok &= xv[(k / 2) * 2 * M + 2 * m + k % 2] == want;
          }
        CHECK_MSG(ok, std::string(dtype_name(dt)) + " K=" + std::to_string(K) + " M=" + std::to_string(M));
      }
    }
  }
}

TEST(layout_vnni_zero_tail) {
  for (int64_t K : {1, 7, 32, 33, 72}) {
    for (int64_t M : {1, 5, 33}) {
      std::vector<uint16_t> v(size_t(vnni_elems(K, M)), 0x1234);
      vnni_zero_tail(K, M, v.data());
      bool ok = true;
      for (int64_t k = 0; k < round_up32(K); ++k)
        for (int64_t m = 0; m < M; ++m) ok &= v[size_t(vnni_index(k, m, M))] == (k < K ? 0x1234 : 0);
      CHECK_MSG(ok, "K=" + std::to_string(K) + " M=" + std::to_string(M));
    }
  }
}

TEST(layout_store_vnni_block) {
  auto& g = ht::rng();
  for (int it = 0; it < 200; ++it) {
    const int64_t M = 1 + int64_t(g() % 70), K = 1 + int64_t(g() % 90);
    const int64_t rows = 1 + int64_t(g() % std::min<int64_t>(K, 32)), cols = 1 + int64_t(g() % std::min<int64_t>(M, 32));
    const int64_t k0 = int64_t(g() % (K - rows + 1)), m0 = int64_t(g() % (M - cols + 1));
    float src[32 * 33];
    for (auto& v : src) v = std::uniform_real_distribution<float>(-3, 3)(g);
    std::vector<uint16_t> v(size_t(vnni_elems(K, M)), 0xbeef);
    store_vnni_block(src, 33, rows, cols, k0, m0, M, v.data());
    bool ok = true;
    for (int64_t k = 0; k < round_up32(K); ++k)
      for (int64_t m = 0; m < M; ++m) {
        const bool in = k >= k0 && k < k0 + rows && m >= m0 && m < m0 + cols;
        const uint16_t want = in ? f32_to_bf16(src[(k - k0) * 33 + (m - m0)]) : 0xbeef;
        ok &= v[size_t(vnni_index(k, m, M))] == want;
      }
    CHECK_MSG(ok, "M=" + std::to_string(M) + " K=" + std::to_string(K) + " k0=" + std::to_string(k0));
  }
}

TEST(layout_store_transposed) {
  auto& g = ht::rng();
  for (int it = 0; it < 100; ++it) {
    const int64_t H = 1 + int64_t(g() % 80), M = 1 + int64_t(g() % 50), ldy = H + int64_t(g() % 3);
    const int64_t rows = 1 + int64_t(g() % std::min<int64_t>(H, 32)), cols = 1 + int64_t(g() % std::min<int64_t>(M, 32));
    const int64_t h0 = int64_t(g() % (H - rows + 1)), m0 = int64_t(g() % (M - cols + 1));
    const bool use_bias = g() & 1, use_w = g() & 1, accumulate = g() & 1;
    float acc[32 * 32], bias[32];
    std::vector<float> w(static_cast<size_t>(M));
    for (auto& v : acc) v = std::uniform_real_distribution<float>(-3, 3)(g);
    for (auto& v : bias) v = std::uniform_real_distribution<float>(-1, 1)(g);
    for (auto& v : w) v = std::uniform_real_distribution<float>(0, 1)(g);
    std::vector<float> y(size_t(M * ldy)), y0;
    for (auto& v : y) v = std::uniform_real_distribution<float>(-1, 1)(g);
    y0 = y;
    store_transposed(acc, 32, rows, cols, use_bias ? bias : nullptr, use_w ? w.data() : nullptr, h0, m0,
                     accumulate, y.data(), ldy);
    bool ok = true;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t h = 0; h < ldy; ++h) {
        const size_t i = size_t(m * ldy + h);
        if (m >= m0 && m < m0 + cols && h >= h0 && h < h0 + rows) {
          const float v = (use_w ? w[m] : 1.0f) * (acc[(h - h0) * 32 + (m - m0)] + (use_bias ? bias[h - h0] : 0.0f));
          ok &= y[i] == (accumulate ? y0[i] + v : v);
        } else {
          ok &= y[i] == y0[i];
        }
      }
    CHECK(ok);
  }
}
