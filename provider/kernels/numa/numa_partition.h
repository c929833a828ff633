// Executing a weight's work split by NUMA node (paper §5.3, Algorithm 2).
//
// A thread on node `node` computes only with the weight elements of that
// node's segments, accumulating partial sums along K into the node's own
// partial buffer; the per-node partials are then added in node order (so the
// result does not depend on which thread ran which node). The MoE driver
// calls, per weight and row block:
//
//     if (table.nodes <= 1) { tier.gemm_rows[dt](...); }          // one branch
//     else {
//       for each node n (a task, preferably run by a thread whose
//                         topology.current_node() == n; every node's task
//                         must run even when no thread sits on it):
//         node_partial_gemv_rows(table, n, ..., partial + n * node_stride, ldp);
//       reduce_partials(partial, table.nodes, node_stride, M, n1 - n0, ldp, Y, ldy);
//     }
//
// or simply partitioned_gemv_rows(), which does exactly that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../dtype.h"
#include "../parallel.h"
#include "../tier.h"
#include "segment_table.h"

namespace hinamoe {
namespace numa {

// Calls fn(row, k_start, k_end) for every segment of rows [r0, r1) local to
// `node`, rows ascending and k ascending within a row. Row x takes the
// segments of table row x mod period_rows (periodic tables: Tx*row_bits is a
// whole number of page rounds, so the pattern repeats exactly). Requires
// 0 <= r0 <= r1 <= table.rows and 0 <= node < table.nodes.
template <class F>
inline void for_each_local_segment(const SegmentTable& t, int node, int64_t r0, int64_t r1, F&& fn) {
  if (r0 >= r1 || t.period_rows <= 0) return;
  const std::vector<Segment>& segs = t.segments[static_cast<size_t>(node)];
  const std::vector<int64_t>& rb = t.row_begin[static_cast<size_t>(node)];
  int64_t rr = r0 % t.period_rows;
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t e = rb[static_cast<size_t>(rr) + 1];
    for (int64_t i = rb[static_cast<size_t>(rr)]; i < e; ++i) {
      const Segment& s = segs[static_cast<size_t>(i)];
      fn(r, s.k_start, s.k_end);
    }
    if (++rr == t.period_rows) rr = 0;
  }
}

// The same segments collected into `out` (cleared first), rows made absolute.
void local_segments(const SegmentTable& t, int node, int64_t r0, int64_t r1, std::vector<Segment>* out);

// Segment kernel: y[m*ldy] += sum_{k in [k0, k1)} W[row*K + k] * X[m*ldx + k]
// for m in [0, M). W has the kernel's element type; X and y are float.
using SegmentDotFn = void (*)(const void* W, int64_t K, int64_t row, int64_t k0, int64_t k1, const float* X,
                              int64_t ldx, int64_t M, float* y, int64_t ldy);

// Portable scalar segment kernels (float accumulation) for f32/f16/bf16.
SegmentDotFn ref_segment_dot(DType t);

// One node's share of Y = W[n0:n1] X^T:
//   P[m*ldp + (n - n0)] = sum over node's segments (n, k0, k1) of
//                         sum_{k in [k0, k1)} W[n*K + k] * X[m*ldx + k]
// for m < M, n in [n0, n1); P is overwritten (zeroed first, so rows with no
// local segment read 0). `dot` defaults to ref_segment_dot(wt).
void node_partial_gemv_rows(const SegmentTable& t, int node, DType wt, const void* W, int64_t K, int64_t n0,
                            int64_t n1, const float* X, int64_t ldx, int64_t M, float* P, int64_t ldp,
                            SegmentDotFn dot = nullptr);

// Y[m*ldy + j] = sum_{node < nodes} partials[node*node_stride + m*ldp + j]
// for m < M, j < cols, summed in node order.
void reduce_partials(const float* partials, int nodes, int64_t node_stride, int64_t M, int64_t cols, int64_t ldp,
                     float* Y, int64_t ldy);

// Floats of scratch partitioned_gemv_rows needs: nodes * M * (n1 - n0)
// (0 for a one-node table).
size_t partitioned_scratch_floats(const SegmentTable& t, int64_t M, int64_t n0, int64_t n1);

// Y[m*ldy + (n - n0)] = sum_{k<K} W[n*K + k] * X[m*ldx + k] for n in [n0, n1),
// m < M (the GemmRowsFn contract of tier.h), with the work split by node:
// each node's partial over its local segments (one Parallel task per node),
// then reduce_partials. One-node table: a single branch, then `fast`
// (e.g. tier.gemm_rows[wt]) or, when null, the segment kernel over [0, K)
// straight into Y. `scratch` holds partitioned_scratch_floats() floats, or
// is null to allocate internally. Requires t.cols == K, n1 <= t.rows.
void partitioned_gemv_rows(const SegmentTable& t, DType wt, const void* W, int64_t K, int64_t n0, int64_t n1,
                           const float* X, int64_t ldx, int64_t M, float* Y, int64_t ldy, float* scratch = nullptr,
                           const Parallel& par = Parallel{}, GemmRowsFn fast = nullptr, SegmentDotFn dot = nullptr);

}  // namespace numa
}  // namespace hinamoe
