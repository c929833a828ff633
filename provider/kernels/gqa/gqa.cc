// GroupQueryAttention driver: validation, rotary + KV append, and the split
// of the attention into (batch row, KV head, query tile, key range) work
// items that the tier's chunk kernel runs; ranges split across items are
// merged afterwards with a log-sum-exp combine. Semantics: see gqa.h.
#include "gqa/gqa.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "dtype.h"
#include "gqa/gqa_amx.h"
#include "gqa/gqa_exact.h"
#include "tier.h"

namespace hinamoe {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNegInf = -kInf;
constexpr int64_t kTileRows = 64;      // query rows (heads x tokens) per work item, at most
constexpr int64_t kPieceKeys = 128;    // keys per chunk-kernel call (scores stay in L1/L2)
constexpr int64_t kMinSplitKeys = 256; // a key range is split across items only above this

std::string num(int64_t v) { return std::to_string(v); }

// Where row b's tokens sit: past_b = first rows of the cache, total_b after this step.
struct RowLengths {
  int64_t past = 0;
  int64_t total = 0;
};

RowLengths row_lengths(const GqaShape& s, const GqaTensors& t, int64_t b) {
  RowLengths r;
  r.total = int64_t(t.seqlens_k[b]) + 1;
  r.past = s.seq == s.total_sequence_length ? 0 : r.total - s.seq;
  return r;
}

// Rows a windowed cache of capacity C (window W) holds after T tokens (gqa.h).
int64_t window_resident(int64_t T, int64_t C, int64_t W) {
  if (T <= C) return T;
  const int64_t G = C - W + 1;
  return T - G * ((T - C + G - 1) / G);
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

// Rotary position of token i of row b (gqa.h): ORT's first prompt takes one
// base for all rows, later steps one position per token.
int64_t rotary_position(const GqaShape& s, const GqaTensors& t, const RowLengths& r, int64_t b, int64_t i) {
  if (s.seq == s.total_sequence_length) return (t.position_ids ? t.position_ids[0] : 0) + i;
  return t.position_ids ? t.position_ids[b * s.seq + i] : r.past + i;
}

// Rotates one head vector (float) in place by cache row `pos` (see gqa.h);
// the caches hold the op's element type.
void rotate(float* x, const void* cos_c, const void* sin_c, int64_t pos, int64_t half, bool interleaved, DType dt) {
  for (int64_t i = 0; i < half; ++i) {
    const float c = load_as_f32(cos_c, pos * half + i, dt), s = load_as_f32(sin_c, pos * half + i, dt);
    const int64_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
    const float a = x[ia], b = x[ib];
    x[ia] = a * c - b * s;
    x[ib] = b * c + a * s;
  }
}

// x rounded to the op's element type (f16 or bf16, round to nearest even).
float round_to(float x, DType dt) {
  return dt == DType::F16 ? f16_to_f32(f32_to_f16(x)) : bf16_to_f32(f32_to_bf16(x));
}

// Whether n elements of type dt at p are all finite (exponent bits not all ones).
bool all_finite(const void* p, int64_t n, DType dt) {
  bool ok = true;
  if (dt == DType::F32) {
    const uint32_t* u = static_cast<const uint32_t*>(p);
    for (int64_t i = 0; i < n; ++i) ok &= (u[i] & 0x7f800000u) != 0x7f800000u;
  } else {
    const uint16_t* u = static_cast<const uint16_t*>(p);
    const uint16_t e = dt == DType::F16 ? 0x7c00 : 0x7f80;
    for (int64_t i = 0; i < n; ++i) ok &= (u[i] & e) != e;
  }
  return ok;
}

// Per-thread buffers of the attention items (grow once, reused).
struct ItemScratch {
  std::vector<int64_t> lo, hi;
  std::vector<const float*> bias;
  std::vector<float> m, l, acc, chunk;
};
ItemScratch& item_scratch() {
  static thread_local ItemScratch s;
  return s;
}

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

  const int64_t B = s.batch, S = s.seq, N = s.num_heads, Nkv = s.kv_num_heads, d = s.head_dim;
  const int64_t G = N / Nkv, cap = s.present_capacity;
  const bool packed = t.key == nullptr;
  const bool shared = t.past_key != nullptr && t.past_key == t.present_key;
  const float alpha = a.scale == 0.0f ? 1.0f / std::sqrt(float(d)) : a.scale;

  const DType dt = t.dtype == GqaDType::F16 ? DType::F16 : t.dtype == GqaDType::BF16 ? DType::BF16 : DType::F32;
  const size_t es = dtype_size(dt);
  auto at = [es](const void* p, int64_t i) { return static_cast<const uint8_t*>(p) + i * int64_t(es); };
  auto at_mut = [es](void* p, int64_t i) { return static_cast<uint8_t*>(p) + i * int64_t(es); };
  // Element offsets of token data: query (packed or not), key, value.
  const int64_t q_tok = packed ? (N + 2 * Nkv) * d : N * d;
  const void* key = packed ? t.query : t.key;
  const void* value = packed ? t.query : t.value;
  const int64_t k_off = packed ? N * d : 0, v_off = packed ? (N + Nkv) * d : 0;
  const int64_t kv_tok = packed ? q_tok : Nkv * d;
  const int64_t half = t.rotary_half;

  std::vector<RowLengths> rows(B);
  for (int64_t b = 0; b < B; ++b) rows[b] = row_lengths(s, t, b);
  auto position = [&](int64_t b, int64_t i) { return rotary_position(s, t, rows[b], b, i); };
  const int64_t W = a.local_window_size;

  // Windowed cache: per row, the layouts before and after and where attention reads.
  std::vector<WindowRows> win(a.sliding_window_cache ? B : 0);
  int64_t stage_elems = 0;
  for (int64_t b = 0; b < int64_t(win.size()); ++b) {
    WindowRows& w = win[b];
    const int64_t P = rows[b].past, T = rows[b].total;
    w.kept_past = window_resident(P, s.past_capacity, W);
    w.first = T - window_resident(T, cap, W);
    w.fresh = T - P;
    // The first query (position P) sees keys from P - W + 1 on.
    w.staged = w.first > std::max<int64_t>(0, P - W + 1);
    w.base = w.staged ? P - w.kept_past : w.first;
    if (w.staged) {
      w.stage_rows = w.kept_past + w.fresh;
      w.stage_offset = stage_elems;
      stage_elems += Nkv * w.stage_rows * d;
    }
  }
  std::vector<uint8_t> stage_k(size_t(stage_elems) * es), stage_v(size_t(stage_elems) * es);
  // The K/V rows attention reads for (b, h): row r holds position r + base.
  auto kv_rows = [&](int64_t b, int64_t h, bool value) -> const uint8_t* {
    if (!win.empty() && win[b].staged)
      return (value ? stage_v : stage_k).data() + (win[b].stage_offset + h * win[b].stage_rows * d) * int64_t(es);
    return at(value ? t.present_value : t.present_key, (b * Nkv + h) * cap * d);
  };
  auto row_base = [&](int64_t b) { return win.empty() ? int64_t(0) : win[b].base; };

  // 1. Per (b, KV head): the present rows (past rows for separate buffers,
  //    the new K rotated and V), and the G query heads rotated (rounded to T
  //    as ORT stores them) and scaled, as float in [B, Nkv, S, G, d] so a
  //    tile of tokens of one KV head is one block of rows. A decode step's
  //    few KB run on the calling thread: a pool dispatch would cost more.
  std::vector<float> qbuf(size_t(B * N * S * d));
  // Per (b, KV head): the first and last new V rows (< total_b) holding a
  // non-finite value, or -1. A query token that does not see one (later
  // tokens of a prompt, keys before its window) still gets it times weight 0
  // in ORT's P.V (NaN); such rows take the exact path.
  std::vector<int64_t> v_bad_first(size_t(B * Nkv), -1), v_bad_last(size_t(B * Nkv), -1);
  const bool small_prep = shared && B * S * (N + 2 * Nkv) * d <= (int64_t(1) << 16);
  (small_prep ? serial() : par).for_each(size_t(B * Nkv), [&](size_t item) {
    const int64_t b = int64_t(item) / Nkv, h = int64_t(item) % Nkv;
    const int64_t base = (b * Nkv + h) * cap * d;
    const int64_t past = rows[b].past;
    const int64_t past_off = (b * Nkv + h) * s.past_capacity * d;
    const WindowRows* w = win.empty() ? nullptr : &win[b];
    // Past rows to keep, as (first source row, count, first destination row).
    int64_t keep_src = 0, keep_n = past, keep_dst = 0;
    if (w != nullptr && !w->staged) {
      keep_src = w->first - (past - w->kept_past);
      keep_n = std::max<int64_t>(0, past - w->first);
    }
    if (!shared) {
      // Zero what the copies below leave unwritten: without a window, the
      // rows after past + S (a shorter row of a ragged batch); else all.
      const int64_t z0 = w == nullptr ? std::min(cap, past + S) : 0;
      std::memset(at_mut(t.present_key, base + z0 * d), 0, es * (cap - z0) * d);
      std::memset(at_mut(t.present_value, base + z0 * d), 0, es * (cap - z0) * d);
    }
    // New K/V rows go to present (row past + i, or position - first when
    // windowed), or to the stage.
    void* new_k = t.present_key;
    void* new_v = t.present_value;
    int64_t new_row0 = base + (w != nullptr ? past - w->first : past) * d;
    if (w != nullptr && w->staged) {
      uint8_t* sk = stage_k.data() + (w->stage_offset + h * w->stage_rows * d) * int64_t(es);
      uint8_t* sv = stage_v.data() + (w->stage_offset + h * w->stage_rows * d) * int64_t(es);
      std::memcpy(sk, at(t.past_key, past_off), es * w->kept_past * d);
      std::memcpy(sv, at(t.past_value, past_off), es * w->kept_past * d);
      new_k = sk;
      new_v = sv;
      new_row0 = w->kept_past * d;
    } else if (keep_n > 0 && !(shared && keep_src == keep_dst)) {
      // memmove: a windowed shared buffer shifts its kept rows to row 0.
      std::memmove(at_mut(t.present_key, base + keep_dst * d), at(t.past_key, past_off + keep_src * d), es * keep_n * d);
      std::memmove(at_mut(t.present_value, base + keep_dst * d), at(t.past_value, past_off + keep_src * d),
                   es * keep_n * d);
    }
    const int64_t n_new = w != nullptr ? w->fresh : S;
    std::vector<float> kr(static_cast<size_t>(d));
    for (int64_t i = 0; i < n_new; ++i) {
      const int64_t dst = new_row0 + i * d;
      const int64_t src_k = (b * S + i) * kv_tok + k_off + h * d, src_v = (b * S + i) * kv_tok + v_off + h * d;
      std::memcpy(at_mut(new_v, dst), at(value, src_v), es * d);
      if (S > 1 && past + i < rows[b].total && !all_finite(at(value, src_v), d, dt)) {
        if (v_bad_first[item] < 0) v_bad_first[item] = past + i;
        v_bad_last[item] = past + i;
      }
      if (a.do_rotary) {
        for (int64_t j = 0; j < d; ++j) kr[j] = load_as_f32(key, src_k + j, dt);
        rotate(kr.data(), t.cos_cache, t.sin_cache, position(b, i), half, a.rotary_interleaved, dt);
        for (int64_t j = 0; j < d; ++j) store_from_f32(new_k, dst + j, dt, kr[j]);
      } else {
        std::memcpy(at_mut(new_k, dst), at(key, src_k), es * d);
      }
    }
    if (w != nullptr && w->staged) {
      // Present gets its final layout from the stage (the past rows it
      // overwrites were staged above).
      const int64_t from = w->first - (past - w->kept_past), n = rows[b].total - w->first;
      std::memcpy(at_mut(t.present_key, base), static_cast<const uint8_t*>(new_k) + from * d * int64_t(es), es * n * d);
      std::memcpy(at_mut(t.present_value, base), static_cast<const uint8_t*>(new_v) + from * d * int64_t(es), es * n * d);
    }
    for (int64_t g = 0; g < G; ++g) {
      const int64_t n = h * G + g;
      for (int64_t i = 0; i < S; ++i) {
        float* qd = qbuf.data() + (((b * Nkv + h) * S + i) * G + g) * d;
        const int64_t src = (b * S + i) * q_tok + n * d;
        for (int64_t j = 0; j < d; ++j) qd[j] = load_as_f32(t.query, src + j, dt);
        if (a.do_rotary) {
          rotate(qd, t.cos_cache, t.sin_cache, position(b, i), half, a.rotary_interleaved, dt);
          if (dt != DType::F32)
            for (int64_t j = 0; j < d; ++j) qd[j] = round_to(qd[j], dt);
        }
        for (int64_t j = 0; j < d; ++j) qd[j] *= alpha;
      }
    }
  });

  // Bias and sink as float (converted once when T is f16 or bf16).
  std::vector<float> bias_f, sink_f;
  const float* bias = static_cast<const float*>(t.attention_bias);
  const float* sink = static_cast<const float*>(t.head_sink);
  if (dt != DType::F32) {
    if (t.attention_bias) {
      bias_f.resize(size_t(t.bias_batch * t.bias_heads * S * t.bias_keys));
      for (size_t i = 0; i < bias_f.size(); ++i) bias_f[i] = load_as_f32(t.attention_bias, int64_t(i), dt);
      bias = bias_f.data();
    }
    if (t.head_sink) {
      sink_f.resize(size_t(N));
      for (int64_t n = 0; n < N; ++n) sink_f[size_t(n)] = load_as_f32(t.head_sink, n, dt);
      sink = sink_f.data();
    }
  }
  const GqaChunkFn chunk = dt == DType::F16 ? tier.chunk_f16 : dt == DType::BF16 ? tier.chunk_bf16 : tier.chunk;

  // 2. Work items. A group is (b, h, tile of query tokens); its visible keys
  //    [klo, khi) are split over several items when there are too few groups
  //    to keep the threads busy (decode at batch 1).
  const int64_t tile_tok = std::max<int64_t>(1, kTileRows / G);
  const int64_t tiles = (S + tile_tok - 1) / tile_tok;
  const int64_t groups = B * Nkv * tiles;
  // Keys row (b, i) sees, as rows of kv_rows(b, .): positions minus row_base(b).
  auto visible = [&](int64_t b, int64_t i, int64_t* lo, int64_t* hi) {
    const int64_t L = std::min(rows[b].past + i + 1, rows[b].total);
    *hi = L - row_base(b);
    *lo = ((W > 0 && L > W) ? L - W : 0) - row_base(b);
  };
  std::vector<int64_t> klo(groups), khi(groups), split_begin(groups + 1);
  const int64_t target = par.threads > 1 ? 4 * int64_t(par.threads) : 1;
  split_begin[0] = 0;
  for (int64_t gi = 0; gi < groups; ++gi) {
    const int64_t b = gi / (Nkv * tiles), tile = gi % tiles;
    const int64_t i0 = tile * tile_tok, i1 = std::min(S, i0 + tile_tok) - 1;
    int64_t lo0, hi0, lo1, hi1;
    visible(b, i0, &lo0, &hi0);
    visible(b, i1, &lo1, &hi1);
    klo[gi] = lo0;
    khi[gi] = hi1;
    const int64_t keys = khi[gi] - klo[gi];
    int64_t splits = 1;
    if (groups < target) {
      splits = std::min((target + groups - 1) / groups, (keys + kMinSplitKeys - 1) / kMinSplitKeys);
      splits = std::max<int64_t>(1, splits);
    }
    split_begin[gi + 1] = split_begin[gi] + splits;
  }
  const int64_t items = split_begin[groups];
  const int64_t tile_rows_max = tile_tok * G;
  const int64_t state_floats = tile_rows_max * (d + 2);
  std::vector<float> partial(items > groups ? size_t(items * state_floats) : 0);

  // Row r of a tile = token i0 + r / G, head h*G + r % G.
  // Bias columns are absolute positions; the kernels index them by cache row.
  auto bias_row = [&](int64_t b, int64_t n, int64_t i) {
    const int64_t bb = t.bias_batch > 1 ? b : 0, bn = t.bias_heads > 1 ? n : 0;
    return bias + ((bb * t.bias_heads + bn) * S + i) * t.bias_keys + row_base(b);
  };
  const bool use_sink = t.head_sink != nullptr || a.smooth_softmax;
  // A row leaves the fast path when its state is not that of finite scores
  // over >= 1 visible key with finite sums (gqa_exact.h says which cases):
  // m NaN (a kernel saw a NaN or +inf score) or -inf (all masked), l or acc
  // not finite, a NaN or +inf sink, or a non-finite hidden V row of a prompt.
  auto finalize = [&](int64_t b, int64_t h, int64_t i0, int64_t nrows, const float* m, const float* l,
                      const float* acc) {
    for (int64_t r = 0; r < nrows; ++r) {
      const int64_t i = i0 + r / G, n = h * G + r % G;
      const int64_t o = ((b * S + i) * N + n) * d;
      const float* ar = acc + r * d;
      int64_t lo, hi;
      visible(b, i, &lo, &hi);
      const float sk = sink ? sink[n] : 0.0f;
      const size_t bh = size_t(b * Nkv + h);
      const int64_t rb = row_base(b);  // v_bad_* are positions, lo/hi cache rows
      bool exact = !std::isfinite(m[r]) || !std::isfinite(l[r]) || (use_sink && !(sk < kInf)) ||
                   v_bad_last[bh] >= hi + rb || (v_bad_first[bh] >= 0 && v_bad_first[bh] < lo + rb);
      for (int64_t j = 0; j < d; ++j) exact |= !(std::fabs(ar[j]) <= std::numeric_limits<float>::max());
      if (exact) {
        GqaExactRow er;
        er.q = qbuf.data() + (((b * Nkv + h) * S + i) * G + r % G) * d;
        er.d = d;
        er.k = kv_rows(b, h, false);
        er.v = kv_rows(b, h, true);
        er.dt = dt;
        er.lo = lo;
        er.hi = hi;
        er.total = rows[b].total - rb;
        er.fresh = rows[b].past - rb;
        if (bias) er.bias = bias_row(b, n, i);
        er.softcap = a.softcap;
        er.has_sink = use_sink;
        er.sink = sk;
        std::vector<float> ex(static_cast<size_t>(d));
        gqa_exact_row(er, ex.data());
        for (int64_t j = 0; j < d; ++j) store_from_f32(t.output, o + j, dt, ex[size_t(j)]);
        continue;
      }
      float scale_acc = 1.0f, denom = l[r];
      if (use_sink) {
        const float M = std::max(m[r], sk);
        scale_acc = std::exp(m[r] - M);
        denom = l[r] * scale_acc + std::exp(sk - M);
      }
      const float f = scale_acc / denom;
      if (dt == DType::F32) {
        float* of = static_cast<float*>(t.output) + o;
        for (int64_t j = 0; j < d; ++j) of[j] = ar[j] * f;
      } else {
        for (int64_t j = 0; j < d; ++j) store_from_f32(t.output, o + j, dt, ar[j] * f);
      }
    }
  };

  // Log-sum-exp merge of a split group's partial states, run by whichever
  // item of the group finishes last (no extra pass over the pool).
  std::vector<std::atomic<int>> splits_done(items > groups ? size_t(groups) : 0);
  auto merge = [&](int64_t gi) {
    const int64_t splits = split_begin[gi + 1] - split_begin[gi];
    const int64_t b = gi / (Nkv * tiles), h = (gi / tiles) % Nkv, tile = gi % tiles;
    const int64_t i0 = tile * tile_tok, nrows = (std::min(S, i0 + tile_tok) - i0) * G;
    ItemScratch& sc = item_scratch();
    sc.m.assign(nrows, kNegInf);
    sc.l.assign(nrows, 0.0f);
    sc.acc.assign(size_t(nrows * d), 0.0f);
    for (int64_t p = 0; p < splits; ++p) {
      const float* st = partial.data() + (split_begin[gi] + p) * state_floats;
      for (int64_t r = 0; r < nrows; ++r) {
        const float mp = st[r];
        if (std::isnan(mp) || std::isnan(sc.m[r])) {  // a NaN / +inf score: the row goes exact
          sc.m[r] = std::numeric_limits<float>::quiet_NaN();
          continue;
        }
        const float* pa = st + 2 * nrows + r * d;
        if (mp == kNegInf) {  // nothing visible there but masked keys: only a NaN from 0 x Inf matters
          bool finite = true;
          for (int64_t j = 0; j < d; ++j) finite &= std::isfinite(pa[j]);
          if (!finite) sc.m[r] = std::numeric_limits<float>::quiet_NaN();
          continue;
        }
        const float M = std::max(sc.m[r], mp);
        const float fo = sc.m[r] == kNegInf ? 0.0f : std::exp(sc.m[r] - M), fp = std::exp(mp - M);
        sc.l[r] = sc.l[r] * fo + st[nrows + r] * fp;
        float* acc = sc.acc.data() + r * d;
        for (int64_t j = 0; j < d; ++j) acc[j] = acc[j] * fo + pa[j] * fp;
        sc.m[r] = M;
      }
    }
    finalize(b, h, i0, nrows, sc.m.data(), sc.l.data(), sc.acc.data());
  };

  par.for_each(size_t(items), [&](size_t item) {
    const int64_t gi = int64_t(std::upper_bound(split_begin.begin(), split_begin.end(), int64_t(item)) -
                               split_begin.begin()) - 1;
    const int64_t part = int64_t(item) - split_begin[gi], splits = split_begin[gi + 1] - split_begin[gi];
    const int64_t b = gi / (Nkv * tiles), h = (gi / tiles) % Nkv, tile = gi % tiles;
    const int64_t i0 = tile * tile_tok, ntok = std::min(S, i0 + tile_tok) - i0, nrows = ntok * G;
    // Even split of the group's keys, boundaries on multiples of 8.
    const int64_t keys = khi[gi] - klo[gi];
    auto bound = [&](int64_t p) {
      if (p >= splits) return khi[gi];
      return std::min(khi[gi], klo[gi] + ((keys * p / splits) & ~int64_t(7)));
    };
    const int64_t a0 = bound(part), a1 = bound(part + 1);

    ItemScratch& sc = item_scratch();
    sc.lo.resize(nrows);
    sc.hi.resize(nrows);
    sc.bias.resize(nrows);
    sc.m.assign(nrows, kNegInf);
    sc.l.assign(nrows, 0.0f);
    sc.acc.assign(size_t(nrows * d), 0.0f);
    sc.chunk.resize(size_t(gqa_chunk_scratch_floats(nrows, kPieceKeys)));
    for (int64_t r = 0; r < nrows; ++r) {
      const int64_t i = i0 + r / G, n = h * G + r % G;
      visible(b, i, &sc.lo[r], &sc.hi[r]);
      if (bias) sc.bias[r] = bias_row(b, n, i);
    }
    GqaChunkArgs ca;
    ca.q = qbuf.data() + ((b * Nkv + h) * S + i0) * G * d;
    ca.rows = nrows;
    ca.d = d;
    ca.k = kv_rows(b, h, false);
    ca.v = kv_rows(b, h, true);
    ca.kv_stride = d;
    ca.lo = sc.lo.data();
    ca.hi = sc.hi.data();
    ca.bias = bias ? sc.bias.data() : nullptr;
    ca.softcap = a.softcap;
    ca.m = sc.m.data();
    ca.l = sc.l.data();
    ca.acc = sc.acc.data();
    ca.scratch = sc.chunk.data();
    for (int64_t k0 = a0; k0 < a1; k0 += kPieceKeys) {
      ca.k0 = k0;
      ca.k1 = std::min(a1, k0 + kPieceKeys);
      ca.same_q = k0 > a0;
      chunk(ca);
    }
    if (splits == 1) {
      finalize(b, h, i0, nrows, sc.m.data(), sc.l.data(), sc.acc.data());
    } else {
      float* st = partial.data() + item * state_floats;
      std::memcpy(st, sc.m.data(), sizeof(float) * nrows);
      std::memcpy(st + nrows, sc.l.data(), sizeof(float) * nrows);
      std::memcpy(st + 2 * nrows, sc.acc.data(), sizeof(float) * nrows * d);
      if (splits_done[size_t(gi)].fetch_add(1, std::memory_order_acq_rel) + 1 == splits) merge(gi);
    }
  });

  return "";
}

const GqaTier* select_gqa_tier(const std::string& name, std::string* error) {
  const KernelTier* kt = select_tier(name, error);
  if (!kt) return nullptr;
  const std::string got = kt->name;
  // "auto" keeps GQA on the row kernels on AMX CPUs: on the one AMX machine
  // measured (2026-11-29, docs/benchmarks.md) the tile kernel ran bf16 K/V at a third of
  // the avx2 kernel's speed; its non-tile steps were vectorised since, but
  // that is unmeasured on silicon, so only an explicit "amx" picks it.
  if (got == "amx") return name == "auto" ? &gqa_avx2_tier() : &gqa_amx_tier();
  if (got == "amx-emu") return &gqa_amx_emu_tier();
  if (got == "avx2") return &gqa_avx2_tier();
  if (got == "avx512") return &gqa_avx512_tier();
  return &gqa_ref_tier();
}

}  // namespace hinamoe
