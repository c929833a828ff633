// GroupQueryAttention (com.microsoft, ONNX Runtime 1.30-1.32 CPU semantics)
// as a plain C++17 operator: no ONNX Runtime types, so the EP glue, the C++
// tests and the benchmarks call the same entry point.
//
// What the op computes, in our words (N = num_heads, Nkv = kv_num_heads,
// G = N / Nkv query heads share one KV head, d = head_dim, S = new tokens):
//
// * Layouts. query [B, S, N*d] (BSNH), key/value [B, S, Nkv*d]. With key and
//   value absent, query is packed [B, S, (N + 2*Nkv)*d]: per token the N query
//   heads, then the Nkv key heads, then the Nkv value heads. past_* and
//   present_* are BNSH [B, Nkv, capacity, d]. output [B, S, N*d].
// * Lengths. seqlens_k[b] = (tokens of row b after this step) - 1, so
//   total_b = seqlens_k[b] + 1. The scalar total_sequence_length only decides
//   the phase and the present capacity:
//     first prompt   : S == total_sequence_length. Every row starts at 0
//                      (past_b = 0), whatever the past buffer holds; rows
//                      shorter than S are right-padded prompts.
//     continuation   : otherwise past_b = total_b - S. S must be 1 unless
//                      B == 1 (ORT's "interactive" subsequent prompt).
//   present capacity = max(total_sequence_length, past capacity).
// * KV append. The S new K rows (after rotary) and V rows of row b go to
//   present[b, h, past_b .. past_b + S - 1] -- all S of them, padding tokens
//   of a short prompt row included. Shared buffer (present_* == past_*): only
//   those rows are written, everything else stays as it was. Separate
//   buffers: present is zeroed, rows [0, past_b) are copied from past (row
//   stride = past capacity), then the new rows; all else stays zero.
// * Rotary (do_rotary). cos/sin caches [max_pos, R/2], R = rotary dim <= d;
//   dims [R, d) pass through. Non-interleaved: x[i], x[i + R/2] rotate as a
//   pair; interleaved: x[2i], x[2i+1]. Both Q and new K are rotated; V never.
//   Position of token s of row b: on the first prompt base + s for every
//   row, base = position_ids[0, 0] when given, else 0 (ORT reads only that
//   one element then); otherwise position_ids[b, s] when given, else
//   past_b + s.
// * Scores for query token s of row b against key j:
//     x = scale * q.k          (scale 0 means 1/sqrt(d))
//     x = softcap * tanh(x / softcap)          if softcap > 0
//     x = x + attention_bias[b|0, n|0, s, j]    if attention_bias is given
//   Visible keys: j < L = min(past_b + s + 1, total_b) (causal; the min
//   keeps padded prompt tokens inside their row), and with a local window
//   W > 0 only the last W of them: j >= L - W. (This is what later ORT
//   versions compute. For padded tokens -- s >= total_b in a right-padded
//   first prompt -- ORT 1.32 itself reads score slots it never wrote once
//   past_b + s + 1 > total_b, so its outputs there are not reproducible; all
//   other outputs are.)
// * Softmax over the visible keys. With smooth_softmax or head_sink, one
//   extra logit takes part in the denominator only: sink = head_sink[n]
//   (0 when only smooth_softmax is set):
//     p_j = exp(x_j - m) / (exp(sink - m) + sum_k exp(x_k - m)),
//     m = max(sink, max_k x_k).
//   out[b, s, n, :] = sum_j p_j * V[j, :]. Non-finite values as ORT's CPU
//   kernel treats them (gqa_exact.h): a NaN or +inf score or sink gives a
//   NaN row; a query whose visible scores are all -inf (an attention_bias
//   mask) gets 0 in float32 and NaN in float16/bfloat16; a hidden key's
//   weight is 0, so a NaN/Inf in its V row gives NaN in that column (keys
//   before a local window excepted: they are never read).
// * Windowed cache (sliding_window_cache=1, needs W = local_window_size > 0
//   and past_*: their capacity C >= W, which is also present's capacity).
//   The buffers hold only the newest positions: after a step with T = total_b
//   tokens, rows [0, L(T)) hold positions T - L(T) .. T - 1 in order, with
//     L(T) = T if T <= C, else T - G * ceil((T - C) / G),  G = C - W + 1
//   (eviction frees G rows at once; L(T) >= min(T, W), so the window stays
//   resident). The past holds L(past_b) rows the same way. Only the
//   total_b - past_b valid tokens enter the cache (padding of a short first
//   prompt row does not). Positions stay absolute everywhere else: rotary,
//   the causal window and attention_bias columns (width still
//   total_sequence_length). Rows [L(T), C) are left as they were (shared
//   buffer) or zero (separate buffers).
#pragma once

#include <cstdint>
#include <string>

#include "parallel.h"

namespace hinamoe {

struct GqaShape {
  int64_t batch = 0;             // B
  int64_t seq = 0;               // S: new tokens per row this step
  int64_t num_heads = 0;         // N (query heads)
  int64_t kv_num_heads = 0;      // Nkv (key/value heads); N % Nkv == 0
  int64_t head_dim = 0;          // d
  int64_t past_capacity = 0;     // dim 2 of past_key/past_value; 0 without past
  int64_t present_capacity = 0;  // dim 2 of present_key/present_value
                                 // (= max(total_sequence_length, past_capacity);
                                 // = past_capacity with a windowed cache)
  int64_t total_sequence_length = 0;  // the scalar input (phase, bias width)
};

struct GqaAttrs {
  float scale = 0.0f;              // 0: 1/sqrt(head_dim)
  float softcap = 0.0f;            // <= 0: off
  int64_t local_window_size = -1;  // < 0: no window; 0 is refused (ORT's
                                   // kernel would attend to nothing)
  bool do_rotary = false;
  bool rotary_interleaved = false;
  bool smooth_softmax = false;
  bool sliding_window_cache = false;  // window-sized KV buffer ("Windowed cache" above)
};

// Element type of query/key/value/past/present/caches/bias/sink/output (the
// op's T; ORT registers float and float16, HinaMoE adds bfloat16, which ORT's
// CPU EP has no kernel for). Arithmetic is float either way; with F16/BF16 the
// rotated K is rounded to T where it is stored, and the rotated Q before it is
// used, as ORT's float16 kernel does (BF16: round to nearest even).
enum class GqaDType : int { F32 = 0, F16 = 1, BF16 = 2 };

// All pointers are host memory. Optional inputs are null when absent.
struct GqaTensors {
  GqaDType dtype = GqaDType::F32;
  const void* query = nullptr;   // [B, S, N*d], or packed [B, S, (N+2Nkv)*d] when key is null
  const void* key = nullptr;     // [B, S, Nkv*d] or null (packed)
  const void* value = nullptr;   // [B, S, Nkv*d] or null (packed)
  const void* past_key = nullptr;    // [B, Nkv, past_capacity, d] or null
  const void* past_value = nullptr;  // same
  void* present_key = nullptr;       // [B, Nkv, present_capacity, d]; may equal past_key
  void* present_value = nullptr;     // same; may equal past_value
  const int32_t* seqlens_k = nullptr;  // [B]: total_b - 1

  const void* cos_cache = nullptr;  // [rotary_rows, rotary_half] (do_rotary)
  const void* sin_cache = nullptr;  // same shape
  int64_t rotary_rows = 0;          // max position + 1 the caches cover
  int64_t rotary_half = 0;          // R / 2

  const int64_t* position_ids = nullptr;  // [B, S] or null (see "Position" above)

  const void* attention_bias = nullptr;  // [bias_batch, bias_heads, S, bias_keys] or null
  int64_t bias_batch = 1;                // B or 1 (broadcast)
  int64_t bias_heads = 1;                // N or 1 (broadcast)
  int64_t bias_keys = 0;                 // last dim (= total_sequence_length)

  const void* head_sink = nullptr;  // [N] or null

  void* output = nullptr;  // [B, S, N*d]
};

// The kernel one tier provides. It works on one KV head of one batch row: a
// block of `rows` query rows (some of the G heads x query tokens, d floats
// each, already scaled and rotated) against keys [k0, k1) of that head's K/V
// rows (d floats each, `kv_stride` apart: the BNSH buffer as it lies). Row r
// sees only keys [lo[r], hi[r]) clipped to the chunk. It updates a streaming
// (online) softmax state per row, in and out:
//   m[r]  running max of the visible scores (-inf before any),
//   l[r]  sum of exp(score - m[r]),
//   acc[r*d + :] = sum of exp(score - m[r]) * V[j, :].
// score = q.k, softcapped when softcap > 0, plus bias[r][j] when bias is set
// (row r's bias indexed by absolute key position).
// Non-finite input: a row with a NaN or +inf visible score gets m[r] = NaN
// and keeps it in later calls (its l and acc are then don't-care); the
// driver recomputes such rows, and rows whose acc or l is not finite, on the
// exact path (gqa_exact.h). -inf scores (masks) are ordinary: weight 0,
// and 0 x a NaN/Inf V element is NaN in acc, also for a row whose scores in
// the call are all -inf (its m and l stay as they were).
struct GqaChunkArgs {
  const float* q = nullptr;  // [rows, d]
  int64_t rows = 0;
  int64_t d = 0;
  const void* k = nullptr;  // key row j at element j*kv_stride (float, f16 or bf16 bits, per the tier entry)
  const void* v = nullptr;  // value row j at element j*kv_stride
  int64_t kv_stride = 0;
  int64_t k0 = 0, k1 = 0;
  const int64_t* lo = nullptr;  // [rows]
  const int64_t* hi = nullptr;  // [rows]
  const float* const* bias = nullptr;  // [rows] row pointers, or null
  float softcap = 0.0f;
  float* m = nullptr;    // [rows]
  float* l = nullptr;    // [rows]
  float* acc = nullptr;  // [rows, d]
  float* scratch = nullptr;  // >= gqa_chunk_scratch_floats(rows, k1 - k0) floats
  // True when the previous call on this thread had the same q, rows and d
  // (the next keys of the same rows): a kernel may reuse what it derived
  // from q then (the AMX kernel: the query block in its operand layout).
  bool same_q = false;
};

using GqaChunkFn = void (*)(const GqaChunkArgs& a);

// Scratch floats one chunk call may use (the AVX2 lanes kernel: 128 for a
// key block's weights, whatever `rows * keys` is).
inline int64_t gqa_chunk_scratch_floats(int64_t rows, int64_t keys) { return rows * keys + 256; }

// A GQA tier: function pointers filled once (like KernelTier in tier.h).
struct GqaTier {
  const char* name = "";
  GqaChunkFn chunk = nullptr;      // K/V float
  GqaChunkFn chunk_f16 = nullptr;  // K/V IEEE half (uint16_t bits)
  GqaChunkFn chunk_bf16 = nullptr;  // K/V bfloat16 (uint16_t bits)
};

// Knobs of the AVX2 kernel for A/B runs of the micro-benchmark
// (hinamoe_gqa_bench --variants) only: the defaults are the tuned values and
// nothing else sets them (they are read while gqa() runs, so never change
// them during a call).
struct GqaAvx2Knobs {
  bool lanes = true;           // lanes kernel for blocks of >= 4 rows (false: the row kernel)
  int64_t prefetch_keys = 32;  // lanes kernel: software prefetch distance in keys (0: none)
  bool prefetch_l2 = true;     // both kernels: prefetch into L2 (T1); false: into L1 (T0)
  bool prefetch_start = true;  // lanes kernel: the first prefetch distance of K/V requested up front
};
GqaAvx2Knobs& gqa_avx2_knobs();

const GqaTier& gqa_ref_tier();
const GqaTier& gqa_avx2_tier();  // only where tier_unavailable_reason("avx2") is ""
const GqaTier& gqa_avx512_tier();  // the avx2 kernels, named "avx512"; where that tier runs

// Resolves "auto" or a tier name (the names of select_tier in
// cpu_features.cc) to a GQA tier. "amx" / "amx-emu" run bf16 K/V on the AMX
// tile kernel (gqa_amx.h; real tiles / the emulator) and f32/f16 K/V on the
// avx2 (else ref) kernels: the tile layer multiplies bf16 only, so for f32/f16
// K/V it would first convert every row it reads (the traffic decode is bound
// by) and round K and V to bf16, far outside ORT's float results.
// "auto" on an AMX CPU resolves to the avx2 GQA tier (measured faster, gqa.cc).
// On failure returns nullptr and sets *error.
const GqaTier* select_gqa_tier(const std::string& name, std::string* error);

// Checks shapes, attributes and seqlens_k against the buffers, with ORT's
// rules (N % Nkv == 0, head_dim % 8 == 0, with rotary head_dim % 16 == 0 and
// R/2 a multiple of 8 that is <= head_dim/2, 0 <= seqlens_k[b] <
// total_sequence_length, past rows fitting the buffers, position ids inside
// the caches, bias last dim == total_sequence_length). Returns "" when
// gqa() can run, else the reason (naming the input).
std::string gqa_validate(const GqaShape& shape, const GqaAttrs& attrs, const GqaTensors& t);

// Runs the op: appends the new K/V to present_*, writes output. Returns ""
// or an error message (gqa_validate's, checked first; nothing is written
// then).
std::string gqa(const GqaShape& shape, const GqaAttrs& attrs, const GqaTensors& t, const GqaTier& tier,
                const Parallel& par);

}  // namespace hinamoe
