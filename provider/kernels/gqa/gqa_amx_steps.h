// The steps of the AMX GQA chunk kernel (gqa_amx_impl.h) that are not tile
// work: the query block into the VNNI operand, V rows into VNNI pairs, and
// the online softmax with P split into bf16 hi + lo. Written on 4-float SSE2
// vectors, which every x86-64 CPU has, so the same code runs in the AMX
// build and in the emulator build. As scalar code these steps bounded the
// kernel on AMX silicon (2026-11-29: 2-4 GB/s, a third of the avx2 kernel).
// All functions are static: each including translation unit (one of them
// compiled with the AMX target) keeps its own copy (DESIGN.md §5).
#pragma once

#include <emmintrin.h>
#include <xmmintrin.h>

#include <cstdint>
#include <cstring>
#include <limits>

#include "../dtype.h"

namespace hinamoe {
namespace gqa_amx {

// exp(x) for x <= 0, as the avx2 kernel's exp_nonpos: Cody-Waite reduction,
// degree-6 polynomial; below -87.3, -inf and NaN give 0.
static inline __m128 exp_nonpos4(__m128 x) {
  const __m128 lo = _mm_set1_ps(-87.3f);
  const __m128 keep = _mm_cmpge_ps(x, lo);
  x = _mm_max_ps(x, lo);
  const __m128i ni = _mm_cvtps_epi32(_mm_mul_ps(x, _mm_set1_ps(1.44269504088896341f)));  // to nearest
  const __m128 n = _mm_cvtepi32_ps(ni);
  __m128 f = _mm_sub_ps(x, _mm_mul_ps(n, _mm_set1_ps(0.693145751953125f)));
  f = _mm_sub_ps(f, _mm_mul_ps(n, _mm_set1_ps(1.428606765330187045e-06f)));
  __m128 p = _mm_set1_ps(1.0f / 720);
  p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(1.0f / 120));
  p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(1.0f / 24));
  p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(1.0f / 6));
  p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(0.5f));
  p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(1.0f));
  p = _mm_add_ps(_mm_mul_ps(p, f), _mm_set1_ps(1.0f));
  const __m128i e = _mm_slli_epi32(_mm_add_epi32(ni, _mm_set1_epi32(127)), 23);
  return _mm_and_ps(_mm_mul_ps(p, _mm_castsi128_ps(e)), keep);
}

// f32_to_bf16 on 4 lanes (nearest even, NaN kept quiet): the bf16 bits,
// sign-extended in each 32-bit lane so _mm_packs_epi32 packs them exactly.
static inline __m128i bf16_bits4(__m128 v) {
  const __m128i u = _mm_castps_si128(v);
  const __m128i odd = _mm_and_si128(_mm_srli_epi32(u, 16), _mm_set1_epi32(1));
  const __m128i rne = _mm_add_epi32(u, _mm_add_epi32(_mm_set1_epi32(0x7fff), odd));
  const __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(u, _mm_set1_epi32(0x7fffffff)), _mm_set1_epi32(0x7f800000));
  const __m128i quiet = _mm_or_si128(u, _mm_set1_epi32(0x00400000));
  return _mm_srai_epi32(_mm_or_si128(_mm_and_si128(nan, quiet), _mm_andnot_si128(nan, rne)), 16);
}

static inline __m128 bf16_value4(__m128i bits) { return _mm_castsi128_ps(_mm_slli_epi32(bits, 16)); }

// Row n of the query block into the VNNI Q^T operands, split into bf16
// hi + lo parts: dims (c, c+1) are the 32-bit word (c/2)*16 + n.
static inline void q_to_vnni(const float* q, int64_t d, int64_t n, uint16_t* hi, uint16_t* lo) {
  int64_t c = 0;
  for (; c + 4 <= d; c += 4) {
    const __m128 v = _mm_loadu_ps(q + c);
    const __m128i h = bf16_bits4(v);
    const __m128i hl = _mm_packs_epi32(h, bf16_bits4(_mm_sub_ps(v, bf16_value4(h))));
    uint32_t w[4];  // hi (c, c+1), hi (c+2, c+3), lo (c, c+1), lo (c+2, c+3)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(w), hl);
    std::memcpy(hi + ((c / 2) * 16 + n) * 2, &w[0], 4);
    std::memcpy(hi + ((c / 2 + 1) * 16 + n) * 2, &w[1], 4);
    std::memcpy(lo + ((c / 2) * 16 + n) * 2, &w[2], 4);
    std::memcpy(lo + ((c / 2 + 1) * 16 + n) * 2, &w[3], 4);
  }
  for (; c < d; ++c) {
    const size_t i = size_t((c / 2) * 32 + 2 * n + (c & 1));
    hi[i] = f32_to_bf16(q[c]);
    lo[i] = f32_to_bf16(q[c] - bf16_to_f32(hi[i]));
  }
}

// Keys j (v0) and j+1 (v1) as one VNNI pair row of the P.V operand:
// dst[2c] = v0[c], dst[2c+1] = v1[c] for c < d, zero for d <= c < dv.
static inline void interleave_pair(const uint16_t* v0, const uint16_t* v1, int64_t d, int64_t dv, uint16_t* dst) {
  int64_t c = 0;
  for (; c + 8 <= d; c += 8) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v0 + c));
    const __m128i y = _mm_loadu_si128(reinterpret_cast<const __m128i*>(v1 + c));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * c), _mm_unpacklo_epi16(x, y));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * c + 8), _mm_unpackhi_epi16(x, y));
  }
  for (; c < d; ++c) {
    dst[2 * c] = v0[c];
    dst[2 * c + 1] = v1[c];
  }
  for (; c < dv; ++c) dst[2 * c] = dst[2 * c + 1] = 0;
}

// The online softmax (gqa.h) of nr <= 4 query rows over the nk scores of a
// chunk, st[j*ld + i] for key j, row i (the rows of a key side by side; 4
// lanes are read even when nr < 4). Per row i: m[i] rises to the chunk's
// max, l[i] = l[i]*f + sum_j p_j with f = exp(m_old - m_new) and p_j =
// exp(s_j - m_new); out row i (stride ldo) = acc row i (stride d) * f; P
// row i as bf16 hi + lo at ph/pl + i*ldp, keys [0, ldp), zero from nk on.
// A row whose scores were all -inf so far keeps m = -inf, l and acc, and
// gets P = 0.
static inline void softmax_rows4(const float* st, int64_t ld, int64_t nk, int64_t nr, float* m, float* l,
                                 const float* acc, int64_t d, float* out, int64_t ldo, uint16_t* ph, uint16_t* pl,
                                 int64_t ldp) {
  const float ninf = -std::numeric_limits<float>::infinity();
  alignas(16) float mv[4] = {ninf, ninf, ninf, ninf}, lv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t i = 0; i < nr; ++i) {
    mv[i] = m[i];
    lv[i] = l[i];
  }
  const __m128 m_old = _mm_load_ps(mv);
  // bad: rows with a NaN or +inf score, now or before (m NaN); they get
  // m = NaN and the driver recomputes them (max and exp here drop NaN).
  __m128 bm = _mm_set1_ps(ninf), bad = _mm_cmpunord_ps(m_old, m_old);
  const __m128 pinf = _mm_set1_ps(-ninf);
  for (int64_t j = 0; j < nk; ++j) {
    const __m128 x = _mm_loadu_ps(st + j * ld);
    bm = _mm_max_ps(bm, x);
    bad = _mm_or_ps(bad, _mm_cmpnlt_ps(x, pinf));
  }
  const __m128 m_new = _mm_max_ps(m_old, bm);
  const __m128 dead = _mm_cmpeq_ps(m_new, _mm_set1_ps(ninf));
  const __m128 f = _mm_or_ps(_mm_and_ps(dead, _mm_set1_ps(1.0f)),
                             _mm_andnot_ps(dead, exp_nonpos4(_mm_sub_ps(m_old, m_new))));
  const __m128 msub = _mm_andnot_ps(dead, m_new);  // dead rows subtract 0: their p stay 0
  __m128 lsum = _mm_mul_ps(_mm_load_ps(lv), f);

  alignas(16) float fv[4];
  _mm_store_ps(fv, f);
  for (int64_t i = 0; i < nr; ++i) {
    const float* a = acc + i * d;
    float* o = out + i * ldo;
    const __m128 fi = _mm_set1_ps(fv[i]);
    int64_t c = 0;
    for (; c + 4 <= d; c += 4) _mm_storeu_ps(o + c, _mm_mul_ps(fi, _mm_loadu_ps(a + c)));
    for (; c < d; ++c) o[c] = fv[i] * a[c];
  }

  for (int64_t j = 0; j < nk; j += 4) {
    __m128 p0 = exp_nonpos4(_mm_sub_ps(_mm_loadu_ps(st + j * ld), msub));
    __m128 p1 = j + 1 < nk ? exp_nonpos4(_mm_sub_ps(_mm_loadu_ps(st + (j + 1) * ld), msub)) : _mm_setzero_ps();
    __m128 p2 = j + 2 < nk ? exp_nonpos4(_mm_sub_ps(_mm_loadu_ps(st + (j + 2) * ld), msub)) : _mm_setzero_ps();
    __m128 p3 = j + 3 < nk ? exp_nonpos4(_mm_sub_ps(_mm_loadu_ps(st + (j + 3) * ld), msub)) : _mm_setzero_ps();
    lsum = _mm_add_ps(_mm_add_ps(_mm_add_ps(_mm_add_ps(lsum, p0), p1), p2), p3);
    _MM_TRANSPOSE4_PS(p0, p1, p2, p3);  // now p_i = row i's weights for keys j..j+3
    const __m128 pr[4] = {p0, p1, p2, p3};
    for (int64_t i = 0; i < nr; ++i) {
      const __m128i h = bf16_bits4(pr[i]);
      const __m128i hl = _mm_packs_epi32(h, bf16_bits4(_mm_sub_ps(pr[i], bf16_value4(h))));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(ph + i * ldp + j), hl);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(pl + i * ldp + j), _mm_unpackhi_epi64(hl, hl));
    }
  }
  const int64_t nk4 = (nk + 3) / 4 * 4;
  for (int64_t i = 0; i < nr; ++i) {
    std::memset(ph + i * ldp + nk4, 0, size_t(ldp - nk4) * 2);
    std::memset(pl + i * ldp + nk4, 0, size_t(ldp - nk4) * 2);
  }

  alignas(16) float ln[4], mn[4];
  _mm_store_ps(ln, lsum);
  _mm_store_ps(mn, _mm_or_ps(m_new, bad));  // all-ones bits: a NaN
  for (int64_t i = 0; i < nr; ++i) {
    m[i] = mn[i];
    l[i] = ln[i];
  }
}

}  // namespace gqa_amx
}  // namespace hinamoe
