// The kernels HinaMoE registers with ORT (one entry per op and type set).
#pragma once

#include "ort_api.h"

namespace hinamoe_ep {

OrtStatus* create_kernel_registry(const char* ep_name, OrtKernelRegistry** out);

}  // namespace hinamoe_ep
