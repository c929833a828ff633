// MatMulNBits on the QMoE kernels: the tokens are prepared once per call
// (the tier's order, int8 codes for accuracy_level 4), then the rows of B
// are split into blocks over the threads; each block streams its rows once
// for every token of the call.
#include "matmul_nbits.h"

#include <algorithm>
#include <vector>

#include "../parallel.h"
#include "../scratch.h"
#include "../tuning.h"
#include "../qmoe/qoperand.h"

namespace hinamoe {
namespace {

using namespace detail;

QWeight weight_of(const MatMulNBitsAttrs& a, const MatMulNBitsTensors& t) {
  QWeight w;
  w.bits = a.bits;
  w.K = a.K;
  w.nb = (a.K + a.block - 1) / a.block;
  w.block = w.nb == 1 ? a.K : a.block;
  w.scale_dtype = t.dtype;
  w.codes = t.b;
  w.code_ld = w.nb * a.block * a.bits / 8;  // B pads the last block
  w.scales = t.scales;
  w.zero_points = t.zero_points;
  // Zero points are per row and block (never QMoE's row-wise packing along N).
  if (t.zero_points != nullptr) w.zp_ld = (w.nb * a.bits + 7) / 8;
  return w;
}

// Rows of B per work item: whole multiples of 16, about 8 items per thread
// (dynamic claiming evens out a thread slowed by other load).
int64_t rows_per_item(int64_t N, int threads) {
  if (threads <= 1) return N;
  const int64_t want = 8 * int64_t(threads);
  const int64_t r = (N + want - 1) / want;
  return std::max<int64_t>(16, (r + 15) / 16 * 16);
}

}  // namespace

std::string validate_matmul_nbits(const MatMulNBitsAttrs& a) {
  if (a.bits != 4 && a.bits != 8) return "bits=" + std::to_string(a.bits) + " is not 4 or 8";
  if (a.block < 16 || (a.block & (a.block - 1)) != 0)
    return "block_size=" + std::to_string(a.block) + " is not a power of two >= 16";
  if (a.K <= 0 || a.N <= 0) return "K=" + std::to_string(a.K) + ", N=" + std::to_string(a.N) + " must be positive";
  return "";
}

std::string matmul_nbits(const MatMulNBitsAttrs& a, const MatMulNBitsTensors& t, const KernelTier& tier,
                         const Parallel& par) {
  std::string err = validate_matmul_nbits(a);
  if (!err.empty()) return err;
  if (t.M == 0) return "";
  if (t.a == nullptr || t.b == nullptr || t.scales == nullptr || t.y == nullptr) return "a tensor is null";
  const QuantKernels& qk = quant_kernels_for(tier);
  const QWeight w = weight_of(a, t);
  const int64_t K = a.K, N = a.N;
  const DType dt = t.dtype;
  const bool int8 = a.int8_activations && w.nb > 1;
  const int64_t row_bytes = padded_ld(K) * 4 + (int8 ? K + 64 + w.nb * 8 : 0) + (dt == DType::F32 ? 0 : N * 4);
  const int64_t chunk = std::max<int64_t>(1, tuning::kDenseScratchBytes / row_bytes);
  const int64_t rows = rows_per_item(N, par.threads);
  const int64_t items = (N + rows - 1) / rows;

  Scratch<Operand> op_s;
  Scratch<std::vector<float>> y_s;
  Operand& op = *op_s;
  for (int64_t m0 = 0; m0 < t.M; m0 += chunk) {
    const int64_t M = std::min(chunk, t.M - m0);
    op.init(qk, a.bits, M, K, w.nb, a.block, int8, t.zero_points != nullptr, a.bf16_tiles);
    const char* in = static_cast<const char*>(t.a) + size_t(m0 * K) * dtype_size(dt);
    const int64_t tok_chunk = 16;
    // On tiles, float32 A goes straight into the tile layout (x unused).
    const bool direct = op.on_tiles(M) && dt == DType::F32;
    maybe_parallel(par, (M + tok_chunk - 1) / tok_chunk, M * K, [&](size_t c) {
      const int64_t p0 = int64_t(c) * tok_chunk, p1 = std::min(M, p0 + tok_chunk);
      if (direct) return op.build_tiles(0, M, p0, p1, static_cast<const float*>(t.a) + m0 * K, K);
      for (int64_t p = p0; p < p1; ++p) {
        float* dst = &op.x[size_t(p * op.ld)];
        if (op.x_order != TokenOrder::KOrder) {
          for (int64_t k = 0; k < K; ++k) dst[op.pos(k)] = load_as_f32(in, p * K + k, dt);
        } else {
          for (int64_t k = 0; k < K; ++k) dst[k] = load_as_f32(in, p * K + k, dt);
        }
      }
      op.finish(p0, p1);
      op.build_tiles(0, M, p0, p1);
    });

    // float32 output is written in place; other types through a float buffer.
    float* Y = dt == DType::F32 ? static_cast<float*>(t.y) + m0 * N : nullptr;
    if (Y == nullptr) {
      y_s->resize(size_t(M * N));
      Y = y_s->data();
    }
    par.for_each(size_t(items), [&](size_t i) {
      const int64_t n0 = int64_t(i) * rows, n1 = std::min(N, n0 + rows);
      run_gemm(qk, w, op, 0, M, n0, n1, Y + n0, N);
      for (int64_t m = 0; m < M; ++m) {
        float* yr = Y + m * N;
        if (t.bias != nullptr)
          for (int64_t n = n0; n < n1; ++n) yr[n] += load_as_f32(t.bias, n, dt);
        if (dt != DType::F32)
          for (int64_t n = n0; n < n1; ++n) store_from_f32(t.y, (m0 + m) * N + n, dt, yr[n]);
      }
    });
  }
  return "";
}

}  // namespace hinamoe
