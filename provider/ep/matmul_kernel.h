// The ONNX MatMul kernel at float16 / bfloat16 with B of rank 2: checks the
// tensors ORT hands over and runs the operator library's dense MatMul on B
// where ORT mapped it (no prepack, no copies).
#pragma once

#include "ort_api.h"

namespace hinamoe_ep {

OrtStatus* ORT_API_CALL create_matmul_kernel(void* state, const OrtKernelInfo* info, OrtKernelImpl** out) noexcept;

}  // namespace hinamoe_ep
