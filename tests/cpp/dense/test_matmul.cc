// The dense MatMul: gemm_kn of every tier against a float64 outer-product
// sum over K, M and column-range edges, and matmul() (A widened, columns
// split over threads, Y rounded to T) against float64 rounded once.
// Columns of W outside the range asked for, X beyond K and Y's padding are
// NaN: reading or writing outside what the call owns shows.
#include <algorithm>

#include "dense/matmul.h"
#include "test_util.h"
#include "thread_pool.h"
#include "tier.h"
#include "tiers_here.h"

using namespace hinamoe;

TEST(gemm_kn_edges) {
  const int64_t N = 150;  // wide tiles (up to 128 columns), single vectors, single columns
  const std::vector<int64_t> Ks = {1, 2, 3, 7, 15, 16, 17, 31, 33, 100, 257};
  // Every token count of a register tile (1-8), more than one tile, and
  // more than one chunk of 64 tokens.
  const std::vector<int64_t> Ms = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 17, 64, 70};
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 150}, {0, 128}, {0, 1}, {5, 5}, {3, 20}, {16, 144},
                                                           {129, 150}, {64, 96}};
  for (const KernelTier* tier : tiers_here()) {
    for (int dtype = 0; dtype < 3; ++dtype) {
      if (tier->gemm_kn[dtype] == nullptr) {
        ht::check(false, ht::fmt("%s has no %s gemm_kn", tier->name, ht::dtype_str(dtype)));
        continue;
      }
      int bad = 0;
      for (int64_t K : Ks) {
        const int64_t ldw = N + ht::randint(0, 9);
        ht::Buf W = ht::random_buf(dtype, size_t(K * ldw), 1.0);
        const size_t es = dtype == 0 ? 4 : 2;
        for (int64_t M : Ms) {
          if (K > 100 && M > 17) continue;  // keeps the reference loop short
          const int64_t ldx = K + 3;
          std::vector<float> X(size_t(M * ldx), NAN);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t k = 0; k < K; ++k) X[m * ldx + k] = float(ht::uniform(-2, 2));
          for (auto [n0, n1] : ranges) {
            // W with NaN outside [n0, n1) in every row.
            std::vector<uint8_t> Wp(W.raw.size());
            ht::poison(Wp);
            for (int64_t k = 0; k < K; ++k)
              std::memcpy(&Wp[size_t(k * ldw + n0) * es], &W.raw[size_t(k * ldw + n0) * es], size_t(n1 - n0) * es);
            const int64_t ldy = (n1 - n0) + 2;
            std::vector<float> Y(size_t(M * ldy));
            std::memset(Y.data(), 0xff, Y.size() * 4);
            tier->gemm_kn[dtype](Wp.data(), ldw, K, n0, n1, X.data(), ldx, M, Y.data(), ldy);
            bad += ht::check_gemm_output(
                Y, M, ldy, n1 - n0, K,
                [&](int64_t m, int64_t c) {
                  double sum = 0, mag = 0;
                  for (int64_t k = 0; k < K; ++k) {
                    const double p = double(X[m * ldx + k]) * W.val[k * ldw + n0 + c];
                    sum += p;
                    mag += std::fabs(p);
                  }
                  return std::pair{sum, mag};
                },
                ht::fmt("%s %s K=%lld M=%lld n=[%lld,%lld)", tier->name, ht::dtype_str(dtype), (long long)K,
                        (long long)M, (long long)n0, (long long)n1));
          }
        }
      }
      ht::check(bad == 0, ht::fmt("%s %s gemm_kn: %d wrong values", tier->name, ht::dtype_str(dtype), bad));
    }
  }
}

TEST(matmul_rounds_once_to_t) {
  ThreadPool pool(3);
  for (const KernelTier* tier : tiers_here()) {
    for (int dtype : {1, 2}) {
      for (auto [M, K, N] : std::vector<std::array<int64_t, 3>>{{1, 64, 256}, {3, 100, 70}, {5, 300, 40}, {17, 33, 300}, {40, 70, 130}, {2, 0, 5}}) {
        for (bool threaded : {false, true}) {
          ht::Buf A = ht::random_buf(dtype, size_t(M * K), 1.0), B = ht::random_buf(dtype, size_t(K * N), 1.0);
          std::vector<uint8_t> Y(size_t(M * N) * 2 + 2);
          ht::poison(Y);
          MatMulTensors t;
          t.dtype = DType(dtype);
          t.a = A.data();
          t.b = B.data();
          t.y = Y.data();
          t.M = M;
          t.K = K;
          t.N = N;
          const std::string err = matmul(t, *tier, threaded ? pool.parallel() : serial());
          CHECK_MSG(err.empty(), err);
          int bad = 0;
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              double want = 0, mag = 0;
              for (int64_t k = 0; k < K; ++k) {
                want += A.val[m * K + k] * B.val[k * N + n];
                mag += std::fabs(A.val[m * K + k] * B.val[k * N + n]);
              }
              const double got = ht::read_raw(Y.data(), size_t(m * N + n), dtype);
              // One rounding to T (half an ulp: 2^-11 f16, 2^-8 bf16) after a float32 sum.
              const double ulp = dtype == 1 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
              const bool ok = std::fabs(got - want) <= ulp * std::fabs(want) + double(K + 2) * 1.2e-7 * mag +
                                                           (dtype == 1 ? 6e-8 : 1e-38);
              if (!ok && bad++ < 3)
                ht::check(false, ht::fmt("%s %s M=%lld K=%lld N=%lld (%lld,%lld): got %.9g want %.9g", tier->name,
                                         ht::dtype_str(dtype), (long long)M, (long long)K, (long long)N,
                                         (long long)m, (long long)n, got, want));
            }
          CHECK(bad == 0);
          CHECK(ht::read_raw(Y.data(), size_t(M * N), dtype) != ht::read_raw(Y.data(), size_t(M * N), dtype));  // untouched
        }
      }
    }
  }
}

TEST(gemm_kn_bf16_pairs_edges) {
  // The tiers whose CPU multiplies bfloat16 pairs: odd K (a last row
  // without a partner), every token count of a tile, column tails.
  const int64_t N = 150;
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 150}, {0, 1}, {3, 20}, {16, 144}, {129, 150}};
  int tested = 0;
  for (const KernelTier* tier : tiers_here()) {
    if (tier->gemm_kn_bf16 == nullptr) continue;
    ++tested;
    int bad = 0;
    for (int64_t K : {1, 2, 3, 8, 9, 17, 100, 257}) {
      const int64_t ldw = N + ht::randint(0, 9);
      ht::Buf W = ht::random_buf(2, size_t(K * ldw), 1.0);
      for (int64_t M : {1, 2, 5, 8, 9, 70}) {
        const int64_t lda = K + 3;
        ht::Buf A = ht::random_buf(2, size_t(M * lda), 2.0);
        std::vector<uint8_t> Ap(A.raw);  // NaN beyond K in each row
        for (int64_t m = 0; m < M; ++m) std::memset(&Ap[size_t(m * lda + K) * 2], 0xff, 6);
        for (auto [n0, n1] : ranges) {
          std::vector<uint8_t> Wp(W.raw.size());
          ht::poison(Wp);
          for (int64_t k = 0; k < K; ++k)
            std::memcpy(&Wp[size_t(k * ldw + n0) * 2], &W.raw[size_t(k * ldw + n0) * 2], size_t(n1 - n0) * 2);
          const int64_t ldy = (n1 - n0) + 2;
          std::vector<float> Y(size_t(M * ldy));
          std::memset(Y.data(), 0xff, Y.size() * 4);
          tier->gemm_kn_bf16(reinterpret_cast<const uint16_t*>(Wp.data()), ldw, K, n0, n1,
                             reinterpret_cast<const uint16_t*>(Ap.data()), lda, M, Y.data(), ldy);
          bad += ht::check_gemm_output(
              Y, M, ldy, n1 - n0, K,
              [&](int64_t m, int64_t c) {
                double sum = 0, mag = 0;
                for (int64_t k = 0; k < K; ++k) {
                  const double p = A.val[m * lda + k] * W.val[k * ldw + n0 + c];
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
    ht::check(bad == 0, ht::fmt("%s gemm_kn_bf16: %d wrong values", tier->name, bad));
  }
  // Where the CPU has AVX512-BF16 the avx512 tier must offer the kernel.
  CHECK(tested > 0 || !avx512_bf16_unavailable_reason().empty());
}
