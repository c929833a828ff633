// What every HinaMoE kernel shares: the OrtKernelImpl wiring (Compute and
// Release forwarded to the derived kernel), errors that name the op, node
// and input, and ORT's intra-op pool as the kernels' thread pool.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/parallel.h"
#include "ort_api.h"

namespace hinamoe_ep {

class HinaEp;

// Kernel creation's common start: the node's name, the EP creating the
// kernel, and with strict=1 why that EP refused the node in GetCapability
// ("" when it runs it; the kernel then reports it as its error).
OrtStatus* creating_ep(const OrtKernelInfo* info, std::string* node_name, const HinaEp** ep, std::string* refusal);

// T of a float tensor (float16, bfloat16; anything else as float32).
hinamoe::DType to_dtype(ONNXTensorElementDataType t);

// The first n inputs of a node as ORT hands them over: values (null where
// absent or beyond the node's inputs), shapes and element types.
struct KernelInputs {
  std::vector<Ort::ConstValue> value;
  std::vector<std::vector<int64_t>> shape;
  std::vector<ONNXTensorElementDataType> elem;
};
KernelInputs read_inputs(Ort::KernelContext& ctx, int n);

// "[2, 3, 4]", for error messages.
std::string shape_str(const std::vector<int64_t>& s);

// The kernels' threads: the session's intra-op pool of the running node
// (`ctx` must outlive the returned Parallel), items claimed dynamically,
// not in ORT's static batches.
hinamoe::Parallel ort_parallel(const Ort::KernelContext& ctx);

// MoE / QMoE: "" unless the router input's expert dimension is static and
// smaller than k (then the reason), so k > E is reported at session creation.
std::string k_exceeds_static_experts(const Ort::ConstKernelInfo& ki, int64_t k);

// Derived supplies `OrtStatus* compute(OrtKernelContext*) const`; `op` is
// the op type used in messages.
template <class Derived>
struct KernelBase : OrtKernelImpl {
  const char* op;
  std::string node_name;

  explicit KernelBase(const char* op_type) : OrtKernelImpl{}, op(op_type) {
    ort_version_supported = kApiVersion;
    flags = 0;
    Compute = ComputeImpl;
    Release = ReleaseImpl;
  }

  // INVALID_ARGUMENT: "HinaMoE <op> node '<name>': input '<input>': <reason>".
  OrtStatus* error(const std::string& input, const std::string& reason) const {
    std::string msg = std::string("HinaMoE ") + op + " node '" + node_name + "'";
    if (!input.empty()) msg += ": input '" + input + "'";
    return make_status(ORT_INVALID_ARGUMENT, msg + ": " + reason);
  }

  static OrtStatus* ORT_API_CALL ComputeImpl(OrtKernelImpl* this_ptr, OrtKernelContext* context) noexcept {
    HINA_API_BEGIN
    return static_cast<const Derived*>(this_ptr)->compute(context);
    HINA_API_END
  }
  static void ORT_API_CALL ReleaseImpl(OrtKernelImpl* this_ptr) noexcept { delete static_cast<Derived*>(this_ptr); }
};

}  // namespace hinamoe_ep
