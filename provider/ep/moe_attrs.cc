#include "moe_attrs.h"

namespace hinamoe_ep {

AttrVerdict read_moe_attrs(const AttrSource& src, hinamoe::MoEAttrs* out, std::string* why) {
  using hinamoe::Activation;
  hinamoe::MoEAttrs a;

  if (src.get_int("use_sparse_mixer").value_or(0) != 0) {
    *why = "use_sparse_mixer=1 is not implemented by HinaMoE";
    return AttrVerdict::Unsupported;
  }
  const std::string act = src.get_string("activation_type").value_or("relu");
  if (act == "relu") a.activation = Activation::Relu;
  else if (act == "gelu") a.activation = Activation::Gelu;
  else if (act == "silu") a.activation = Activation::Silu;
  else if (act == "identity") a.activation = Activation::Identity;
  else if (act == "swiglu") a.activation = Activation::SwiGLU;
  else if (act == "geglu") a.activation = Activation::GeGLU;
  else if (act == "relu2") a.activation = Activation::Relu2;
  else {
    *why = "activation_type='" + act + "' is not one of relu, gelu, silu, identity, swiglu, geglu, relu2";
    return AttrVerdict::Unsupported;
  }
  const int64_t fusion = src.get_int("swiglu_fusion").value_or(0);
  if (fusion < 0 || fusion > 2) {
    *why = "swiglu_fusion=" + std::to_string(fusion) + " is not 0, 1 or 2";
    return AttrVerdict::Unsupported;
  }
  a.gate_layout = static_cast<hinamoe::GateLayout>(fusion);
  a.limit_after_activation = src.get_int("swiglu_limit_after_activation").value_or(0) != 0;
  if (a.limit_after_activation && a.activation != Activation::SwiGLU) {
    *why = "swiglu_limit_after_activation=1 needs activation_type='swiglu'";
    return AttrVerdict::Invalid;
  }
  a.normalize_routing_weights = src.get_int("normalize_routing_weights").value_or(0) != 0;
  a.alpha = src.get_float("activation_alpha").value_or(1.0f);
  a.beta = src.get_float("activation_beta").value_or(0.0f);
  a.limit = src.get_float("swiglu_limit").value_or(hinamoe::INFINITY_F);
  if (a.limit != a.limit || a.limit < 0) {
    *why = "swiglu_limit must be a non-negative number";
    return AttrVerdict::Invalid;
  }
  a.k = src.get_int("k").value_or(1);
  if (a.k < 1) {
    *why = "attribute k=" + std::to_string(a.k) + " must be at least 1";
    return AttrVerdict::Invalid;
  }
  *out = a;
  return AttrVerdict::Ok;
}

}  // namespace hinamoe_ep
