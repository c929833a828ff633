// The com.microsoft::QMoE kernel: checks the tensors ORT hands over and runs
// the operator library's QMoE driver on the packed weights where ORT mapped
// them (no prepack, no copies).
#pragma once

#include "ort_api.h"

namespace hinamoe_ep {

OrtStatus* ORT_API_CALL create_qmoe_kernel(void* state, const OrtKernelInfo* info, OrtKernelImpl** out) noexcept;

}  // namespace hinamoe_ep
