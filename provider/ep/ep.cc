#include "ep.h"

#include <cstdlib>
#include <vector>

#include "ep_factory.h"
#include "gqa_support.h"
#include "matmul_nbits_support.h"
#include "matmul_support.h"
#include "moe_support.h"
#include "qmoe_support.h"

namespace hinamoe_ep {

namespace {

// Reads session config entry `key`; returns false when absent.
bool config_entry(const OrtApi& api, const OrtSessionOptions* so, const char* key, std::string* out) {
  int has = 0;
  Ort::ThrowOnError(api.HasSessionConfigEntry(so, key, &has));
  if (!has) return false;
  size_t size = 0;
  Ort::ThrowOnError(api.GetSessionConfigEntry(so, key, nullptr, &size));
  std::vector<char> buf(size + 1, '\0');
  Ort::ThrowOnError(api.GetSessionConfigEntry(so, key, buf.data(), &size));
  *out = buf.data();
  return true;
}

}  // namespace

OrtStatus* HinaEp::read_options(const OrtApi& api, const OrtSessionOptions* so, Options* out) {
  HINA_API_BEGIN
  // Provider options arrive as "ep.<lower-cased ep name>.<key>"; each falls
  // back to its environment variable, then to the default.
  auto option = [&](const char* key, const char* env_var, const char* fallback, std::string* source) {
    std::string value;
    if (so != nullptr && config_entry(api, so, (std::string("ep.hinamoe.") + key).c_str(), &value)) {
      *source = std::string("provider option '") + key + "'";
      return value;
    }
    const char* env = std::getenv(env_var);
    if (env != nullptr && *env != '\0') {
      *source = std::string("environment variable ") + env_var;
      return std::string(env);
    }
    *source = std::string("default of '") + key + "'";
    return std::string(fallback);
  };

  std::string source;
  const std::string isa = option("isa", "HINAMOE_ISA", "auto", &source);
  std::string error;
  out->tier = hinamoe::select_tier(isa, &error);
  if (out->tier == nullptr) {
    return make_status(ORT_INVALID_ARGUMENT, "HinaMoE: " + source + " = '" + isa + "': " + error);
  }
  out->isa = isa;

  const std::string numa = option("numa", "HINAMOE_NUMA_TOPOLOGY", "auto", &source);
  if (numa != "off") {
    std::unique_ptr<hinamoe::numa::Topology> topo = hinamoe::numa::select_topology(numa, &error);
    if (topo == nullptr) {
      return make_status(ORT_INVALID_ARGUMENT, "HinaMoE: " + source + " = '" + numa + "': " + error +
                                                   " (or 'off')");
    }
    out->topology = std::move(topo);
  }

  const std::string strict = option("strict", "HINAMOE_STRICT", "0", &source);
  if (strict != "0" && strict != "1") {
    return make_status(ORT_INVALID_ARGUMENT, "HinaMoE: " + source + " = '" + strict + "': expected 0 or 1");
  }
  out->strict = strict == "1";
  const std::string i8 = option("qmoe_int8_activations", "HINAMOE_QMOE_INT8_ACTIVATIONS", "auto", &source);
  if (i8 == "auto") {
    out->qmoe_int8_activations = -1;
  } else if (i8 == "1" || i8 == "on") {
    out->qmoe_int8_activations = 1;
  } else if (i8 == "0" || i8 == "off") {
    out->qmoe_int8_activations = 0;
  } else {
    return make_status(ORT_INVALID_ARGUMENT, "HinaMoE: " + source + " = '" + i8 +
                                                 "': expected auto (follow accuracy_level), 1/on or 0/off");
  }
  const std::string tiles = option("bf16_tiles", "HINAMOE_BF16_TILES", "auto", &source);
  if (tiles != "auto" && tiles != "off") {
    return make_status(ORT_INVALID_ARGUMENT, "HinaMoE: " + source + " = '" + tiles +
                                                 "': expected auto (bf16 tiles where accuracy_level allows) or off");
  }
  out->bf16_tiles = tiles == "auto";
  return nullptr;
  HINA_API_END
}

HinaEp::HinaEp(HinaEpFactory& factory, const Options& options, const OrtLogger& logger)
    : OrtEp{}, factory_(factory), options_(options), logger_(logger) {
  ort_version_supported = kApiVersion;
  GetName = GetNameImpl;
  GetCapability = GetCapabilityImpl;
  GetKernelRegistry = GetKernelRegistryImpl;
  // Kernel-registry EP: nothing to compile; the other callbacks are optional.
  log(ORT_LOGGING_LEVEL_INFO, std::string("HinaMoE EP created, kernel tier '") + options_.tier->name + "', " +
                                  std::to_string(options_.topology ? options_.topology->num_nodes() : 1) +
                                  " NUMA node(s)");
}

void HinaEp::log(OrtLoggingLevel level, const std::string& msg) const {
  OrtStatus* st = factory_.api().Logger_LogMessage(&logger_, level, msg.c_str(), __FILE__, __LINE__, "HinaMoE");
  if (st != nullptr) factory_.api().ReleaseStatus(st);
}

std::string HinaEp::strict_refusal(const std::string& name) const {
  std::lock_guard<std::mutex> lock(refused_mu_);
  auto it = refused_.find(name);
  return it == refused_.end() ? std::string() : it->second;
}

const char* ORT_API_CALL HinaEp::GetNameImpl(const OrtEp*) noexcept { return kEpName; }

OrtStatus* ORT_API_CALL HinaEp::GetCapabilityImpl(OrtEp* this_ptr, const OrtGraph* graph,
                                                  OrtEpGraphSupportInfo* support) noexcept {
  auto* ep = static_cast<HinaEp*>(this_ptr);
  HINA_API_BEGIN
  Ort::ConstGraph g{graph};
  for (const Ort::ConstNode& node : g.GetNodes()) {
    std::string why_not;
    if (node.GetDomain().empty() && node.GetOperatorType() == "MatMul") {
      if (!matmul_is_dense_16_bit(node)) continue;  // float32, integer, batched: not HinaMoE's op
      why_not = matmul_unsupported_reason(node);
    } else if (node.GetDomain() != "com.microsoft") {
      continue;
    } else if (node.GetOperatorType() == "MoE") {
      why_not = moe_unsupported_reason(node);
    } else if (node.GetOperatorType() == "QMoE") {
      why_not = qmoe_unsupported_reason(node);
    } else if (node.GetOperatorType() == "GroupQueryAttention") {
      why_not = gqa_unsupported_reason(node);
    } else if (node.GetOperatorType() == "MatMulNBits") {
      why_not = matmul_nbits_unsupported_reason(node);
    } else {
      continue;
    }
    const OrtKernelDef* def = nullptr;
    HINA_RETURN_IF_ERROR(ep->factory_.ep_api().EpGraphSupportInfo_LookUpKernel(support, node, &def));
    if (why_not.empty() && def == nullptr) why_not = "no HinaMoE kernel is registered for its input types";
    if (!why_not.empty()) {
      const std::string msg = "HinaMoE leaves node '" + node.GetName() + "' (" + node.GetOperatorType() +
                              ") to another EP: " + why_not;
      if (!ep->options_.strict) {
        ep->log(ORT_LOGGING_LEVEL_WARNING, msg);
        continue;
      }
      const std::string refusal = "strict=1 refuses to leave it to another EP: " + why_not;
      if (def == nullptr) return make_status(ORT_FAIL, msg + " (strict=1, but ORT only logs this)");
      std::lock_guard<std::mutex> lock(ep->refused_mu_);
      ep->refused_[node.GetName()] = refusal;
    }
    HINA_RETURN_IF_ERROR(ep->factory_.ep_api().EpGraphSupportInfo_AddSingleNode(support, node));
  }
  return nullptr;
  HINA_API_END
}

OrtStatus* ORT_API_CALL HinaEp::GetKernelRegistryImpl(OrtEp* this_ptr, const OrtKernelRegistry** registry) noexcept {
  *registry = nullptr;
  return static_cast<HinaEp*>(this_ptr)->factory_.kernel_registry(registry);
}

}  // namespace hinamoe_ep
