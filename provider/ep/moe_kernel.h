// The com.microsoft::MoE kernel: checks the tensors ORT hands over and calls
// the operator library's MoE driver on them, in place (no weight copies).
#pragma once

#include "ort_api.h"

namespace hinamoe_ep {

OrtStatus* ORT_API_CALL create_moe_kernel(void* state, const OrtKernelInfo* info, OrtKernelImpl** out) noexcept;

}  // namespace hinamoe_ep
