// The HinaMoE execution provider for one session: options, GetCapability
// (which nodes we claim) and the kernel registry that runs them.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kernels/numa/topology.h"
#include "kernels/tier.h"
#include "ort_api.h"

namespace hinamoe_ep {

class HinaEpFactory;

class HinaEp : public OrtEp {
 public:
  struct Options {
    const hinamoe::KernelTier* tier = nullptr;  // resolved from "isa"
    std::string isa = "auto";                   // as the user wrote it
    // From "numa": null when off; the kernels split work by node when it has
    // more than one. Shared by the kernels of the session.
    std::shared_ptr<const hinamoe::numa::Topology> topology;
    // From "strict": a MoE / GroupQueryAttention node HinaMoE would leave to
    // another EP fails session creation instead (no silent fallback).
    bool strict = false;
    // From "qmoe_int8_activations": -1 = follow each QMoE node's
    // accuracy_level (4: int8 tokens), 0 = float everywhere, 1 = int8 tokens
    // on every block-wise QMoE node.
    int qmoe_int8_activations = -1;
    // From "bf16_tiles": QMoE and MatMulNBits may run groups of many tokens
    // on the tier's bf16 tile kernel where accuracy_level allows bf16
    // (0, 3, 4); false keeps them on the vector kernels.
    bool bf16_tiles = true;
  };

  // Reads provider options (session config "ep.hinamoe.<key>": isa, numa,
  // strict, qmoe_int8_activations) and the HINAMOE_ISA /
  // HINAMOE_NUMA_TOPOLOGY / HINAMOE_STRICT / HINAMOE_QMOE_INT8_ACTIVATIONS
  // environment variables; the
  // provider option wins. An unknown value is an error, so a typo fails
  // session creation loudly.
  static OrtStatus* read_options(const OrtApi& api, const OrtSessionOptions* so, Options* out);

  HinaEp(HinaEpFactory& factory, const Options& options, const OrtLogger& logger);

  const Options& options() const { return options_; }
  void log(OrtLoggingLevel level, const std::string& msg) const;

  // strict=1: why HinaMoE cannot run node `name`, "" when it can. GetCapability
  // claims such nodes anyway (ORT only logs a GetCapability error and moves
  // the graph to the CPU EP), so their kernel creation fails with this reason.
  std::string strict_refusal(const std::string& name) const;

 private:
  static const char* ORT_API_CALL GetNameImpl(const OrtEp*) noexcept;
  static OrtStatus* ORT_API_CALL GetCapabilityImpl(OrtEp*, const OrtGraph* graph,
                                                   OrtEpGraphSupportInfo* support) noexcept;
  static OrtStatus* ORT_API_CALL GetKernelRegistryImpl(OrtEp*, const OrtKernelRegistry** registry) noexcept;

  HinaEpFactory& factory_;
  Options options_;
  const OrtLogger& logger_;
  mutable std::mutex refused_mu_;
  std::map<std::string, std::string> refused_;  // node name -> reason (strict=1)
};

}  // namespace hinamoe_ep
