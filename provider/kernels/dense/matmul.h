// ONNX MatMul with a float16 or bfloat16 B of rank 2 (the dense linears of a
// decoder layer stored at that width): Y[m, n] = sum_k A[m, k] * B[k, n],
// B read where it lies ([K, N], row-major), A's rows converted to float32
// once per call, sums in float32, Y rounded to T (RNE). Plain C++17.
#pragma once

#include <cstdint>
#include <string>

#include "../dtype.h"
#include "../parallel.h"
#include "../tier.h"

namespace hinamoe {

struct MatMulTensors {
  DType dtype = DType::BF16;  // T: A, B and Y
  const void* a = nullptr;    // [M, K]
  const void* b = nullptr;    // [K, N]
  void* y = nullptr;          // [M, N]
  int64_t M = 0, K = 0, N = 0;
};

// Runs the op. "" on success, else a message.
std::string matmul(const MatMulTensors& t, const KernelTier& tier, const Parallel& par);

}  // namespace hinamoe
