// GroupQueryAttention driver: validation, then the KV cache step
// (gqa_cache.cc: rotary, KV append, windowed caches) and the attention over
// it (gqa_attend.cc: work split, chunk kernels, merge). Semantics: see gqa.h.
#include "gqa/gqa.h"

#include <algorithm>
#include <string>

#include "gqa/gqa_step.h"
#include "tier.h"

namespace hinamoe {
namespace {

using gqa_detail::RowLengths;
using gqa_detail::row_lengths;
using gqa_detail::rotary_position;

std::string num(int64_t v) { return std::to_string(v); }

}  // namespace

std::string gqa_validate(const GqaShape& s, const GqaAttrs& a, const GqaTensors& t) {
  const std::string op = "GroupQueryAttention: ";
  if (t.dtype != GqaDType::F32 && t.dtype != GqaDType::F16 && t.dtype != GqaDType::BF16)
    return op + "only float32, float16 and bfloat16 are supported";
  if (s.num_heads <= 0 || s.kv_num_heads <= 0)
    return op + "num_heads (" + num(s.num_heads) + ") and kv_num_heads (" + num(s.kv_num_heads) +
           ") must be positive";
  if (s.num_heads % s.kv_num_heads != 0)
    return op + "num_heads (" + num(s.num_heads) + ") must be a multiple of kv_num_heads (" +
           num(s.kv_num_heads) + ")";
  if (s.batch <= 0 || s.seq <= 0) return op + "query must have batch and sequence dims > 0";
  if (s.head_dim <= 0 || s.head_dim % 8 != 0)
    return op + "head_size must be a positive multiple of 8, got " + num(s.head_dim);
  if (!t.query || !t.output || !t.seqlens_k) return op + "query, seqlens_k and output are required";
  if ((t.key == nullptr) != (t.value == nullptr))
    return op + "key and value must both be present or both absent (packed QKV)";
  if ((t.past_key == nullptr) != (t.past_value == nullptr))
    return op + "past_key and past_value must both be present or both absent";
  if (!t.present_key || !t.present_value) return op + "present_key and present_value buffers are required";
  const bool shared_k = t.past_key && t.past_key == t.present_key;
  const bool shared_v = t.past_value && t.past_value == t.present_value;
  if (shared_k != shared_v)
    return op + "past_key/present_key and past_value/present_value must both share a buffer or both not";
  if (s.past_capacity < 0) return op + "past_key dim 2 must be >= 0";
  if (!t.past_key && s.past_capacity != 0) return op + "past_capacity given without past_key";
  if (s.total_sequence_length <= 0)
    return op + "total_sequence_length must be positive, got " + num(s.total_sequence_length);
  if (a.sliding_window_cache) {
    if (a.local_window_size <= 0)
      return op + "sliding_window_cache=1 needs local_window_size > 0, got " + num(a.local_window_size);
    if (!t.past_key) return op + "sliding_window_cache=1 needs past_key/past_value (dim 2 is the window capacity)";
    if (s.past_capacity < a.local_window_size)
      return op + "sliding_window_cache=1: past_key dim 2 (the window capacity, " + num(s.past_capacity) +
             ") must be >= local_window_size (" + num(a.local_window_size) + ")";
    if (s.present_capacity != s.past_capacity)
      return op + "sliding_window_cache=1: present_key dim 2 must be past_key dim 2 (" + num(s.past_capacity) +
             "), got " + num(s.present_capacity);
  } else if (s.present_capacity != std::max(s.total_sequence_length, s.past_capacity)) {
    return op + "present_key dim 2 must be max(total_sequence_length, past_key dim 2) = " +
           num(std::max(s.total_sequence_length, s.past_capacity)) + ", got " + num(s.present_capacity);
  }
  if (shared_k && s.past_capacity != s.present_capacity)
    return op + "a shared past/present buffer must have one capacity";
  if (a.local_window_size == 0) return op + "local_window_size 0 is not supported (use -1 for no window)";

  const bool first = s.seq == s.total_sequence_length;
  if (!first && s.seq > 1 && s.batch != 1)
    return op + "batch_size must be 1 when sequence_length > 1 and past context is given";
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t sk = t.seqlens_k[b];
    if (sk < 0 || sk >= s.total_sequence_length)
      return op + "seqlens_k[" + num(b) + "] = " + num(sk) + " is out of range [0, " +
             num(s.total_sequence_length) + ")";
    const RowLengths r = row_lengths(s, t, b);
    if (r.past < 0)
      return op + "seqlens_k[" + num(b) + "] = " + num(sk) + " is shorter than the " + num(s.seq) +
             " new tokens";
    if (a.sliding_window_cache) {
      // As ORT: no padded first-prompt rows (only query_seqlens could mark them).
      if (first && sk + 1 < s.seq)
        return op + "seqlens_k[" + num(b) + "] = " + num(sk) + " is too small for sequence_length " + num(s.seq) +
               " (sliding_window_cache=1 takes no right-padded prompt rows)";
      continue;  // any lengths fit: the op evicts
    }
    if (r.past + s.seq > s.present_capacity)
      return op + "seqlens_k[" + num(b) + "] = " + num(sk) + " puts the new tokens beyond the present buffer (" +
             num(s.present_capacity) + " rows)";
    if (r.past > 0 && !t.past_key)
      return op + "seqlens_k[" + num(b) + "] = " + num(sk) + " asks for " + num(r.past) +
             " past tokens but past_key is absent";
    if (r.past > s.past_capacity)
      return op + "seqlens_k[" + num(b) + "] = " + num(sk) + " asks for " + num(r.past) +
             " past tokens but past_key holds " + num(s.past_capacity);
  }
  // ORT's rule for the past buffer (shared or not, first prompt too): its
  // capacity plus the new tokens is the total (a cache that grows), or it
  // already holds the total (a preallocated cache). A windowed cache evicts
  // instead, so any total fits it.
  if (!a.sliding_window_cache && s.total_sequence_length != s.past_capacity + s.seq &&
      s.total_sequence_length > s.past_capacity)
    return op + "total_sequence_length (" + num(s.total_sequence_length) + ") must equal past_key dim 2 (" +
           num(s.past_capacity) + ") + sequence_length (" + num(s.seq) +
           ") for a dynamic cache, or be no greater than past_key dim 2 for a static cache";
  if (a.do_rotary) {
    if (!t.cos_cache || !t.sin_cache) return op + "do_rotary needs cos_cache and sin_cache";
    if (s.head_dim % 16 != 0) return op + "rotary needs head_size to be a multiple of 16, got " + num(s.head_dim);
    if (t.rotary_half <= 0 || t.rotary_half % 8 != 0 || t.rotary_half > s.head_dim / 2)
      return op + "cos_cache/sin_cache dim 1 must be a positive multiple of 8 and <= head_size / 2, got " +
             num(t.rotary_half);
    if (t.rotary_rows < s.total_sequence_length)
      return op + "cos_cache/sin_cache dim 0 (" + num(t.rotary_rows) +
             ") must be >= total_sequence_length (" + num(s.total_sequence_length) + ")";
    if (first && t.position_ids) {
      const int64_t base = t.position_ids[0];
      if (base < 0 || base > t.rotary_rows - s.seq)
        return op + "position_ids base value " + num(base) + " with sequence_length " + num(s.seq) +
               " exceeds cos/sin cache range [0, " + num(t.rotary_rows) + ")";
    }
    for (int64_t b = 0; b < s.batch; ++b) {
      const RowLengths r = row_lengths(s, t, b);
      for (int64_t i = 0; i < s.seq; ++i) {
        const int64_t p = rotary_position(s, t, r, b, i);
        if (p < 0 || p >= t.rotary_rows)
          return op + "position " + num(p) + " (batch " + num(b) + ", token " + num(i) +
                 ") is outside cos_cache/sin_cache (" + num(t.rotary_rows) + " rows)";
      }
    }
  } else if ((t.cos_cache == nullptr) != (t.sin_cache == nullptr)) {
    return op + "cos_cache and sin_cache must both be present or both absent";
  }
  if (t.attention_bias) {
    if (t.bias_batch != 1 && t.bias_batch != s.batch)
      return op + "attention_bias dim 0 must be batch_size or 1, got " + num(t.bias_batch);
    if (t.bias_heads != 1 && t.bias_heads != s.num_heads)
      return op + "attention_bias dim 1 must be num_heads or 1, got " + num(t.bias_heads);
    if (t.bias_keys != s.total_sequence_length)
      return op + "attention_bias dim 3 must be total_sequence_length (" + num(s.total_sequence_length) +
             "), got " + num(t.bias_keys);
  }
  if (t.head_sink && a.smooth_softmax) return op + "head_sink must not be given together with smooth_softmax";
  return "";
}

std::string gqa(const GqaShape& s, const GqaAttrs& a, const GqaTensors& t, const GqaTier& tier,
                const Parallel& par) {
  std::string err = gqa_validate(s, a, t);
  if (!err.empty()) return err;
  gqa_detail::GqaStep step;
  gqa_detail::cache_step(s, a, t, par, &step);
  gqa_detail::attend(s, a, t, tier, par, step);
  return "";
}

const GqaTier* select_gqa_tier(const std::string& name, std::string* error) {
  const KernelTier* kt = select_tier(name, error);
  if (!kt) return nullptr;
  // The tile kernel only by name: "auto" keeps GQA on the row kernels
  // (docs/kernels.md, "Tuning knobs").
  return name == "amx" && kt->gqa_tiles != nullptr ? kt->gqa_tiles : kt->gqa;
}

}  // namespace hinamoe
