#include "gqa_attrs.h"

#include <cmath>

namespace hinamoe_ep {

namespace {

// Attributes of the 1.30-1.32 schema. The q/k norm epsilons only matter with
// q_norm_weight/k_norm_weight, inputs HinaMoE does not claim.
const char* const kKnownAttrs[] = {
    "num_heads",        "kv_num_heads",  "scale",        "softcap",        "local_window_size",
    "do_rotary",        "rotary_interleaved", "smooth_softmax", "causal",   "sliding_window_cache",
    "qk_output",        "k_quant_type",  "v_quant_type", "kv_cache_bit_width", "qk_norm_epsilon",
    "q_norm_epsilon",   "k_norm_epsilon"};

}  // namespace

bool is_known_gqa_attr(const std::string& name) {
  for (const char* k : kKnownAttrs) {
    if (name == k) return true;
  }
  return false;
}

AttrVerdict read_gqa_attrs(const AttrSource& src, GqaNodeAttrs* out, std::string* why) {
  GqaNodeAttrs a;
  // Unsupported features first: such a node goes to another EP whatever else it holds.
  if (src.get_int("causal").value_or(1) != 1) {
    *why = "causal=0 (bidirectional attention) is not implemented by HinaMoE";
    return AttrVerdict::Unsupported;
  }
  const int64_t window_cache = src.get_int("sliding_window_cache").value_or(0);
  if (window_cache != 0 && window_cache != 1) {
    *why = "sliding_window_cache=" + std::to_string(window_cache) + " is neither 0 nor 1";
    return AttrVerdict::Unsupported;
  }
  if (src.get_int("qk_output").value_or(0) != 0) {
    *why = "qk_output != 0 (the QK matrix as an output) is not implemented by HinaMoE";
    return AttrVerdict::Unsupported;
  }
  for (const char* q : {"k_quant_type", "v_quant_type"}) {
    const std::string v = src.get_string(q).value_or("NONE");
    if (v != "NONE") {
      *why = std::string(q) + "='" + v + "': a quantised KV cache is not implemented by HinaMoE";
      return AttrVerdict::Unsupported;
    }
  }
  if (src.get_int("kv_cache_bit_width").value_or(0) != 0) {
    *why = "kv_cache_bit_width is set: a quantised KV cache is not implemented by HinaMoE";
    return AttrVerdict::Unsupported;
  }
  a.op.local_window_size = src.get_int("local_window_size").value_or(-1);
  if (a.op.local_window_size == 0 || a.op.local_window_size < -1) {
    *why = "local_window_size=" + std::to_string(a.op.local_window_size) + " is neither -1 nor positive";
    return AttrVerdict::Unsupported;
  }

  a.op.sliding_window_cache = window_cache == 1;
  if (a.op.sliding_window_cache && a.op.local_window_size <= 0) {
    *why = "sliding_window_cache=1 needs local_window_size > 0, got " + std::to_string(a.op.local_window_size);
    return AttrVerdict::Invalid;
  }

  const std::optional<int64_t> n = src.get_int("num_heads"), nkv = src.get_int("kv_num_heads");
  if (!n || !nkv) {
    *why = std::string("attribute '") + (!n ? "num_heads" : "kv_num_heads") + "' is required";
    return AttrVerdict::Invalid;
  }
  a.num_heads = *n;
  a.kv_num_heads = *nkv;
  if (a.num_heads <= 0 || a.kv_num_heads <= 0) {
    *why = "num_heads=" + std::to_string(a.num_heads) + " and kv_num_heads=" + std::to_string(a.kv_num_heads) +
           " must be positive";
    return AttrVerdict::Invalid;
  }
  if (a.num_heads % a.kv_num_heads != 0) {
    *why = "num_heads=" + std::to_string(a.num_heads) + " is not a multiple of kv_num_heads=" +
           std::to_string(a.kv_num_heads);
    return AttrVerdict::Invalid;
  }
  a.op.scale = src.get_float("scale").value_or(0.0f);
  a.op.softcap = src.get_float("softcap").value_or(0.0f);
  if (!std::isfinite(a.op.scale) || !std::isfinite(a.op.softcap)) {
    *why = "scale and softcap must be finite numbers";
    return AttrVerdict::Invalid;
  }
  // ORT turns these on only for the value 1 (smooth_softmax defaults to -1).
  a.op.do_rotary = src.get_int("do_rotary").value_or(0) == 1;
  a.op.rotary_interleaved = src.get_int("rotary_interleaved").value_or(0) == 1;
  a.op.smooth_softmax = src.get_int("smooth_softmax").value_or(0) == 1;
  *out = a;
  return AttrVerdict::Ok;
}

}  // namespace hinamoe_ep
