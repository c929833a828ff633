// The KV cache step of GroupQueryAttention: the present K/V rows (past rows
// kept or shifted, new K rotated, a windowed cache's eviction, staged rows
// where a multi-token step evicts keys its own queries still see) and the
// queries rotated and scaled for the attention (gqa_attend.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "gqa/gqa_step.h"

namespace hinamoe {
namespace gqa_detail {
namespace {

// Rows a windowed cache of capacity C (window W) holds after T tokens (gqa.h).
int64_t window_resident(int64_t T, int64_t C, int64_t W) {
  if (T <= C) return T;
  const int64_t G = C - W + 1;
  return T - G * ((T - C + G - 1) / G);
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

}  // namespace

void cache_step(const GqaShape& s, const GqaAttrs& a, const GqaTensors& t, const Parallel& par, GqaStep* st) {
  const int64_t B = s.batch, S = s.seq, N = s.num_heads, Nkv = s.kv_num_heads, d = s.head_dim;
  const int64_t G = N / Nkv, cap = s.present_capacity;
  const bool packed = t.key == nullptr;
  const bool shared = t.past_key != nullptr && t.past_key == t.present_key;
  const float alpha = a.scale == 0.0f ? 1.0f / std::sqrt(float(d)) : a.scale;

  const DType dt = element_type(t);
  const size_t es = dtype_size(dt);
  st->dt = dt;
  st->es = es;
  st->kv_heads = Nkv;
  st->head_dim = d;
  st->capacity = cap;
  st->window = a.local_window_size;
  st->present_key = t.present_key;
  st->present_value = t.present_value;
  auto at = [es](const void* p, int64_t i) { return static_cast<const uint8_t*>(p) + i * int64_t(es); };
  auto at_mut = [es](void* p, int64_t i) { return static_cast<uint8_t*>(p) + i * int64_t(es); };
  // Element offsets of token data: query (packed or not), key, value.
  const int64_t q_tok = packed ? (N + 2 * Nkv) * d : N * d;
  const void* key = packed ? t.query : t.key;
  const void* value = packed ? t.query : t.value;
  const int64_t k_off = packed ? N * d : 0, v_off = packed ? (N + Nkv) * d : 0;
  const int64_t kv_tok = packed ? q_tok : Nkv * d;
  const int64_t half = t.rotary_half;

  std::vector<RowLengths>& rows = st->rows;
  rows.resize(size_t(B));
  for (int64_t b = 0; b < B; ++b) rows[b] = row_lengths(s, t, b);
  auto position = [&](int64_t b, int64_t i) { return rotary_position(s, t, rows[b], b, i); };
  const int64_t W = a.local_window_size;

  // Windowed cache: per row, the layouts before and after and where attention reads.
  std::vector<WindowRows>& win = st->win;
  win.assign(a.sliding_window_cache ? size_t(B) : 0, WindowRows{});
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
  std::vector<uint8_t>& stage_k = st->stage_k;
  std::vector<uint8_t>& stage_v = st->stage_v;
  stage_k.assign(size_t(stage_elems) * es, 0);
  stage_v.assign(size_t(stage_elems) * es, 0);
  // Per (b, KV head): the present rows (past rows for separate buffers,
  //    the new K rotated and V), and the G query heads rotated (rounded to T
  //    as ORT stores them) and scaled, as float in [B, Nkv, S, G, d] so a
  //    tile of tokens of one KV head is one block of rows. A decode step's
  //    few KB run on the calling thread: a pool dispatch would cost more.
  std::vector<float>& qbuf = st->q;
  qbuf.assign(size_t(B * N * S * d), 0.0f);
  // Per (b, KV head): the first and last new V rows (< total_b) holding a
  // non-finite value, or -1. A query token that does not see one (later
  // tokens of a prompt, keys before its window) still gets it times weight 0
  // in ORT's P.V (NaN); such rows take the exact path.
  std::vector<int64_t>& v_bad_first = st->v_bad_first;
  std::vector<int64_t>& v_bad_last = st->v_bad_last;
  v_bad_first.assign(size_t(B * Nkv), -1);
  v_bad_last.assign(size_t(B * Nkv), -1);
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

}

}  // namespace gqa_detail
}  // namespace hinamoe
