// The com.microsoft::GroupQueryAttention kernel: checks the tensors ORT hands
// over and calls the operator library's gqa() on them. The KV cache is used
// where it lies: when ORT hands over the past buffer as present (IOBinding,
// onnxruntime-genai's shared buffer), the new rows are appended in place.
#pragma once

#include "ort_api.h"

namespace hinamoe_ep {

OrtStatus* ORT_API_CALL create_gqa_kernel(void* state, const OrtKernelInfo* info, OrtKernelImpl** out) noexcept;

}  // namespace hinamoe_ep
