// com.microsoft::QMoE feed-forward block over 4- or 8-bit expert weights
// read in place: packed uint8 [E, N, K*bits/8] (row-major along K, 4-bit
// values two per byte, the even element in the low nibble), scales in T,
// optional zero points packed as ORT packs them. No prepack, no dequantised
// copy: every call decodes the codes in registers. Plain C++17 (no ORT types).
//
// Semantics (ORT's moe_quantization_cpu.cc, which wins over ContribOperators.md):
//  * w = (q - zp) * scale, zp = 2^(bits-1) (8 / 128) without a zero-point input.
//  * Scales [E, N] (row-wise) or [E, N, ceil(K/block_size)]: when block_size
//    does not divide K the last block covers the K % block_size remaining
//    elements. [E, N, 1] counts as row-wise, and so do its zero points.
//  * Zero points: row-wise [E, ceil(N/pack)] (row n in byte n/pack at bit
//    (n%pack)*bits), block-wise [E, N, ceil(blocks/pack)] (block b of row n in
//    byte n*ceil(blocks/pack) + b/pack at bit (b%pack)*bits); pack = 8/bits.
//  * Routing (qmoe_routing.h): top-k on the raw logits, softmax over those k.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "../moe/moe_ffn.h"
#include "../parallel.h"
#include "../tier.h"

namespace hinamoe {

struct QMoEAttrs {
  MoEAttrs moe;               // k, activation, gate layout, alpha/beta/limit
  int bits = 4;               // 4 or 8
  int64_t block_size = 0;     // 0 = row-wise
  bool int8_activations = false;  // accuracy_level 4: x quantised to int8 per weight block
  bool bf16_tiles = true;  // bf16 arithmetic allowed (accuracy_level 0, 3, 4): the tier's tile kernel
};

// One expert weight of QMoE's layout.
struct QWeight {
  const uint8_t* codes = nullptr;  // [N, K*bits/8]
  const void* scales = nullptr;    // [N, nb] in scale_dtype (nb = 1: row-wise)
  const uint8_t* zero_points = nullptr;  // null = 2^(bits-1)
  DType scale_dtype = DType::F32;
  int bits = 4;
  int64_t K = 0;
  int64_t block = 0;  // elements per scale along K (K when row-wise)
  int64_t nb = 1;     // blocks per row: ceil(K / block), the last may be partial

  // Row strides, set by slice() (0: those of whole rows of K elements).
  int64_t code_ld = 0;   // bytes from row n's codes to row n+1's
  int64_t scale_ld = 0;  // scales from row n to row n+1
  int64_t zp_ld = 0;     // block-wise zero points: bytes from row n to row n+1

  int64_t block_end(int64_t b) const { return b + 1 < nb ? (b + 1) * block : K; }

  int64_t row_bytes() const { return K * bits / 8; }
  int64_t row_stride() const { return code_ld ? code_ld : row_bytes(); }
  int64_t scale_stride() const { return scale_ld ? scale_ld : nb; }
  bool rowwise_zero_points() const { return nb == 1 && zp_ld == 0; }
  float scale(int64_t n, int64_t b) const { return load_as_f32(scales, n * scale_stride() + b, scale_dtype); }
  int zero_point(int64_t n, int64_t b) const {
    if (zero_points == nullptr) return 1 << (bits - 1);
    const int pack = 8 / bits;
    const bool rw = rowwise_zero_points();
    const int64_t ld = zp_ld ? zp_ld : (nb + pack - 1) / pack;
    const uint8_t byte = rw ? zero_points[n / pack] : zero_points[n * ld + b / pack];
    const int64_t lane = rw ? n % pack : b % pack;
    return (byte >> (lane * bits)) & ((1 << bits) - 1);
  }
  int code(int64_t n, int64_t k) const {
    const uint8_t* r = codes + n * row_stride();
    return bits == 8 ? r[k] : (r[k >> 1] >> ((k & 1) * 4)) & 0xF;
  }

  // Columns [k0, k1) of every row as a weight of K = k1 - k0, read in place
  // (the NUMA path's per-node segments). Block-wise: k0 a multiple of block
  // (of two blocks with 4-bit zero points, which are packed two per byte)
  // and k1 = K or a multiple of block; row-wise: any k0 with whole bytes.
  QWeight slice(int64_t k0, int64_t k1) const {
    QWeight s = *this;
    s.code_ld = row_stride();
    s.scale_ld = scale_stride();
    s.codes = codes + k0 * bits / 8;
    s.K = k1 - k0;
    if (nb == 1 && zp_ld == 0) {  // one scale (and zero point) per row
      s.block = s.K;
      return s;
    }
    const int64_t b0 = k0 / block;
    s.scales = static_cast<const char*>(scales) + size_t(b0) * dtype_size(scale_dtype);
    s.nb = (s.K + block - 1) / block;
    if (zero_points != nullptr) {
      const int pack = 8 / bits;
      s.zp_ld = zp_ld ? zp_ld : (nb + pack - 1) / pack;
      s.zero_points = zero_points + b0 / pack;
    }
    return s;
  }
};

// f(bits, scale type, zero points) with a weight's as compile-time constants
// (std::integral_constant): the one switch from a weight's kind to a kernel
// instantiation, for every tier. With BITS given, the weight has that many.
template <int BITS, class F>
inline void with_weight_kind(const QWeight& w, F&& f) {
  auto zp = [&](auto sdt) {
    if (w.zero_points != nullptr) f(std::integral_constant<int, BITS>(), sdt, std::true_type());
    else f(std::integral_constant<int, BITS>(), sdt, std::false_type());
  };
  switch (w.scale_dtype) {
    case DType::F32: return zp(std::integral_constant<DType, DType::F32>());
    case DType::F16: return zp(std::integral_constant<DType, DType::F16>());
    default: return zp(std::integral_constant<DType, DType::BF16>());
  }
}
template <class F>
inline void with_weight_kind(const QWeight& w, F&& f) {
  if (w.bits == 8) with_weight_kind<8>(w, f);
  else with_weight_kind<4>(w, f);
}

// Where the elements of a token row sit, as a kernel reads them.
//  KOrder:    k.
//  EvenOdd:   whole 16-element groups as [0,2,..,14, 1,3,..,15] (the nibbles'
//             order: the low nibbles of 8 bytes, then their high ones); a
//             shorter tail group in k order.
//  EvenOdd32: the same on whole 32-element groups (16 bytes of codes: 16
//             even elements, then 16 odd ones); a shorter tail in k order.
//  Pair32:    blocks of 32 in pairs (K a multiple of 64): per 64 elements, the
//             even elements of the first block, the even ones of the second,
//             then the odd ones of each (16 each), so one 32-byte load of
//             codes and one of tokens cover two blocks, a block per 128-bit lane.
//  Quad32:    the same for four blocks per 128 elements (one 64-byte load,
//             a block per 128-bit lane); a last group of 64 as Pair32.
enum class TokenOrder : int { KOrder = 0, EvenOdd = 1, Pair32 = 2, EvenOdd32 = 3, Quad32 = 4 };

inline int64_t token_pos(TokenOrder o, int64_t k, int64_t K) {
  if (o == TokenOrder::EvenOdd && (k | 15) < K) {
    const int64_t j = k & 15;
    return (k & ~int64_t(15)) + (j & 1 ? 8 + (j >> 1) : j >> 1);
  }
  if (o == TokenOrder::EvenOdd32 && (k | 31) < K) {
    const int64_t j = k & 31;
    return (k & ~int64_t(31)) + (j & 1 ? 16 + (j >> 1) : j >> 1);
  }
  if (o == TokenOrder::Quad32 && (k | 127) < K) {
    const int64_t j = k & 127, blk = j >> 5, i = j & 31;
    return (k & ~int64_t(127)) + (i & 1) * 64 + blk * 16 + (i >> 1);
  }
  if (o == TokenOrder::Pair32 || o == TokenOrder::Quad32) {
    const int64_t j = k & 63, half = j >> 5, i = j & 31;
    return (k & ~int64_t(63)) + (i & 1) * 32 + half * 16 + (i >> 1);
  }
  return k;
}

// Tokens quantised to int8 per block of `block` elements (accuracy_level 4):
// x[m, k] ~ q[m*ld + token_pos(order, k, K)] * scale[m*nb + k/block];
// sum[m*nb + b] = sum of the block's codes (the last block ends at K).
struct QTokens {
  const int8_t* q = nullptr;
  const float* scale = nullptr;
  const int32_t* sum = nullptr;
  int64_t ld = 0, nb = 0, block = 0;
  int64_t lds = 0;  // scale / sum entries from token m to m+1 (0: nb)
  TokenOrder order = TokenOrder::KOrder;

  int64_t scale_stride() const { return lds ? lds : nb; }
  // Elements [k0, k0 + K) as tokens of K elements: k0 a multiple of block
  // and of 128 (every order's group, so element k0 sits at k0); the matching
  // QWeight::slice.
  QTokens slice(int64_t k0, int64_t K) const {
    QTokens s = *this;
    s.lds = scale_stride();
    s.q = q + k0;
    s.scale = scale + k0 / block;
    s.sum = sum + k0 / block;
    s.nb = (K + block - 1) / block;
    return s;
  }
};

// Y[m*ldy + (n - n0)] = sum_k w[n, k] * X[m*ldx + k] for n in [n0, n1),
// m < M, w dequantised as above (float arithmetic); X in the order of the
// tier's f_order (token_pos).
using QGemmFn = void (*)(const QWeight& w, int64_t n0, int64_t n1, const float* X, int64_t ldx, int64_t M,
                         float* Y, int64_t ldy);
// The same on int8 tokens (block = w.block, block-wise weights only).
using QGemmI8Fn = void (*)(const QWeight& w, int64_t n0, int64_t n1, const QTokens& x, int64_t M, float* Y,
                           int64_t ldy);

// The same on bf16 tiles (prefill): xv holds the M tokens as K x M VNNI
// bf16 (amx_layout.h), w is rounded to bf16 (amx/qgemm_tiles.h).
using QGemmTilesFn = void (*)(const QWeight& w, int64_t n0, int64_t n1, const uint16_t* xv, int64_t M, float* Y,
                              int64_t ldy);

// The token order a tier's kernel reads for a weight of `bits`, `block`
// elements per scale (K when row-wise), row length K, with or without zero
// points.
using TokenOrderFn = TokenOrder (*)(int bits, int64_t block, int64_t K, bool zero_points);
inline TokenOrder k_order(int, int64_t, int64_t, bool) { return TokenOrder::KOrder; }

// The quantised kernels of a tier (index 0: 4-bit, 1: 8-bit) and the token
// orders they read: f_order for the float rows, i8_order for the int8 codes.
// The orders may depend on K (and on block when it is K) only modulo 128:
// the NUMA path cuts rows into slices at multiples of 128.
struct QuantKernels {
  const char* name = "";
  QGemmFn gemm[2] = {};
  QGemmI8Fn gemm_i8[2] = {};
  TokenOrderFn f_order = k_order;
  TokenOrderFn i8_order = k_order;
  // Tiers with a matrix engine: the tile kernel for groups of at least
  // tile_min_tokens tokens ([0]: 4-bit, [1]: 8-bit weights), where the
  // caller allows bf16.
  // tile_tokens: up to 16 float rows (k order) into a VNNI block of the
  // tile kernel's token layout (amx/qgemm_tiles.h: vnni_rows16_*).
  QGemmTilesFn gemm_tiles = nullptr;
  void (*tile_tokens)(const float* const* rows, int n, int64_t K, int64_t Kp, uint32_t* dst, int64_t ld) = nullptr;
  int64_t tile_min_tokens[2] = {};     // float tokens (accuracy_level 0, 3)
  int64_t tile_min_tokens_i8[2] = {};  // where the int8-token kernels run otherwise (accuracy_level 4)
};

const QuantKernels& quant_ref();
const QuantKernels& quant_avx2();  // only where tier_unavailable_reason("avx2") is ""
// avx2's with the int8-token kernels on AVX-VNNI (vpdpbusd), only where
// avx_vnni_unavailable_reason() (tier.h) is ""; the avx2 tier runs it where it can.
const QuantKernels& quant_avx2_vnni();
// zmm kernels (qgemm_avx512.cc; int8 tokens on AVX512-VNNI where
// avx512_vnni_unavailable_reason() is ""), only where
// tier_unavailable_reason("avx512") is ""; what they do not cover runs on
// the avx2 tier's kernels.
const QuantKernels& quant_avx512();
// AMX-INT8 for the int8-token path (qgemm_amx.cc; the float path is avx2's):
// real tiles (only where amx_int8_unavailable_reason() is "") or the emulator.
// amx-emu also has the bf16 tile kernel on the emulator.
const QuantKernels& quant_amx();
const QuantKernels& quant_amx_emu();
// The avx512 kernels with the bf16 tile kernel on AMX for groups of
// tile_min_tokens tokens or more (the amx tier; only where
// amx_unavailable_reason() is "").
const QuantKernels& quant_avx512_tiles();
// The quantised kernels a MoE tier runs (amx-emu: AMX-INT8 for int8 tokens,
// avx2 or ref for the float path, bf16 tiles; amx: quant_avx512_tiles, as
// the AMX-INT8 kernel is slower than the zmm ones on silicon today; avx512:
// quant_avx512).
const QuantKernels& quant_kernels_for(const KernelTier& tier);

struct QMoETensors {
  DType dtype = DType::F32;       // T: input, router, biases, output
  DType scale_dtype = DType::F32; // T2: the scales (ORT lets them differ from T)
  const void* input = nullptr;    // [tokens, H]
  const void* router = nullptr;   // [tokens, E] logits
  const void* router_weights = nullptr;  // optional [tokens, E]: mixing weights of the chosen experts
  const uint8_t* fc1_w = nullptr;  // [E, N1, H*bits/8]
  const void* fc1_s = nullptr;     // [E, N1] or [E, N1, H/block]
  const uint8_t* fc1_zp = nullptr;
  const void* fc1_b = nullptr;     // [E, N1]
  const uint8_t* fc2_w = nullptr;  // [E, H, I*bits/8]
  const void* fc2_s = nullptr;
  const uint8_t* fc2_zp = nullptr;
  const void* fc2_b = nullptr;     // [E, H]
  const uint8_t* fc3_w = nullptr;  // [E, I, H*bits/8] (GateLayout::Separate)
  const void* fc3_s = nullptr;
  const uint8_t* fc3_zp = nullptr;
  const void* fc3_b = nullptr;     // [E, I]
  int64_t fc1_nb = 1, fc2_nb = 1, fc3_nb = 1;  // scale blocks per row (1 = row-wise)
  void* output = nullptr;          // [tokens, H]
};

// Checks attributes against the shape. "" when valid, else the reason.
std::string validate_qmoe(const MoEShape& shape, const QMoEAttrs& attrs, const QMoETensors& t);

// Runs the block. "" on success, else a message (e.g. NaN router logits).
std::string qmoe_ffn(const MoEShape& shape, const QMoEAttrs& attrs, const QMoETensors& t, const KernelTier& tier,
                     const Parallel& par);
// The same with NUMA partitioning as moe_ffn's (MoEOptions): every expert
// weight's GEMM split by node over its codes' segment tables, cut only where
// the kernels can (whole scale blocks, whole 128-element groups: at most half
// of such a granule's locality lost per page boundary); the scales are read by the
// node that reads their codes.
std::string qmoe_ffn(const MoEShape& shape, const QMoEAttrs& attrs, const QMoETensors& t, const KernelTier& tier,
                     const Parallel& par, const MoEOptions& opt);

}  // namespace hinamoe
