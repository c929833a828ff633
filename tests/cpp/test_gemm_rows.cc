// gemm_rows and gemm_rows_strided of every tier against a float64 dot
// product, over K, M and row range edges. Padding in X and between strided
// W rows is NaN (reading past K would show) and Y's padding must stay
// untouched.
#include <algorithm>

#include "test_util.h"
#include "tier.h"
#include "tiers_here.h"

using namespace hinamoe;

TEST(gemm_rows_edges) {
  const int64_t N = 29;
  // K: every tail of 8 (avx2) and 16 (avx512) lanes, and long rows (K slices).
  const std::vector<int64_t> Ks = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
                                   23, 31, 32, 33, 47, 63, 64, 65, 70, 100, 129, 257, 1543, 3001};
  const std::vector<int64_t> Ms_all = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 33, 70};
  // Long rows (the SIMD tiers slice K when M > 4) get fewer M values to stay fast.
  const std::vector<int64_t> Ms_long = {1, 2, 3, 4, 5, 9, 17};
  // Row counts 29, 1, 0, 27, 13, 3, 10, 8, 4: every leftover after blocks
  // of 8, 6, 4 or 3 rows (the AVX2 tier's per-token-tile row counts) and of
  // 12, 8 or 6 rows (AVX-512's, leftovers split into 8, 4, 2, 1).
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 29}, {0, 1}, {3, 4}, {5, 5}, {1, 28}, {7, 20},
                                                           {26, 29}, {2, 12}, {4, 12}, {21, 25}};
  for (const KernelTier* tier : tiers_here()) {
    for (int dtype = 0; dtype < 3; ++dtype) {
      for (int64_t K : Ks) {
        ht::Buf W = ht::random_buf(dtype, size_t(N * K), 1.0);
        // The same rows ldw > K apart (gemm_rows_strided), NaN in the gaps.
        const size_t es = dtype == 0 ? 4 : 2;
        const int64_t ldw = K + ht::randint(1, 17);
        std::vector<uint8_t> Ws(size_t(N * ldw) * es);
        ht::poison(Ws);
        for (int64_t n = 0; n < N; ++n) std::memcpy(&Ws[size_t(n * ldw) * es], &W.raw[size_t(n * K) * es], size_t(K) * es);
        int bad = 0, calls = 0;
        for (int64_t M : K > 1000 ? Ms_long : Ms_all) {
          const int64_t ldx = K + 5;
          std::vector<float> X(size_t(M * ldx), NAN);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t c = 0; c < K; ++c) X[m * ldx + c] = float(ht::uniform(-2, 2));
          for (auto [n0, n1] : ranges) {
            for (bool strided : {false, true}) {
              const int64_t ldy = (n1 - n0) + 3;
              std::vector<float> Y(size_t(M * ldy + 1));
              std::vector<uint8_t> raw(Y.size() * 4);
              ht::poison(raw);
              std::memcpy(Y.data(), raw.data(), raw.size());
              if (strided) tier->gemm_rows_strided[dtype](Ws.data(), ldw, K, n0, n1, X.data(), ldx, M, Y.data(), ldy);
              else tier->gemm_rows[dtype](W.data(), K, n0, n1, X.data(), ldx, M, Y.data(), ldy);
              ++calls;
              for (int64_t m = 0; m < M; ++m) {
                for (int64_t c = 0; c < ldy; ++c) {
                  const float got = Y[m * ldy + c];
                  const int64_t n = n0 + c;
                  bool ok;
                  double want = 0, mag = 0;
                  if (n < n1) {
                    for (int64_t q = 0; q < K; ++q) {
                      want += W.val[n * K + q] * double(X[m * ldx + q]);
                      mag += std::fabs(W.val[n * K + q] * double(X[m * ldx + q]));
                    }
                    ok = std::fabs(double(got) - want) <= double(K + 2) * 1.2e-7 * mag + 1e-30;
                  } else {
                    ok = ht::fbits(got) == 0xffffffffu;  // padding untouched
                  }
                  if (!ok && bad++ < 3)
                    ht::check(false, ht::fmt("%s %s%s K=%lld M=%lld n=[%lld,%lld) m=%lld col=%lld: got %.9g want %.9g",
                                             tier->name, ht::dtype_str(dtype), strided ? " strided" : "",
                                             (long long)K, (long long)M, (long long)n0, (long long)n1,
                                             (long long)m, (long long)c, got, want));
                }
              }
              ht::check(ht::fbits(Y.back()) == 0xffffffffu, "no write past the last Y row");
            }
          }
        }
        ht::check(bad == 0, ht::fmt("%s %s K=%lld: %d bad values over %d calls", tier->name,
                                    ht::dtype_str(dtype), (long long)K, bad, calls));
      }
    }
  }
}

TEST(gemm_rows_bf16_pairs_edges) {
  // bf16 weights against bf16 tokens (the tiers with AVX512-BF16): every K
  // tail of 32 (odd K: a last element without a partner), K slices, row
  // leftovers and token tiles; X beyond K is NaN, Y's padding untouched.
  const int64_t N = 29;
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 29}, {0, 1}, {3, 4}, {1, 28}, {26, 29}, {2, 12}};
  int tested = 0;
  for (const KernelTier* tier : tiers_here()) {
    if (tier->gemm_rows_bf16 == nullptr) continue;
    ++tested;
    int bad = 0;
    for (int64_t K : {1, 2, 15, 31, 32, 33, 63, 100, 1543, 3001}) {
      ht::Buf W = ht::random_buf(2, size_t(N * K), 1.0);
      for (int64_t M : {1, 2, 3, 4, 5, 9, 17}) {
        const int64_t ldx = K + 5;
        ht::Buf X = ht::random_buf(2, size_t(M * ldx), 2.0);
        for (int64_t m = 0; m < M; ++m) std::memset(&X.raw[size_t(m * ldx + K) * 2], 0xff, 10);
        for (auto [n0, n1] : ranges) {
          const int64_t ldy = (n1 - n0) + 3;
          std::vector<float> Y(size_t(M * ldy));
          std::memset(Y.data(), 0xff, Y.size() * 4);
          tier->gemm_rows_bf16(reinterpret_cast<const uint16_t*>(W.data()), K, n0, n1,
                               reinterpret_cast<const uint16_t*>(X.data()), ldx, M, Y.data(), ldy);
          bad += ht::check_gemm_output(
              Y, M, ldy, n1 - n0, K,
              [&](int64_t m, int64_t c) {
                double sum = 0, mag = 0;
                for (int64_t k = 0; k < K; ++k) {
                  const double p = W.val[(n0 + c) * K + k] * X.val[m * ldx + k];
                  sum += p;
                  mag += std::fabs(p);
                }
                return std::pair{sum, mag};
              },
              ht::fmt("%s K=%lld M=%lld n=[%lld,%lld)", tier->name, (long long)K, (long long)M, (long long)n0,
                      (long long)n1));
        }
      }
    }
    ht::check(bad == 0, ht::fmt("%s gemm_rows_bf16: %d wrong values", tier->name, bad));
  }
  CHECK(tested > 0 || !avx512_bf16_unavailable_reason().empty());
}
