// The exact path of GroupQueryAttention: one query row computed the way
// ONNX Runtime's CPU kernel computes it, IEEE special values included. The
// fast chunk kernels assume finite scores; the driver (gqa.cc) sends here
// every row they cannot finish exactly: a NaN or +inf score (m = NaN after
// the chunks), a non-finite accumulator, a row whose visible keys are all
// masked, a NaN or +inf sink, or a non-finite V row the causal mask hides.
#pragma once

#include <cstdint>

#include "dtype.h"

namespace hinamoe {

struct GqaExactRow {
  const float* q = nullptr;  // [d], scaled and rotated as the kernels get it
  int64_t d = 0;
  const void* k = nullptr;  // this KV head's cache rows, d elements each, dtype `dt`
  const void* v = nullptr;
  DType dt = DType::F32;
  int64_t lo = 0, hi = 0;  // visible keys [lo, hi)
  int64_t total = 0;       // total_b: ORT's P.V runs over keys [0, total) with P = 0 where hidden
  int64_t fresh = 0;       // past_b: the first row this step wrote
  const float* bias = nullptr;  // the row's attention_bias by key position, or null
  float softcap = 0.0f;
  bool has_sink = false;
  float sink = 0.0f;
};

// out[0..d) = softmax(scores) . V as ORT defines it:
// * a NaN score, or a +inf one (exp(inf - inf)), makes the whole row NaN;
//   so does a NaN or +inf sink;
// * visible keys all masked (-inf) and no sink: 0 for float32 (ORT's MLAS
//   softmax), NaN for float16 and bfloat16 (ORT's half kernel; bfloat16
//   follows the other 16-bit type);
// * hidden keys weigh 0, and 0 x Inf / 0 x NaN is NaN: a non-finite V
//   element among the visible keys, keys [hi, total) (later tokens of a
//   prompt) or the rows this step wrote before the row's local window gives
//   NaN in its column. Cached rows (from earlier steps) before a local
//   window are never read: ORT multiplies them by 0 too, HinaMoE does not
//   look (it would cost a pass over the whole cache per step).
void gqa_exact_row(const GqaExactRow& r, float* out);

}  // namespace hinamoe
