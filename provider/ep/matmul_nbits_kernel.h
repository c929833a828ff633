// The com.microsoft::MatMulNBits kernel: checks the tensors ORT hands over
// and runs the operator library's MatMulNBits on the packed weight where ORT
// mapped it (no prepack, no copies).
#pragma once

#include "ort_api.h"

namespace hinamoe_ep {

OrtStatus* ORT_API_CALL create_matmul_nbits_kernel(void* state, const OrtKernelInfo* info,
                                                   OrtKernelImpl** out) noexcept;

}  // namespace hinamoe_ep
