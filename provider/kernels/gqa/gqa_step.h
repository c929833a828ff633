// Internal to the GroupQueryAttention driver (gqa.cc): the KV cache step
// (gqa_cache.cc) and the attention over what it leaves (gqa_attend.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dtype.h"
#include "gqa/gqa.h"
#include "parallel.h"

namespace hinamoe {
namespace gqa_detail {

// Where row b's tokens sit: past_b = first rows of the cache, total_b after this step.
struct RowLengths {
  int64_t past = 0;
  int64_t total = 0;
};

inline RowLengths row_lengths(const GqaShape& s, const GqaTensors& t, int64_t b) {
  RowLengths r;
  r.total = int64_t(t.seqlens_k[b]) + 1;
  r.past = s.seq == s.total_sequence_length ? 0 : r.total - s.seq;
  return r;
}

// Rotary position of token i of row b (gqa.h): ORT's first prompt takes one
// base for all rows, later steps one position per token.
inline int64_t rotary_position(const GqaShape& s, const GqaTensors& t, const RowLengths& r, int64_t b, int64_t i) {
  if (s.seq == s.total_sequence_length) return (t.position_ids ? t.position_ids[0] : 0) + i;
  return t.position_ids ? t.position_ids[b * s.seq + i] : r.past + i;
}

// Where attention reads row b's keys with a windowed cache: cache rows hold
// absolute positions from `base` on. When the final layout still holds every
// key this step's queries see, the present buffer is compacted first and
// read in place; otherwise (a multi-token step that evicts keys its first
// queries need) the past rows and the new ones are staged in a scratch copy.
struct WindowRows {
  int64_t kept_past = 0;  // L(past): rows the past buffer holds
  int64_t first = 0;      // position of present row 0 after the step: T - L(T)
  int64_t fresh = 0;      // valid new tokens entering the cache
  bool staged = false;
  int64_t base = 0;          // position of row 0 of the rows attention reads
  int64_t stage_rows = 0;    // staged: rows per KV head (kept_past + fresh)
  int64_t stage_offset = 0;  // staged: element offset of row b's block
};

// What attention reads once the cache step is done.
struct GqaStep {
  DType dt = DType::F32;
  size_t es = 4;
  int64_t kv_heads = 0, head_dim = 0, capacity = 0, window = 0;
  const void* present_key = nullptr;
  const void* present_value = nullptr;
  std::vector<RowLengths> rows;            // per batch row
  std::vector<WindowRows> win;             // per batch row, windowed cache only
  std::vector<uint8_t> stage_k, stage_v;   // staged rows of a windowed multi-token step
  std::vector<float> q;                    // [B, Nkv, S, G, d]: rotated, rounded to T, scaled
  // Per (b, KV head): the first and last new V rows (< total_b) holding a
  // non-finite value, or -1 (such rows take the exact path).
  std::vector<int64_t> v_bad_first, v_bad_last;

  // The K/V rows attention reads for (b, h): row r holds position r + row_base(b).
  const uint8_t* kv_rows(int64_t b, int64_t h, bool value) const {
    if (!win.empty() && win[size_t(b)].staged)
      return (value ? stage_v : stage_k).data() +
             (win[size_t(b)].stage_offset + h * win[size_t(b)].stage_rows * head_dim) * int64_t(es);
    return static_cast<const uint8_t*>(value ? present_value : present_key) +
           (b * kv_heads + h) * capacity * head_dim * int64_t(es);
  }
  int64_t row_base(int64_t b) const { return win.empty() ? int64_t(0) : win[size_t(b)].base; }
  // Keys query token i of row b sees, [lo, hi) as rows of kv_rows(b, .).
  void visible(int64_t b, int64_t i, int64_t* lo, int64_t* hi) const {
    const int64_t L = std::min(rows[size_t(b)].past + i + 1, rows[size_t(b)].total);
    *hi = L - row_base(b);
    *lo = ((window > 0 && L > window) ? L - window : 0) - row_base(b);
  }
};

inline DType element_type(const GqaTensors& t) {
  return t.dtype == GqaDType::F16 ? DType::F16 : t.dtype == GqaDType::BF16 ? DType::BF16 : DType::F32;
}

// Writes this step's present K/V (past rows kept, new K rotated) and the
// rotated, scaled queries into *st.
void cache_step(const GqaShape& s, const GqaAttrs& a, const GqaTensors& t, const Parallel& par, GqaStep* st);
// The attention over *st: work items of (batch row, KV head, query tile, key
// range) on the tier's chunk kernel, split ranges merged, the output written.
void attend(const GqaShape& s, const GqaAttrs& a, const GqaTensors& t, const GqaTier& tier, const Parallel& par,
            const GqaStep& st);

}  // namespace gqa_detail
}  // namespace hinamoe
