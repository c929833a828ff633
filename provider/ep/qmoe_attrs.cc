#include "qmoe_attrs.h"

#include "moe_attrs.h"

namespace hinamoe_ep {

AttrVerdict read_qmoe_attrs(const AttrSource& src, hinamoe::QMoEAttrs* out, std::string* why) {
  hinamoe::QMoEAttrs a;
  const std::string quant = src.get_string("quant_type").value_or("int");
  if (quant != "int") {
    *why = "quant_type='" + quant + "' is not implemented by HinaMoE (only integer 4/8-bit)";
    return AttrVerdict::Unsupported;
  }
  const std::optional<int64_t> bits = src.get_int("expert_weight_bits");
  if (!bits) {
    *why = "attribute expert_weight_bits is required";
    return AttrVerdict::Invalid;
  }
  if (*bits == 2) {
    *why = "expert_weight_bits=2 is not implemented by HinaMoE";
    return AttrVerdict::Unsupported;
  }
  if (*bits != 4 && *bits != 8) {
    *why = "expert_weight_bits=" + std::to_string(*bits) + " is not 2, 4 or 8";
    return AttrVerdict::Invalid;
  }
  a.bits = int(*bits);
  a.block_size = src.get_int("block_size").value_or(0);
  if (a.block_size != 0 && (a.block_size < 16 || (a.block_size & (a.block_size - 1)) != 0)) {
    *why = "block_size=" + std::to_string(a.block_size) + " is not 0 or a power of two >= 16";
    return AttrVerdict::Invalid;
  }
  const int64_t level = src.get_int("accuracy_level").value_or(0);
  a.int8_activations = level == 4;
  a.bf16_tiles = level == 0 || level >= 3;  // 1 and 2 ask for float32 / float16 accuracy
  const AttrVerdict v = read_moe_attrs(src, &a.moe, why);
  if (v != AttrVerdict::Ok) return v;
  *out = a;
  return AttrVerdict::Ok;
}

}  // namespace hinamoe_ep
