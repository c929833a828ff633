// com.microsoft::MatMulNBits: Y[m, n] = sum_k A[m, k] * w[n, k] (+ bias[n]),
// w block-wise quantised to 4 or 8 bits and read where it lies, on the same
// kernels as QMoE (one QMoE expert weight is one MatMulNBits B). Plain C++17.
//
// Layout (ORT's contrib op): B uint8 [N, nb, block*bits/8] with nb =
// ceil(K/block) (a partial last block is padded in B), element k of row n in
// byte k/(8/bits) of the row at bit (k % (8/bits))*bits; scales T [N*nb];
// zero points uint8 [N, ceil(nb*bits/8)] (block b of row n at bit
// (b % (8/bits))*bits of byte b/(8/bits)), default 2^(bits-1);
// w = (q - zp) * scale. accuracy_level 4: A quantised to int8 per block of
// `block` elements (as for QMoE) where the weight has more than one block.
#pragma once

#include <cstdint>
#include <string>

#include "../dtype.h"
#include "../parallel.h"
#include "../tier.h"

namespace hinamoe {

struct MatMulNBitsAttrs {
  int64_t K = 0, N = 0;
  int bits = 4;            // 4 or 8
  int64_t block = 0;       // block_size: a power of two >= 16
  bool int8_activations = false;  // accuracy_level 4
  bool bf16_tiles = true;  // bf16 arithmetic allowed (accuracy_level 0, 3, 4): the tier's tile kernel
};

struct MatMulNBitsTensors {
  DType dtype = DType::F32;           // T: A, scales, bias, Y
  const void* a = nullptr;            // [M, K]
  int64_t M = 0;                      // rows of A (all leading dimensions)
  const uint8_t* b = nullptr;         // [N, nb, block*bits/8]
  const void* scales = nullptr;       // [N * nb]
  const uint8_t* zero_points = nullptr;  // [N * ceil(nb*bits/8)] or null
  const void* bias = nullptr;         // [N] or null
  void* y = nullptr;                  // [M, N]
};

// "" when the attributes are valid, else the reason.
std::string validate_matmul_nbits(const MatMulNBitsAttrs& a);

// Runs the op. "" on success, else a message.
std::string matmul_nbits(const MatMulNBitsAttrs& a, const MatMulNBitsTensors& t, const KernelTier& tier,
                         const Parallel& par);

}  // namespace hinamoe
