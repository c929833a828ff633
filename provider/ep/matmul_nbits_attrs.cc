#include "matmul_nbits_attrs.h"

namespace hinamoe_ep {

AttrVerdict read_matmul_nbits_attrs(const AttrSource& src, hinamoe::MatMulNBitsAttrs* out, std::string* why) {
  hinamoe::MatMulNBitsAttrs a;
  const std::optional<int64_t> K = src.get_int("K"), N = src.get_int("N"), block = src.get_int("block_size");
  if (!K || !N || !block) {
    *why = "attributes K, N and block_size are required";
    return AttrVerdict::Invalid;
  }
  const int64_t bits = src.get_int("bits").value_or(4);
  if (bits == 2 || bits == 3 || bits == 5 || bits == 6 || bits == 7) {
    *why = "bits=" + std::to_string(bits) + " is not implemented by HinaMoE (only 4 and 8)";
    return AttrVerdict::Unsupported;
  }
  a.K = *K;
  a.N = *N;
  a.bits = int(bits);
  a.block = *block;
  const int64_t level = src.get_int("accuracy_level").value_or(0);
  a.int8_activations = level == 4;
  a.bf16_tiles = level == 0 || level >= 3;  // 1 and 2 ask for float32 / float16 accuracy
  *why = hinamoe::validate_matmul_nbits(a);
  if (!why->empty()) return AttrVerdict::Invalid;
  *out = a;
  return AttrVerdict::Ok;
}

}  // namespace hinamoe_ep
