// A kernel tier: the ISA-specific micro-kernels, as a table of function
// pointers filled once (tinyBLAS style). The MoE driver is tier-agnostic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dtype.h"

namespace hinamoe {

// Small GEMM against weight rows in place:
//   Y[m*ldy + (n - n0)] = sum_{k<K} W[n*K + k] * X[m*ldx + k]
// for n in [n0, n1), m in [0, M). W has the tier's element type (row-major
// [N, K], never repacked); X and Y are float. All M tokens share one pass
// over the W rows.
using GemmRowsFn = void (*)(const void* W, int64_t K, int64_t n0, int64_t n1,
                            const float* X, int64_t ldx, int64_t M, float* Y, int64_t ldy);

struct KernelTier {
  const char* name = "";
  GemmRowsFn gemm_rows[kNumDTypes] = {};  // indexed by DType
};

// Tiers compiled into this build.
const KernelTier& ref_tier();
const KernelTier& avx2_tier();  // callable only when cpu_supports("avx2")

// Tier names, best first, that this CPU can run ("avx2", "ref").
std::vector<std::string> supported_tiers();
// Why a tier cannot run here ("" if it can). Unknown names say so.
std::string tier_unavailable_reason(const std::string& name);
// Resolves "auto" or a tier name to a tier. On failure returns nullptr and
// sets *error (unknown name, or the CPU lacks the instructions).
const KernelTier* select_tier(const std::string& name, std::string* error);
// Names accepted by select_tier, for messages and --help.
const char* tier_names();

}  // namespace hinamoe
