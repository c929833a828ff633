#include "qoperand.h"

#include <algorithm>
#include <limits>

#include "../dtype.h"

namespace hinamoe {
namespace detail {

// Symmetric int8 per block of `block` (max |x| -> 127), codes at pos[k]
// (the kernel's order, token_pos; null: k order); rows [p0, p1) of x [*, ldx]
// into the QTokens buffers. The last of the nb blocks ends at K (a partial
// block when block does not divide K). Written so the compiler vectorises
// it (prefill-sized batches quantise ~10^5 elements per call): max |x| and
// the non-finite test on the bit patterns (unsigned max and or, which
// vectorise without fast-math), codes into a k-order row, then placed.
// Rounding to nearest even by the 1.5 * 2^23 trick (|x * inv| <= 127),
// which is what nearbyint gives in the default rounding mode.
void quantize_rows(const float* x, int64_t ldx, int64_t K, int64_t block, const int32_t* pos, int64_t p0,
                   int64_t p1, int8_t* q, float* scale, int32_t* sum, int64_t ldq, int64_t nb) {
  constexpr float kRound = 12582912.0f;
  std::vector<int8_t> row(pos ? size_t(K) : 0);
  for (int64_t p = p0; p < p1; ++p) {
    const float* xr = x + p * ldx;
    int8_t* qr = q + p * ldq;
    int8_t* codes = pos ? row.data() : qr;
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t kb = b * block, ke = std::min(K, kb + block);
      uint32_t mx = 0, nonfinite = 0;
      for (int64_t k = kb; k < ke; ++k) {
        const uint32_t u = f32_to_bits(xr[k]) & 0x7fffffffu;
        mx = u > mx ? u : mx;
        nonfinite |= u >= 0x7f800000u ? 1u : 0u;
      }
      const float amax = bits_to_f32(mx);
      // A NaN/Inf token block gets codes 0 and scale NaN, so its outputs are
      // NaN (as the float path gives), not a finite value from dropped codes.
      const bool finite = nonfinite == 0;
      const float s = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
      // Blocks under 1e-30 (127 / amax would overflow near denormals) get codes 0.
      const float inv = finite && amax >= 1e-30f ? 127.0f / amax : 0.0f;
      int32_t total = 0;
      if (!finite) {
        std::fill(codes + kb, codes + ke, int8_t(0));
      } else {
        for (int64_t k = kb; k < ke; ++k) {
          float r = (xr[k] * inv + kRound) - kRound;
          r = r > 127.0f ? 127.0f : r;  // |x * inv| <= 127 up to rounding
          r = r < -127.0f ? -127.0f : r;
          const int v = int(r);
          codes[k] = int8_t(v);
          total += v;
        }
      }
      scale[p * nb + b] = s;
      sum[p * nb + b] = total;
    }
    if (pos)
      for (int64_t k = 0; k < K; ++k) qr[pos[k]] = codes[k];
  }
}


// One GEMM of rows [n0, n1) of w, columns [k0, k1) (default: all), for the
// M routes starting at p0.
void Operand::build_tiles(int64_t p0, int64_t p1, int64_t m_lo, int64_t m_hi, const float* src, int64_t lds) {
  const int64_t M = p1 - p0;
  if (!on_tiles(M)) return;
  if (m_hi < 0) m_hi = M;
  // Blocks of 32 tokens (qgemm_tiles.h): block j at xv + (p0 + 32j) * Kp holds
  // pair k/2 of its token c at [(k/2)*mt + c], mt its token count; written
  // 16 tokens at a time, rows in k order (put back in order where the
  // vector kernels' order is another).
  thread_local std::vector<float> korder;
  if (!src && !xpos.empty() && korder.size() < size_t(16 * K)) korder.resize(size_t(16 * K));
  for (int64_t m0 = m_lo, m1; m0 < m_hi; m0 = m1) {
    m1 = std::min(m_hi, (m0 / 16 + 1) * 16);  // never across a block of 32
    const int64_t mb = m0 / 32 * 32, mt = std::min<int64_t>(32, M - mb);
    const float* rows[16];
    for (int64_t m = m0; m < m1; ++m) {
      const float* xr = x.data() + (p0 + m) * ld;
      if (src != nullptr) {
        rows[m - m0] = src + m * lds;
      } else if (xpos.empty()) {
        rows[m - m0] = xr;
      } else {
        float* r = korder.data() + (m - m0) * K;
        for (int64_t k = 0; k < K; ++k) r[k] = xr[xpos[size_t(k)]];
        rows[m - m0] = r;
      }
    }
    uint32_t* dst = reinterpret_cast<uint32_t*>(xv.data() + (p0 + mb) * Kp) + (m0 - mb);
    tile_tokens(rows, int(m1 - m0), K, Kp, dst, mt);
  }
}

void run_gemm(const QuantKernels& qk, const QWeight& w, const Operand& op, int64_t p0, int64_t M, int64_t n0,
              int64_t n1, float* Y, int64_t ldy, int64_t k0, int64_t k1) {
  const int bi = w.bits == 8 ? 1 : 0;
  if (k1 < 0) k1 = w.K;
  const bool whole = k0 == 0 && k1 == w.K;
  const QWeight v = whole ? w : w.slice(k0, k1);
  if (whole && op.on_tiles(M)) {
    op.tiles(w, n0, n1, op.xv.data() + p0 * op.Kp, M, Y, ldy);
  } else if (op.int8) {
    const QTokens x = op.tokens(p0);
    qk.gemm_i8[bi](v, n0, n1, whole ? x : x.slice(k0, k1 - k0), M, Y, ldy);
  } else {
    qk.gemm[bi](v, n0, n1, op.x.data() + p0 * op.ld + k0, op.ld, M, Y, ldy);
  }
}

}  // namespace detail
}  // namespace hinamoe
