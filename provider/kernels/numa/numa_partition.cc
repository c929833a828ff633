// Node-partitioned GEMV/GEMM-rows reference: per-node partials + reduction.
#include "numa_partition.h"

#include <algorithm>

namespace hinamoe {
namespace numa {

namespace {

template <class Load>
void segment_dot(const void* W, int64_t K, int64_t row, int64_t k0, int64_t k1, const float* X, int64_t ldx,
                 int64_t M, float* y, int64_t ldy, Load load) {
  for (int64_t m = 0; m < M; ++m) {
    const float* x = X + m * ldx;
    float acc = 0.0f;
    for (int64_t k = k0; k < k1; ++k) acc += load(W, row * K + k) * x[k];
    y[m * ldy] += acc;
  }
}

void dot_f32(const void* W, int64_t K, int64_t row, int64_t k0, int64_t k1, const float* X, int64_t ldx, int64_t M,
             float* y, int64_t ldy) {
  segment_dot(W, K, row, k0, k1, X, ldx, M, y, ldy,
              [](const void* w, int64_t i) { return static_cast<const float*>(w)[i]; });
}
void dot_f16(const void* W, int64_t K, int64_t row, int64_t k0, int64_t k1, const float* X, int64_t ldx, int64_t M,
             float* y, int64_t ldy) {
  segment_dot(W, K, row, k0, k1, X, ldx, M, y, ldy,
              [](const void* w, int64_t i) { return f16_to_f32(static_cast<const uint16_t*>(w)[i]); });
}
void dot_bf16(const void* W, int64_t K, int64_t row, int64_t k0, int64_t k1, const float* X, int64_t ldx, int64_t M,
              float* y, int64_t ldy) {
  segment_dot(W, K, row, k0, k1, X, ldx, M, y, ldy,
              [](const void* w, int64_t i) { return bf16_to_f32(static_cast<const uint16_t*>(w)[i]); });
}

}  // namespace

void local_segments(const SegmentTable& t, int node, int64_t r0, int64_t r1, std::vector<Segment>* out) {
  out->clear();
  for_each_local_segment(t, node, r0, r1, [&](int64_t r, int64_t k0, int64_t k1) { out->push_back(Segment{r, k0, k1}); });
}

SegmentDotFn ref_segment_dot(DType t) {
  switch (t) {
    case DType::F32: return dot_f32;
    case DType::F16: return dot_f16;
    default: return dot_bf16;
  }
}

void node_partial_gemv_rows(const SegmentTable& t, int node, DType wt, const void* W, int64_t K, int64_t n0,
                            int64_t n1, const float* X, int64_t ldx, int64_t M, float* P, int64_t ldp,
                            SegmentDotFn dot) {
  if (dot == nullptr) dot = ref_segment_dot(wt);
  for (int64_t m = 0; m < M; ++m) std::fill(P + m * ldp, P + m * ldp + (n1 - n0), 0.0f);
  for_each_local_segment(t, node, n0, n1, [&](int64_t n, int64_t k0, int64_t k1) {
    dot(W, K, n, k0, k1, X, ldx, M, P + (n - n0), ldp);
  });
}

void reduce_partials(const float* partials, int nodes, int64_t node_stride, int64_t M, int64_t cols, int64_t ldp,
                     float* Y, int64_t ldy) {
  for (int64_t m = 0; m < M; ++m) {
    float* y = Y + m * ldy;
    const float* p0 = partials + m * ldp;
    std::copy(p0, p0 + cols, y);
    for (int n = 1; n < nodes; ++n) {
      const float* p = partials + n * node_stride + m * ldp;
      for (int64_t j = 0; j < cols; ++j) y[j] += p[j];
    }
  }
}

size_t partitioned_scratch_floats(const SegmentTable& t, int64_t M, int64_t n0, int64_t n1) {
  if (t.nodes <= 1 || M <= 0 || n1 <= n0) return 0;
  return static_cast<size_t>(t.nodes) * static_cast<size_t>(M) * static_cast<size_t>(n1 - n0);
}

void partitioned_gemv_rows(const SegmentTable& t, DType wt, const void* W, int64_t K, int64_t n0, int64_t n1,
                           const float* X, int64_t ldx, int64_t M, float* Y, int64_t ldy, float* scratch,
                           const Parallel& par, GemmRowsFn fast, SegmentDotFn dot) {
  if (n1 <= n0 || M <= 0) return;
  if (t.nodes <= 1) {  // the one-node fast path: no partials, no reduction
    if (fast != nullptr) {
      fast(W, K, n0, n1, X, ldx, M, Y, ldy);
      return;
    }
    if (dot == nullptr) dot = ref_segment_dot(wt);
    for (int64_t m = 0; m < M; ++m) std::fill(Y + m * ldy, Y + m * ldy + (n1 - n0), 0.0f);
    for (int64_t n = n0; n < n1; ++n) dot(W, K, n, 0, K, X, ldx, M, Y + (n - n0), ldy);
    return;
  }
  const int64_t cols = n1 - n0;
  const int64_t node_stride = M * cols;
  std::vector<float> own;
  if (scratch == nullptr) {
    own.resize(partitioned_scratch_floats(t, M, n0, n1));
    scratch = own.data();
  }
  par.for_each(static_cast<size_t>(t.nodes), [&](size_t node) {
    node_partial_gemv_rows(t, static_cast<int>(node), wt, W, K, n0, n1, X, ldx, M,
                           scratch + static_cast<int64_t>(node) * node_stride, cols, dot);
  });
  reduce_partials(scratch, t.nodes, node_stride, M, cols, cols, Y, ldy);
}

}  // namespace numa
}  // namespace hinamoe
