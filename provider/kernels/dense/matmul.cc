// MatMul on gemm_kn. A's rows are widened to float32 once per call (a
// chunk of rows at a time, bounding the copy), except where the tier
// multiplies bfloat16 pairs straight from A. B [K, N] is contiguous along
// N, so how the threads share it decides how it streams:
// * few tokens (decode, memory-bound): split along K. Each item takes a
//   run of whole rows -- one contiguous block of B, read front to back --
//   into its own float partial of Y; the partials are then summed per
//   column and rounded to T.
// * more tokens (compute-bound): split along N; each item streams its
//   columns of every row once for all the chunk's tokens and rounds its
//   part of Y.
#include "matmul.h"

#include <algorithm>
#include <vector>

#include "../parallel.h"
#include "../scratch.h"
#include "../tuning.h"

namespace hinamoe {
namespace {

using namespace detail;

// Columns per item (split along N): multiples of 64 (two cache lines of a
// 16-bit row), about 4 items per thread (claimed dynamically).
int64_t columns_per_item(int64_t N, int threads) {
  if (threads <= 1) return N;
  const int64_t want = 4 * int64_t(threads);
  const int64_t c = (N + want - 1) / want;
  return std::max<int64_t>(64, (c + 63) / 64 * 64);
}

// Rows per item (split along K): 2 items per thread, multiples of 16, and
// no more items than tuning::kDenseScratchBytes of partials (M x N floats each;
// an LM head's N is large) allow.
int64_t rows_per_item(int64_t K, int64_t M, int64_t N, int threads) {
  const int64_t fit = std::max<int64_t>(1, tuning::kDenseScratchBytes / (M * N * 4));
  const int64_t want = std::min<int64_t>(2 * int64_t(threads), fit);
  const int64_t r = (K + want - 1) / want;
  return std::max<int64_t>(16, (r + 15) / 16 * 16);
}

void widen_rows(const MatMulTensors& t, int64_t m0, int64_t M, float* X, const Parallel& par) {
  constexpr int64_t kRowsPerItem = 16;
  const int64_t K = t.K;
  maybe_parallel(par, (M + kRowsPerItem - 1) / kRowsPerItem, M * K, [&](size_t c) {
    const int64_t r0 = int64_t(c) * kRowsPerItem, r1 = std::min(M, r0 + kRowsPerItem);
    for (int64_t i = r0 * K; i < r1 * K; ++i) X[i] = load_as_f32(t.a, m0 * K + i, t.dtype);
  });
}

// One call of the tier's kernel on rows [k0, k1) of B and columns
// [n0, n1): bfloat16 pairs straight from A where the tier multiplies them,
// else the float32 copy X of A's rows.
struct Kernel {
  GemmKnFn gemm = nullptr;
  GemmKnBf16Fn pairs = nullptr;
  const MatMulTensors* t = nullptr;
  const float* X = nullptr;  // the float path: A's rows from x_m0 on, widened
  int64_t x_m0 = 0;

  void operator()(int64_t m0, int64_t M, int64_t k0, int64_t k1, int64_t n0, int64_t n1, float* Y, int64_t ldy) const {
    const int64_t K = t->K, N = t->N;
    if (pairs != nullptr) {
      const auto* A = static_cast<const uint16_t*>(t->a);
      pairs(static_cast<const uint16_t*>(t->b) + k0 * N, N, k1 - k0, n0, n1, A + m0 * K + k0, K, M, Y, ldy);
    } else {
      gemm(static_cast<const char*>(t->b) + size_t(k0 * N) * dtype_size(t->dtype), N, k1 - k0, n0, n1, X + (m0 - x_m0) * K + k0, K, M,
           Y, ldy);
    }
  }
};

// Few tokens: partials over runs of rows, then their sum.
void split_k(const MatMulTensors& t, const Kernel& kernel, const Parallel& par) {
  const int64_t M = t.M, K = t.K, N = t.N;
  const int64_t rows = par.threads <= 1 ? K : rows_per_item(K, M, N, par.threads);
  const int64_t items = (K + rows - 1) / rows;
  Scratch<std::vector<float>> p_s;
  p_s->resize(size_t(items * M * N));
  float* P = p_s->data();
  par.for_each(size_t(items), [&](size_t i) {
    const int64_t k0 = int64_t(i) * rows, k1 = std::min(K, k0 + rows);
    kernel(0, M, k0, k1, 0, N, P + int64_t(i) * M * N, N);
  });
  const int64_t cols = columns_per_item(N, par.threads);
  maybe_parallel(par, (N + cols - 1) / cols, M * N * items, [&](size_t c) {
    const int64_t n0 = int64_t(c) * cols, n1 = std::min(N, n0 + cols);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = n0; n < n1; ++n) {
        float s = 0.0f;
        for (int64_t i = 0; i < items; ++i) s += P[(i * M + m) * N + n];
        store_from_f32(t.y, m * N + n, t.dtype, s);
      }
  });
}

}  // namespace

std::string matmul(const MatMulTensors& t, const KernelTier& tier, const Parallel& par) {
  if (t.M < 0 || t.K < 0 || t.N < 0) return "negative dimension";
  if (t.M == 0 || t.N == 0) return "";
  if (t.y == nullptr) return "Y is null";
  const int64_t K = t.K, N = t.N;
  if (K == 0) {  // an empty sum (A and B may have no data at all)
    for (int64_t i = 0; i < t.M * N; ++i) store_from_f32(t.y, i, t.dtype, 0.0f);
    return "";
  }
  if (t.a == nullptr || t.b == nullptr) return "A or B is null";
  const GemmKnFn gemm = tier.gemm_kn[int(t.dtype)];
  if (gemm == nullptr) return std::string("tier '") + tier.name + "' has no " + dtype_name(t.dtype) + " MatMul";

  Kernel kernel;
  kernel.t = &t;
  kernel.gemm = gemm;
  if (t.dtype == DType::BF16) kernel.pairs = tier.gemm_kn_bf16;
  Scratch<std::vector<float>> x_s, y_s;
  if (t.M <= tuning::kSplitKMaxTokens) {
    if (kernel.pairs == nullptr) {
      x_s->resize(size_t(t.M * K));
      widen_rows(t, 0, t.M, x_s->data(), par);
      kernel.X = x_s->data();
    }
    split_k(t, kernel, par);
    return "";
  }
  const int64_t chunk = std::max<int64_t>(1, tuning::kDenseScratchBytes / ((K + N) * 4));
  const int64_t cols = columns_per_item(N, par.threads);
  const int64_t items = (N + cols - 1) / cols;
  for (int64_t m0 = 0; m0 < t.M; m0 += chunk) {
    const int64_t M = std::min(chunk, t.M - m0);
    y_s->resize(size_t(M * N));
    float* Y = y_s->data();
    Kernel k = kernel;
    if (k.pairs == nullptr) {
      x_s->resize(size_t(M * K));
      widen_rows(t, m0, M, x_s->data(), par);
      k.X = x_s->data();
      k.x_m0 = m0;
    }
    par.for_each(size_t(items), [&](size_t i) {
      const int64_t n0 = int64_t(i) * cols, n1 = std::min(N, n0 + cols);
      k(m0, M, 0, K, n0, n1, Y + n0, N);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n0; n < n1; ++n) store_from_f32(t.y, (m0 + m) * N + n, t.dtype, Y[m * N + n]);
    });
  }
  return "";
}

}  // namespace hinamoe
