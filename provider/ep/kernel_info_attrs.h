// Attribute lookups on an OrtKernelInfo as an AttrSource (absent -> nullopt),
// for the kernels' create functions.
#pragma once

#include "moe_attrs.h"  // AttrSource
#include "ort_api.h"

namespace hinamoe_ep {

AttrSource kernel_info_attrs(const OrtKernelInfo* info);

}  // namespace hinamoe_ep
