// QMoE's int8 GEMM hook (QGemmI8Fn) over the AMX-INT8 block kernel
// (amx/qmoe_i8.h): rows [n0, n1) become a weight of n1 - n0 rows (codes in
// place, scales converted to float, block-wise zero points sliced at n0);
// the row-major int8 tokens are re-laid into the VNNI layout per call.
#include <vector>

#include "../amx/amx_detect.h"
#include "../amx/qgemm_tiles.h"
#include "../amx/qmoe_i8.h"
#include "../tuning.h"
#include "qmoe_ffn.h"

namespace hinamoe {
namespace {

void set_tile_min(QuantKernels* t) {
  for (int b = 0; b < 2; ++b) {
    t->tile_min_tokens[b] = tuning::kTileMinTokens[b];
    t->tile_min_tokens_i8[b] = tuning::kTileMinTokensI8[b];
  }
}

using AmxBlockFn = void (*)(const AmxI8Weight&, const AmxI8Tokens&, int64_t, int64_t, float*, int64_t);

template <AmxBlockFn Fn>
void qgemm_i8_amx_t(const QWeight& w, int64_t n0, int64_t n1, const QTokens& x, int64_t M, float* Y, int64_t ldy) {
  if (M <= 0 || n0 >= n1) return;
  const int64_t rows = n1 - n0, pack = 8 / w.bits;
  const int64_t zp_ld = w.zp_ld ? w.zp_ld : (w.nb + pack - 1) / pack;
  AmxI8Weight aw;
  aw.codes = w.codes + n0 * w.row_stride();
  aw.code_ld = w.row_stride();
  aw.zero_points = w.zero_points ? w.zero_points + n0 * zp_ld : nullptr;
  aw.zp_ld = zp_ld;
  aw.bits = w.bits;
  aw.N = rows;
  aw.K = w.K;
  aw.block = w.block;
  AmxI8Tokens at;
  at.scale = x.scale;
  at.sum = x.sum;
  at.M = M;
  at.K = w.K;
  at.block = w.block;
  thread_local std::vector<float> scales, tscale;
  thread_local std::vector<int32_t> tsum;
  thread_local std::vector<int8_t> vnni;
  scales.resize(size_t(rows * w.nb));
  vnni.resize(size_t(M * w.K));
  aw.scales = scales.data();
  at.q = vnni.data();
  // Row-wise zero points are packed by row, not by block: the ref kernel
  // takes those, a partial last block (block not dividing K), and anything
  // else the AMX kernel does not (block size).
  if ((w.rowwise_zero_points() && w.zero_points) || w.K % w.block != 0 || !amx_i8_unsupported_reason(aw, at).empty())
    return quant_ref().gemm_i8[w.bits == 8](w, n0, n1, x, M, Y, ldy);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < w.nb; ++b) scales[size_t(r * w.nb + b)] = w.scale(n0 + r, b);
  if (x.scale_stride() != w.nb) {  // a K slice (NUMA): the kernel reads [M, nb]
    tscale.resize(size_t(M * w.nb));
    tsum.resize(size_t(M * w.nb));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t b = 0; b < w.nb; ++b) {
        tscale[size_t(m * w.nb + b)] = x.scale[m * x.scale_stride() + b];
        tsum[size_t(m * w.nb + b)] = x.sum[m * x.scale_stride() + b];
      }
    at.scale = tscale.data();
    at.sum = tsum.data();
  }
  amx_i8_tokens_to_vnni(x.q, x.ld, M, w.K, vnni.data());
  Fn(aw, at, 0, rows, Y, ldy);
}


}  // namespace

const QuantKernels& quant_avx512_tiles() {
  static const QuantKernels q = [] {
    QuantKernels t = quant_avx512();
    t.name = "avx512+tiles";
    t.gemm_tiles = qgemm_tiles_amx;
    t.tile_tokens = vnni_rows16_avx512;
    set_tile_min(&t);
    return t;
  }();
  return q;
}

// The float path stays on the avx2 (else ref) kernels; int8 tokens in k order.
const QuantKernels& quant_amx() {
  static const QuantKernels q = [] {
    QuantKernels t = tier_unavailable_reason("avx2").empty() ? quant_avx2() : quant_ref();
    t.name = "amx";
    t.gemm_i8[0] = t.gemm_i8[1] = qgemm_i8_amx_t<amx_qmoe_i8_block_amx>;
    t.i8_order = k_order;
    return t;
  }();
  return q;
}

const QuantKernels& quant_amx_emu() {
  static const QuantKernels q = [] {
    QuantKernels t = tier_unavailable_reason("avx2").empty() ? quant_avx2() : quant_ref();
    t.name = "amx-emu";
    t.gemm_i8[0] = t.gemm_i8[1] = qgemm_i8_amx_t<amx_qmoe_i8_block_emu>;
    t.i8_order = k_order;
    t.gemm_tiles = qgemm_tiles_emu;
    t.tile_tokens = vnni_rows16_ref;
    set_tile_min(&t);
    return t;
  }();
  return q;
}

}  // namespace hinamoe
