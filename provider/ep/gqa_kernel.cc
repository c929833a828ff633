#include "gqa_kernel.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "ep.h"
#include "kernel_base.h"
#include "gqa_attrs.h"
#include "kernels/gqa/gqa.h"

namespace hinamoe_ep {

namespace {

enum Input { kQuery, kKey, kValue, kPastKey, kPastValue, kSeqlensK, kTotalSeq, kCos, kSin, kPositionIds, kBias, kHeadSink, kNumInputs };

const char* const kInputNames[kNumInputs] = {"query",     "key",        "value",       "past_key",
                                             "past_value", "seqlens_k", "total_sequence_length",
                                             "cos_cache", "sin_cache",  "position_ids", "attention_bias",
                                             "head_sink"};

struct GqaKernel : KernelBase<GqaKernel> {
  GqaNodeAttrs attrs;
  const hinamoe::GqaTier* tier = nullptr;

  GqaKernel() : KernelBase("GroupQueryAttention") {}

  OrtStatus* compute(OrtKernelContext* context) const;
};

OrtStatus* GqaKernel::compute(OrtKernelContext* context) const {
  Ort::KernelContext ctx(context);
  const size_t n_in = ctx.GetInputCount();
  std::vector<Ort::ConstValue> in(kNumInputs, Ort::ConstValue{nullptr});
  std::vector<std::vector<int64_t>> shape(kNumInputs);
  for (size_t i = 0; i < n_in; ++i) {
    Ort::ConstValue v = ctx.GetInput(i);
    if (i >= kNumInputs) {
      // GetCapability does not claim nodes with these inputs; never ignore one silently.
      if (v != nullptr) return error("", "input " + std::to_string(i) + " is not supported by HinaMoE");
      continue;
    }
    in[i] = v;
    if (v != nullptr) shape[i] = v.GetTensorTypeAndShapeInfo().GetShape();
  }
  for (int i : {kQuery, kSeqlensK, kTotalSeq}) {
    if (in[i] == nullptr) return error(kInputNames[i], "is required");
  }
  auto bad_shape = [&](int i, const std::string& expected) {
    return error(kInputNames[i], "has shape " + shape_str(shape[i]) + "; expected " + expected);
  };

  const int64_t n = attrs.num_heads, nkv = attrs.kv_num_heads;
  const std::string heads = "num_heads=" + std::to_string(n) + ", kv_num_heads=" + std::to_string(nkv);
  const auto& qs = shape[kQuery];
  if (qs.size() != 3) return bad_shape(kQuery, "rank 3 [batch, seq, hidden]");
  const int64_t b = qs[0], s = qs[1], width = qs[2];
  const bool packed = in[kKey] == nullptr;
  int64_t d = 0;
  if (packed) {
    if (in[kValue] != nullptr) return error(kInputNames[kValue], "is given without 'key'; give both, or neither (packed QKV in 'query')");
    if (width % (n + 2 * nkv) != 0) {
      return bad_shape(kQuery, "(packed QKV, no 'key') a last dimension that is a multiple of num_heads + 2*kv_num_heads = " +
                                   std::to_string(n + 2 * nkv) + " (" + heads + ")");
    }
    d = width / (n + 2 * nkv);
  } else {
    if (in[kValue] == nullptr) return error(kInputNames[kValue], "is required when 'key' is given");
    if (width % n != 0) return bad_shape(kQuery, "a last dimension that is a multiple of num_heads=" + std::to_string(n));
    d = width / n;
    const std::vector<int64_t> kv = {b, s, nkv * d};
    const std::string want = shape_str(kv) + " (batch, seq of 'query', kv_num_heads * head_size=" +
                             std::to_string(nkv) + "*" + std::to_string(d) + ")";
    if (shape[kKey] != kv) return bad_shape(kKey, want);
    if (shape[kValue] != kv) return bad_shape(kValue, want);
  }
  if (d <= 0 && b * s > 0) return bad_shape(kQuery, "a head size of at least 1");

  int64_t past_cap = 0;
  if ((in[kPastKey] == nullptr) != (in[kPastValue] == nullptr)) {
    return error(kInputNames[in[kPastKey] == nullptr ? kPastKey : kPastValue], "is missing while '" +
                 std::string(kInputNames[in[kPastKey] == nullptr ? kPastValue : kPastKey]) + "' is given");
  }
  if (in[kPastKey] != nullptr) {
    const auto& ps = shape[kPastKey];
    if (ps.size() != 4 || ps[0] != b || ps[1] != nkv || ps[3] != d) {
      return bad_shape(kPastKey, "[" + std::to_string(b) + ", " + std::to_string(nkv) + ", capacity, " +
                                     std::to_string(d) + "] (BNSH: batch, kv_num_heads, capacity, head_size)");
    }
    if (shape[kPastValue] != ps) return bad_shape(kPastValue, shape_str(ps) + " (the shape of 'past_key')");
    past_cap = ps[2];
  }
  if (attrs.op.sliding_window_cache && in[kPastKey] == nullptr) {
    return error(kInputNames[kPastKey], "is required with sliding_window_cache=1 (its dim 2 is the window capacity)");
  }

  if (shape[kSeqlensK] != std::vector<int64_t>{b}) return bad_shape(kSeqlensK, "[" + std::to_string(b) + "] (one entry per batch row)");
  if (in[kTotalSeq].GetTensorTypeAndShapeInfo().GetElementCount() != 1) {
    return bad_shape(kTotalSeq, "a scalar (one int32)");
  }
  const int64_t total = in[kTotalSeq].GetTensorData<int32_t>()[0];
  if (total < 1) return error(kInputNames[kTotalSeq], "is " + std::to_string(total) + "; it must be at least 1");

  hinamoe::GqaShape gs;
  gs.batch = b;
  gs.seq = s;
  gs.num_heads = n;
  gs.kv_num_heads = nkv;
  gs.head_dim = d;
  gs.past_capacity = past_cap;
  // A windowed cache keeps its capacity; a full one grows to the total length.
  gs.present_capacity = attrs.op.sliding_window_cache ? past_cap : std::max(total, past_cap);
  gs.total_sequence_length = total;

  hinamoe::GqaTensors t;
  const auto elem = in[kQuery].GetTensorTypeAndShapeInfo().GetElementType();
  t.dtype = elem == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16    ? hinamoe::GqaDType::F16
            : elem == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16 ? hinamoe::GqaDType::BF16
                                                              : hinamoe::GqaDType::F32;
  auto data = [&](int i) { return in[i] == nullptr ? nullptr : in[i].GetTensorRawData(); };
  t.query = data(kQuery);
  t.key = data(kKey);
  t.value = data(kValue);
  t.past_key = data(kPastKey);
  t.past_value = data(kPastValue);
  t.seqlens_k = in[kSeqlensK].GetTensorData<int32_t>();

  if (attrs.op.do_rotary) {
    for (int i : {kCos, kSin}) {
      if (in[i] == nullptr) return error(kInputNames[i], "is required with do_rotary=1");
    }
    const auto& cs = shape[kCos];
    if (cs.size() != 2 || cs[1] < 1 || 2 * cs[1] > d) {
      return bad_shape(kCos, "[positions, rotary_dim / 2] with 2 <= rotary_dim <= head_size=" + std::to_string(d));
    }
    if (shape[kSin] != cs) return bad_shape(kSin, shape_str(cs) + " (the shape of 'cos_cache')");
    t.cos_cache = data(kCos);
    t.sin_cache = data(kSin);
    t.rotary_rows = cs[0];
    t.rotary_half = cs[1];
  }
  // position_ids only steer rotary (ORT ignores them otherwise). On a first
  // prompt gqa() reads only position_ids[0, 0], as ORT does.
  if (in[kPositionIds] != nullptr && attrs.op.do_rotary) {
    if (shape[kPositionIds] != std::vector<int64_t>{b, s}) {
      return bad_shape(kPositionIds, "[" + std::to_string(b) + ", " + std::to_string(s) + "] (batch, seq of 'query')");
    }
    t.position_ids = in[kPositionIds].GetTensorData<int64_t>();
  }
  if (in[kBias] != nullptr) {
    const auto& bs = shape[kBias];
    if (bs.size() != 4 || (bs[0] != b && bs[0] != 1) || (bs[1] != n && bs[1] != 1) || bs[2] != s || bs[3] != total) {
      auto or_one = [](int64_t x) { return x == 1 ? std::string("1") : std::to_string(x) + " or 1"; };
      return bad_shape(kBias, "[" + or_one(b) + ", " + or_one(n) + ", " + std::to_string(s) + ", " + std::to_string(total) +
                                  "] (batch, num_heads, seq, total_sequence_length)");
    }
    t.attention_bias = data(kBias);
    t.bias_batch = bs[0];
    t.bias_heads = bs[1];
    t.bias_keys = bs[3];
  }
  if (in[kHeadSink] != nullptr) {
    if (shape[kHeadSink] != std::vector<int64_t>{n}) return bad_shape(kHeadSink, "[" + std::to_string(n) + "] (num_heads)");
    t.head_sink = data(kHeadSink);
  }

  // Outputs. present_* may be the past buffers themselves (ORT hands a bound
  // output over when its shape matches); without present outputs the new
  // rows go to a scratch cache.
  Ort::UnownedValue out = ctx.GetOutput(0, {b, s, n * d});
  t.output = b * s > 0 ? out.GetTensorMutableRawData() : nullptr;
  const std::vector<int64_t> present_shape = {b, nkv, gs.present_capacity, d};
  const size_t n_out = ctx.GetOutputCount();
  Ort::UnownedValue pk{nullptr}, pv{nullptr};
  try {
    if (n_out > 1) pk = ctx.GetOutput(1, present_shape);
    if (n_out > 2) pv = ctx.GetOutput(2, present_shape);
  } catch (const Ort::Exception& ex) {
    // A bound present buffer of another shape: with a shared past/present
    // buffer, seqlens_k / total_sequence_length reach past its rows.
    int32_t max_seqlen = 0;
    for (int64_t i = 0; i < b; ++i) max_seqlen = std::max(max_seqlen, t.seqlens_k[i]);
    return error(kInputNames[kSeqlensK],
                 "max " + std::to_string(max_seqlen) + " with total_sequence_length " + std::to_string(total) +
                     " needs present_key/present_value of shape " + shape_str(present_shape) +
                     " (max(total_sequence_length, past_key dim 2) rows), but the buffer bound to them has another "
                     "shape: a shared past/present buffer holds " + std::to_string(past_cap) +
                     " rows, so seqlens_k must stay below that (ORT: " + ex.what() + ")");
  }
  const size_t cache_bytes = static_cast<size_t>(b * nkv * gs.present_capacity * d) * (t.dtype == hinamoe::GqaDType::F32 ? 4 : 2);
  std::vector<float> scratch_k, scratch_v;  // float-aligned, sized in bytes of T
  if (pk != nullptr) {
    t.present_key = cache_bytes > 0 ? pk.GetTensorMutableRawData() : nullptr;
  } else {
    scratch_k.resize((cache_bytes + 3) / 4);
    t.present_key = scratch_k.data();
  }
  if (pv != nullptr) {
    t.present_value = cache_bytes > 0 ? pv.GetTensorMutableRawData() : nullptr;
  } else {
    scratch_v.resize((cache_bytes + 3) / 4);
    t.present_value = scratch_v.data();
  }
  if (b == 0) return nullptr;

  const hinamoe::Parallel par = ort_parallel(ctx);
  std::string why = hinamoe::gqa(gs, attrs.op, t, *tier, par);
  if (!why.empty()) {
    const std::string op_prefix = "GroupQueryAttention: ";  // error() names the op already
    if (why.compare(0, op_prefix.size(), op_prefix) == 0) why.erase(0, op_prefix.size());
    return error("", why);
  }
  return nullptr;
}

}  // namespace

OrtStatus* ORT_API_CALL create_gqa_kernel(void*, const OrtKernelInfo* info, OrtKernelImpl** out) noexcept {
  *out = nullptr;
  HINA_API_BEGIN
  auto kernel = std::make_unique<GqaKernel>();
  const HinaEp* ep = nullptr;
  std::string why;
  HINA_RETURN_IF_ERROR(creating_ep(info, &kernel->node_name, &ep, &why));
  if (!why.empty()) return kernel->error("", why);
  if (read_gqa_attrs(kernel_info_attrs(info), &kernel->attrs, &why) != AttrVerdict::Ok) return kernel->error("", why);

  // The session's "isa" option names the GQA tier too.
  const std::string& isa = ep->options().isa;
  kernel->tier = hinamoe::select_gqa_tier(isa, &why);
  if (kernel->tier == nullptr) return kernel->error("", "isa '" + isa + "': " + why);
  *out = kernel.release();
  return nullptr;
  HINA_API_END
}

}  // namespace hinamoe_ep
