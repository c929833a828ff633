// The AVX2 GQA chunk kernels. The query rows of a block (the G heads sharing
// this KV head, times the tile's tokens) are scored against each key row
// while it is in cache, so every K and V row is read from memory once for
// all G heads. Two kernels:
// * lanes (blocks of >= 4 rows, so G >= 4 at decode): rows in groups of 8
//   (or 4), keys in blocks of 16 that are finished -- scores, online
//   softmax with one vector per key for the group's rows, P*V -- before the
//   next block is read, with software prefetch in address order;
// * rows (the last 1..3 rows): scores of the whole piece, softmax row by
//   row, then P*V -- three passes over the piece.
//
// Only functions with HINAMOE_AVX2 carry target("avx2,fma"); the file is
// built for baseline x86-64 (see moe/gemm_rows_avx2.cc).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "dtype.h"
#include "gqa/gqa.h"
#include "isa_target.h"
#include "vec_avx2.h"

namespace hinamoe {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNegInf = -kInf;

using avx2::hsum;
using avx2::load8;

HINAMOE_AVX2_INLINE float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) for x <= 0 (scores minus their max): Cody-Waite reduction to
// 2^n * exp(f), |f| <= ln2/2, degree-6 polynomial (relative error ~2 ulp).
// Inputs below -87.3 (including -inf) give 0.
HINAMOE_AVX2_INLINE __m256 exp_nonpos(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.3f);
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 f = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  f = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), f);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

// Software prefetch of K/V lines: into L2 (T1) by default. Streaming from
// DRAM, T1 beat T0 by 1.0-1.8x (docs/kernels.md); in cache they are alike.
HINAMOE_AVX2_INLINE void pf_line(const char* p) {
  if (gqa_avx2_knobs().prefetch_l2) _mm_prefetch(p, _MM_HINT_T1);
  else _mm_prefetch(p, _MM_HINT_T0);
}

// Scores of KB keys starting at k0 (row stride kv_stride) for rows [0, RB):
// sc[r*ld + kk] = q_r . k_kk. RB x KB accumulators; 4 x 3 = 12 keeps enough
// independent FMA chains in flight to cover the FMA latency (4 x 2 left the
// FMA pipes ~60% idle). Prefetches the same rows one piece (pf elements) on.
template <DType DT, int RB, int KB>
HINAMOE_AVX2_INLINE void scores_keys(const float* q, int64_t d, const typename Elem<DT>::T* k0, int64_t kv_stride,
                                     float* sc, int64_t ld, int64_t pf) {
  __m256 s[RB][KB];
  for (int r = 0; r < RB; ++r)
    for (int kk = 0; kk < KB; ++kk) s[r][kk] = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; c += 8) {
    if ((c * int64_t(sizeof(*k0))) % 64 == 0)
      for (int kk = 0; kk < KB; ++kk)
        pf_line(reinterpret_cast<const char*>(k0 + kk * kv_stride + pf + c));
    __m256 kv[KB];
    for (int kk = 0; kk < KB; ++kk) kv[kk] = load8<DT>(k0 + kk * kv_stride + c);
    for (int r = 0; r < RB; ++r) {
      const __m256 x = _mm256_loadu_ps(q + r * d + c);
      for (int kk = 0; kk < KB; ++kk) s[r][kk] = _mm256_fmadd_ps(x, kv[kk], s[r][kk]);
    }
  }
  if constexpr (RB == 4) {
    // Two hadd levels leave per-lane partial sums [r0 r1 r2 r3] of a key;
    // adding the halves finishes all 4 rows at once.
    for (int kk = 0; kk < KB; ++kk) {
      const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(s[0][kk], s[1][kk]), _mm256_hadd_ps(s[2][kk], s[3][kk]));
      alignas(16) float t[4];
      _mm_store_ps(t, _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
      for (int r = 0; r < 4; ++r) sc[r * ld + kk] = t[r];
    }
  } else {
    for (int r = 0; r < RB; ++r)
      for (int kk = 0; kk < KB; ++kk) sc[r * ld + kk] = hsum(s[r][kk]);
  }
}

// sc[r*ld + j] = q_r . k_j for rows [0, RB), keys [0, nk). `wide` takes 3
// keys per step (12 accumulators) instead of 2; see chunk_avx2 for when.
template <DType DT, int RB>
HINAMOE_AVX2_INLINE void scores_block(const float* q, int64_t d, const typename Elem<DT>::T* k, int64_t kv_stride,
                                      int64_t nk, float* sc, int64_t ld, int64_t pf, bool wide) {
  int64_t j = 0;
  if (wide)
    for (; j + 3 <= nk; j += 3) scores_keys<DT, RB, 3>(q, d, k + j * kv_stride, kv_stride, sc + j, ld, pf);
  else
    for (; j + 2 <= nk; j += 2) scores_keys<DT, RB, 2>(q, d, k + j * kv_stride, kv_stride, sc + j, ld, pf);
  for (; j < nk; ++j) scores_keys<DT, RB, 1>(q, d, k + j * kv_stride, kv_stride, sc + j, ld, pf);
}

// acc[r*d + c + :W] += sum_j p[r*ld + j] * v_j[c + :W] for rows [0, RB), one
// strip of W = 8*NV columns: RB x NV accumulators (4 x 3 = 12, as above).
// Prefetches the strip's cache lines of the row one piece (pf elements) on.
template <DType DT, int RB, int NV>
HINAMOE_AVX2_INLINE void pv_strip(const float* p, int64_t ld, const typename Elem<DT>::T* v, int64_t kv_stride,
                                  int64_t nk, int64_t c, float* acc, int64_t d, int64_t pf) {
  using E = typename Elem<DT>::T;
  constexpr int64_t es = sizeof(E);
  // The lines starting inside this strip's bytes [c*es, (c+8*NV)*es) (<= 2).
  const int64_t first = (c * es + 63) / 64 * 64, end = (c + 8 * NV) * es;
  const int nlines = first >= end ? 0 : (first + 64 >= end ? 1 : 2);
  __m256 a[RB][NV];
  for (int r = 0; r < RB; ++r)
    for (int i = 0; i < NV; ++i) a[r][i] = _mm256_loadu_ps(acc + r * d + c + 8 * i);
  const E* vj = v + c;
  const char* pfj = reinterpret_cast<const char*>(v + pf) + first;
  for (int64_t j = 0; j < nk; ++j, vj += kv_stride, pfj += kv_stride * es) {
    if (nlines > 0) pf_line(pfj);
    if (nlines > 1) pf_line(pfj + 64);
    __m256 x[NV];
    for (int i = 0; i < NV; ++i) x[i] = load8<DT>(vj + 8 * i);
    for (int r = 0; r < RB; ++r) {
      const __m256 w = _mm256_broadcast_ss(p + r * ld + j);
      for (int i = 0; i < NV; ++i) a[r][i] = _mm256_fmadd_ps(w, x[i], a[r][i]);
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int i = 0; i < NV; ++i) _mm256_storeu_ps(acc + r * d + c + 8 * i, a[r][i]);
}

// acc[r*d + :] += sum_j p[r*ld + j] * v_j for rows [0, RB): with `wide`,
// strips of 24 columns, then 16 / 8 for the rest (d = 128: 4 x 24 + 2 x 16);
// else strips of 16.
template <DType DT, int RB>
HINAMOE_AVX2_INLINE void pv_block(const float* p, int64_t ld, const typename Elem<DT>::T* v, int64_t kv_stride,
                                  int64_t nk, int64_t d, float* acc, int64_t pf, bool wide) {
  int64_t c = 0;
  if (wide)
    for (; d - c >= 24 && d - c != 32; c += 24) pv_strip<DT, RB, 3>(p, ld, v, kv_stride, nk, c, acc, d, pf);
  for (; d - c >= 16; c += 16) pv_strip<DT, RB, 2>(p, ld, v, kv_stride, nk, c, acc, d, pf);
  if (c < d) pv_strip<DT, RB, 1>(p, ld, v, kv_stride, nk, c, acc, d, pf);
}

// ---- Lanes kernel: blocks of 8 query rows, scores as [key][8 rows] ----
//
// For blocks of >= 8 rows (G = 8 or 16 at decode, prompts of any G) the keys
// go in small blocks that stay in L1, and each block is finished before the
// next is read: scores (4 rows x 3 keys of accumulators, as in the row
// kernel, reduced straight into one vector of 8 rows per key), the online
// softmax on whole vectors (one max, one exp per key for all 8 rows), then
// P*V. One pass over K and V instead of three, so the reads stream under the
// FMAs. (Scores as broadcast(k[c]) * q^T[c] -- no reductions at all -- ran
// at 1/3 of the FMA rate on Zen 3: its broadcasts from memory bound it.)
constexpr int64_t kLaneKeys = 16;  // keys per block: scores, softmax, P*V (12..24 measured alike)

// A run of bytes to prefetch in address order, one line per next(): the
// L2 stream prefetcher follows an ascending run of requests and goes on
// ahead of it, where lines requested key by key (a 512-byte stride, then
// back) left it behind.
struct PrefetchRun {
  const char* p = nullptr;
  const char* end = nullptr;
  HINAMOE_AVX2_INLINE void next() {
    if (p < end) {
      pf_line(p);
      p += 64;
    }
  }
  HINAMOE_AVX2_INLINE void rest() {
    for (; p < end; p += 64) pf_line(p);
  }
};

// sp[kk*8 + r] = q_r . k_kk for 4 rows and KB keys; one line of `run` per
// 64 bytes of each key row when run is set.
template <DType DT, int KB>
HINAMOE_AVX2_INLINE void lane_scores(const float* q, int64_t d, const typename Elem<DT>::T* k, int64_t kv_stride,
                                     float* sp, PrefetchRun* run, int64_t pf_every) {
  using E = typename Elem<DT>::T;
  __m256 s[4][KB];
  for (int r = 0; r < 4; ++r)
    for (int kk = 0; kk < KB; ++kk) s[r][kk] = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; c += 8) {
    if (run && ((c * int64_t(sizeof(E))) & (pf_every - 1)) == 0)  // pf_every: a power of 2
      for (int kk = 0; kk < KB; ++kk) run->next();
    __m256 kv[KB];
    for (int kk = 0; kk < KB; ++kk) kv[kk] = load8<DT>(k + kk * kv_stride + c);
    for (int r = 0; r < 4; ++r) {
      const __m256 x = _mm256_loadu_ps(q + r * d + c);
      for (int kk = 0; kk < KB; ++kk) s[r][kk] = _mm256_fmadd_ps(x, kv[kk], s[r][kk]);
    }
  }
  for (int kk = 0; kk < KB; ++kk) {
    const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(s[0][kk], s[1][kk]), _mm256_hadd_ps(s[2][kk], s[3][kk]));
    _mm_storeu_ps(sp + kk * 8, _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
  }
}

// Scores of nk keys for 4 rows: 3 keys at a time, then 2 / 1 (a last 4 as
// 2 + 2: one key alone has too few FMA chains to hide their latency).
template <DType DT>
HINAMOE_AVX2_INLINE void lane_scores_block(const float* q, int64_t d, const typename Elem<DT>::T* k,
                                           int64_t kv_stride, int64_t nk, float* sp, PrefetchRun* run,
                                           int64_t pf_every) {
  const int64_t triples = nk % 3 == 1 && nk >= 4 ? (nk - 4) / 3 : nk / 3;
  int64_t j = 0;
  for (; j < 3 * triples; j += 3) lane_scores<DT, 3>(q, d, k + j * kv_stride, kv_stride, sp + j * 8, run, pf_every);
  for (; j + 2 <= nk; j += 2) lane_scores<DT, 2>(q, d, k + j * kv_stride, kv_stride, sp + j * 8, run, pf_every);
  if (j < nk) lane_scores<DT, 1>(q, d, k + j * kv_stride, kv_stride, sp + j * 8, run, pf_every);
}

// acc[i*d + c + :8*NV] += sum_j p[j*8 + i] * v_j[c + :8*NV] for rows i in
// [0, 4): 4 x NV accumulators; one line of `run` per key when run is set.
template <DType DT, int NV>
HINAMOE_AVX2_INLINE void lane_pv_strip(const float* p, const typename Elem<DT>::T* v, int64_t kv_stride, int64_t nk,
                                       int64_t c, float* acc, int64_t d, PrefetchRun* run, int64_t pf_mask) {
  using E = typename Elem<DT>::T;
  __m256 a[4][NV];
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < NV; ++i) a[r][i] = _mm256_loadu_ps(acc + r * d + c + 8 * i);
  const E* vj = v + c;
  for (int64_t j = 0; j < nk; ++j, vj += kv_stride, p += 8) {
    if (run && (j & pf_mask) == 0) run->next();
    __m256 x[NV];
    for (int i = 0; i < NV; ++i) x[i] = load8<DT>(vj + 8 * i);
    for (int r = 0; r < 4; ++r) {
      const __m256 w = _mm256_broadcast_ss(p + r);
      for (int i = 0; i < NV; ++i) a[r][i] = _mm256_fmadd_ps(w, x[i], a[r][i]);
    }
  }
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < NV; ++i) _mm256_storeu_ps(acc + r * d + c + 8 * i, a[r][i]);
}

// P*V of one block for 4 rows (p = the block's weights at lane offset r):
// strips of 24 columns, then 16 / 8.
template <DType DT>
HINAMOE_AVX2_INLINE void lane_pv_rows4(const float* p, const typename Elem<DT>::T* v, int64_t kv_stride, int64_t nk,
                                       int64_t d, float* acc, PrefetchRun* run, int64_t pf_mask) {
  int64_t c = 0;
  for (; d - c >= 24 && d - c != 32; c += 24) lane_pv_strip<DT, 3>(p, v, kv_stride, nk, c, acc, d, run, pf_mask);
  for (; d - c >= 16; c += 16) lane_pv_strip<DT, 2>(p, v, kv_stride, nk, c, acc, d, run, pf_mask);
  if (c < d) lane_pv_strip<DT, 1>(p, v, kv_stride, nk, c, acc, d, run, pf_mask);
}

// m, l of a group's rows: 8 or 4 floats (no masked moves: their stores are
// slow on AMD; lanes 4..7 of a 4-row group read as 0 and are dropped).
template <int R>
HINAMOE_AVX2_INLINE __m256 load_rows(const float* p) {
  if constexpr (R == 8) return _mm256_loadu_ps(p);
  else return _mm256_insertf128_ps(_mm256_setzero_ps(), _mm_loadu_ps(p), 0);
}
template <int R>
HINAMOE_AVX2_INLINE void store_rows(float* p, __m256 v) {
  if constexpr (R == 8) _mm256_storeu_ps(p, v);
  else _mm_storeu_ps(p, _mm256_castps256_ps128(v));
}

// Rows [r0, r0 + R*groups) of the chunk against keys [k0, k1), R = 8 or 4
// rows (one group) per vector (R = 4 leaves lanes 4..7 unused). sp:
// 8*kLaneKeys floats (a block's scores, then weights, as [key][8]).
template <DType DT, int R>
HINAMOE_AVX2_FN void chunk_lanes(const GqaChunkArgs& a, int64_t r0, int64_t groups, float* sp) {
  static_assert(R == 8 || R == 4, "lane groups are 8 or 4 rows");
  using E = typename Elem<DT>::T;
  const int64_t d = a.d, nrows = R * groups;
  int64_t j0 = a.k1, j1 = a.k0, all_lo = a.k0, all_hi = a.k1;
  for (int64_t r = r0; r < r0 + nrows; ++r) {
    j0 = std::min(j0, std::max(a.k0, a.lo[r]));
    j1 = std::max(j1, std::min(a.k1, a.hi[r]));
    all_lo = std::max(all_lo, a.lo[r]);
    all_hi = std::min(all_hi, a.hi[r]);
  }
  if (j0 >= j1) return;
  const bool exact = a.softcap > 0.0f || a.bias != nullptr;  // per-element work on the scores
  const int64_t es = int64_t(sizeof(E)), row_bytes = d * es, stride_bytes = a.kv_stride * es;
  const int64_t pf = gqa_avx2_knobs().prefetch_keys * stride_bytes;  // bytes ahead
  // With two 4-row halves, each half issues half of the block's prefetches:
  // evenly spread requests kept the reads streaming under the FMAs (bunched
  // ones stalled them).
  const bool spread = R == 8;
  const __m256 neg_inf = _mm256_set1_ps(kNegInf), pos_inf = _mm256_set1_ps(kInf);
  if (R == 4) std::fill(sp, sp + 8 * kLaneKeys, 0.0f);  // lanes 4..7: finite, never used
  if (pf > 0 && gqa_avx2_knobs().prefetch_start) {
    // The first `pf` bytes of K and V, which the running prefetch (pf ahead
    // of each block) never covers: requested at once rather than missed key
    // by key while the stream ramps up.
    const int64_t span = std::min(pf, (j1 - j0 - 1) * stride_bytes + row_bytes);
    const char* k0 = static_cast<const char*>(a.k) + j0 * stride_bytes;
    const char* v0 = static_cast<const char*>(a.v) + j0 * stride_bytes;
    for (int64_t off = 0; off < span; off += 64) {
      pf_line(k0 + off);
      pf_line(v0 + off);
    }
  }
  for (int64_t jb = j0; jb < j1; jb += kLaneKeys) {
    const int64_t nb = std::min(kLaneKeys, j1 - jb);
    const E* kb = static_cast<const E*>(a.k) + jb * a.kv_stride;
    const E* vb = static_cast<const E*>(a.v) + jb * a.kv_stride;
    // The block's K and V rows `pf` bytes on, in address order.
    PrefetchRun pfk, pfv;
    if (pf > 0) {
      const int64_t span = (nb - 1) * stride_bytes + row_bytes;
      pfk.p = reinterpret_cast<const char*>(kb) + pf;
      pfk.end = pfk.p + span;
      pfv.p = reinterpret_cast<const char*>(vb) + pf;
      pfv.end = pfv.p + span;
    }
    const bool masked = jb < all_lo || jb + nb > all_hi;
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t rg = r0 + g * R;
      const float* q = a.q + rg * d;
      lane_scores_block<DT>(q, d, kb, a.kv_stride, nb, sp, g == 0 ? &pfk : nullptr, spread ? 128 : 64);
      if (R == 8)
        lane_scores_block<DT>(q + 4 * d, d, kb, a.kv_stride, nb, sp + 4, g == 0 && spread ? &pfk : nullptr, 128);
      if (exact || masked) {
        for (int64_t i = 0; i < R; ++i) {
          const int64_t lo = a.lo[rg + i], hi = a.hi[rg + i];
          for (int64_t kk = 0; kk < nb; ++kk) {
            const int64_t j = jb + kk;
            float& x = sp[kk * 8 + i];
            if (j < lo || j >= hi) {
              x = kNegInf;
              continue;
            }
            if (a.softcap > 0.0f) x = a.softcap * std::tanh(x / a.softcap);
            if (a.bias) x += a.bias[rg + i][j];
          }
        }
      }
      // Online softmax on whole vectors: new max, rescale, weights. `bad`:
      // rows with a NaN or +inf score (now or before: m NaN), which the
      // driver recomputes; max and exp here would drop the NaN.
      const __m256 m_old = load_rows<R>(a.m + rg);
      __m256 bm = neg_inf, bad = _mm256_cmp_ps(m_old, m_old, _CMP_UNORD_Q);
      for (int64_t kk = 0; kk < nb; ++kk) {
        const __m256 x = _mm256_loadu_ps(sp + kk * 8);
        bm = _mm256_max_ps(bm, x);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(x, pos_inf, _CMP_NLT_UQ));
      }
      const __m256 m_new = _mm256_max_ps(m_old, bm);
      __m256 l = load_rows<R>(a.l + rg);
      const __m256 up = _mm256_cmp_ps(m_new, m_old, _CMP_GT_OQ);
      if ((_mm256_movemask_ps(up) & ((1 << R) - 1)) != 0) {
        // Rows whose max rose: acc and l scale by exp(m_old - m_new) (0 when
        // m_old is -inf: they are 0 then anyway).
        const __m256 f = _mm256_blendv_ps(_mm256_set1_ps(1.0f), exp_nonpos(_mm256_sub_ps(m_old, m_new)), up);
        l = _mm256_mul_ps(l, f);
        alignas(32) float fr[8];
        _mm256_store_ps(fr, f);
        for (int64_t i = 0; i < R; ++i) {
          if (fr[i] == 1.0f) continue;
          float* acc = a.acc + (rg + i) * d;
          const __m256 fv = _mm256_set1_ps(fr[i]);
          for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(acc + c, _mm256_mul_ps(fv, _mm256_loadu_ps(acc + c)));
        }
        store_rows<R>(a.m + rg, m_new);
      }
      // Rows that saw only -inf so far subtract 0: their weights stay 0.
      const __m256 msub = _mm256_blendv_ps(m_new, _mm256_setzero_ps(), _mm256_cmp_ps(m_new, neg_inf, _CMP_EQ_OQ));
      for (int64_t kk = 0; kk < nb; ++kk) {
        const __m256 e = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(sp + kk * 8), msub));
        _mm256_storeu_ps(sp + kk * 8, e);
        l = _mm256_add_ps(l, e);
      }
      store_rows<R>(a.l + rg, l);
      if (const int nan_rows = _mm256_movemask_ps(bad) & ((1 << R) - 1))
        for (int64_t i = 0; i < R; ++i)
          if (nan_rows >> i & 1) a.m[rg + i] = std::numeric_limits<float>::quiet_NaN();
      lane_pv_rows4<DT>(sp, vb, a.kv_stride, nb, d, a.acc + rg * d, g == 0 ? &pfv : nullptr, spread ? 1 : 0);
      if (R == 8)
        lane_pv_rows4<DT>(sp + 4, vb, a.kv_stride, nb, d, a.acc + (rg + 4) * d, g == 0 && spread ? &pfv : nullptr, 1);
      if (g == 0) {
        pfk.rest();
        pfv.rest();
      }
    }
  }
}

// The row kernel (blocks of 4 rows): what runs for fewer than 8 rows.
template <DType DT>
HINAMOE_AVX2_FN void chunk_rows(const GqaChunkArgs& a) {
  using E = typename Elem<DT>::T;
  const int64_t d = a.d;
  // The block's key range: the union of the rows' visible ranges in the chunk.
  int64_t j0 = a.k1, j1 = a.k0;
  for (int64_t r = 0; r < a.rows; ++r) {
    j0 = std::min(j0, std::max(a.k0, a.lo[r]));
    j1 = std::max(j1, std::min(a.k1, a.hi[r]));
  }
  if (j0 >= j1) return;
  const int64_t nk = j1 - j0, ld = nk;
  float* sc = a.scratch;
  const E* k = static_cast<const E*>(a.k) + j0 * a.kv_stride;
  const E* v = static_cast<const E*>(a.v) + j0 * a.kv_stride;

  // Software prefetch of the next piece's K and V rows (the same offsets one
  // piece further): the hardware prefetcher alone left DRAM streams at ~1/3
  // of the read bandwidth at long contexts. Prefetching past the buffer's
  // end is harmless (no fault).
  const int64_t pf = nk * a.kv_stride;
  // Blocks of 12 accumulators (4 rows x 3 keys, 4 rows x 24 columns) when the
  // block has >= 8 rows (G >= 8): K and V are then read twice per piece (the
  // second time from L2) and the FMAs bound the time (1 thread, 32/4 heads,
  // data in L3: 11.7 -> 13.6 GB/s). With fewer rows the loads from DRAM bound
  // it and the 8-accumulator blocks streamed ~10% faster at 32K context.
  const bool wide = a.rows >= 8;
  int64_t r = 0;
  for (; r + 4 <= a.rows; r += 4) scores_block<DT, 4>(a.q + r * d, d, k, a.kv_stride, nk, sc + r * ld, ld, pf, wide);
  switch (a.rows - r) {
    case 3: scores_block<DT, 3>(a.q + r * d, d, k, a.kv_stride, nk, sc + r * ld, ld, pf, wide); break;
    case 2: scores_block<DT, 2>(a.q + r * d, d, k, a.kv_stride, nk, sc + r * ld, ld, pf, wide); break;
    case 1: scores_block<DT, 1>(a.q + r * d, d, k, a.kv_stride, nk, sc + r * ld, ld, pf, wide); break;
    default: break;
  }

  // Softcap, bias, mask; then the online-softmax update of each row.
  for (r = 0; r < a.rows; ++r) {
    float* s = sc + r * ld;
    const int64_t vis0 = std::max(j0, a.lo[r]) - j0, vis1 = std::min(j1, a.hi[r]) - j0;
    if (a.softcap > 0.0f)
      for (int64_t j = vis0; j < vis1; ++j) s[j] = a.softcap * std::tanh(s[j] / a.softcap);
    if (a.bias) {
      const float* bias = a.bias[r] + j0;
      for (int64_t j = vis0; j < vis1; ++j) s[j] += bias[j];
    }
    bool bad = std::isnan(a.m[r]);  // flagged by an earlier call
    for (int64_t j = vis0; j < vis1; ++j) bad |= !(s[j] < kInf);  // NaN or +inf score
    if (bad) a.m[r] = std::numeric_limits<float>::quiet_NaN();  // the driver recomputes the row
    if (vis0 >= vis1 || bad) {  // row sees nothing here: weights 0, state unchanged
      std::fill(s, s + nk, 0.0f);
      continue;
    }
    std::fill(s, s + vis0, kNegInf);
    std::fill(s + vis1, s + nk, kNegInf);

    __m256 mv = _mm256_set1_ps(a.m[r]);
    int64_t j = 0;
    for (; j + 8 <= nk; j += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + j));
    float mx = hmax(mv);
    for (; j < nk; ++j) mx = std::max(mx, s[j]);
    if (mx == kNegInf) {  // every visible key masked by a -inf bias: weights 0 (ORT's output is 0)
      std::fill(s, s + nk, 0.0f);
      continue;
    }

    const float f = a.m[r] == kNegInf ? 0.0f : std::exp(a.m[r] - mx);
    const __m256 mb = _mm256_set1_ps(mx);
    __m256 lv = _mm256_setzero_ps();
    for (j = 0; j + 8 <= nk; j += 8) {
      const __m256 e = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(s + j), mb));
      _mm256_storeu_ps(s + j, e);
      lv = _mm256_add_ps(lv, e);
    }
    float l = hsum(lv);
    for (; j < nk; ++j) {
      s[j] = s[j] == kNegInf ? 0.0f : std::exp(s[j] - mx);
      l += s[j];
    }
    a.l[r] = a.l[r] * f + l;
    a.m[r] = mx;
    if (f != 1.0f) {
      float* acc = a.acc + r * d;
      const __m256 fv = _mm256_set1_ps(f);
      for (int64_t c = 0; c < d; c += 8) _mm256_storeu_ps(acc + c, _mm256_mul_ps(fv, _mm256_loadu_ps(acc + c)));
    }
  }

  for (r = 0; r + 4 <= a.rows; r += 4) pv_block<DT, 4>(sc + r * ld, ld, v, a.kv_stride, nk, d, a.acc + r * d, pf, wide);
  switch (a.rows - r) {
    case 3: pv_block<DT, 3>(sc + r * ld, ld, v, a.kv_stride, nk, d, a.acc + r * d, pf, wide); break;
    case 2: pv_block<DT, 2>(sc + r * ld, ld, v, a.kv_stride, nk, d, a.acc + r * d, pf, wide); break;
    case 1: pv_block<DT, 1>(sc + r * ld, ld, v, a.kv_stride, nk, d, a.acc + r * d, pf, wide); break;
    default: break;
  }
}

// The chunk's rows in blocks: groups of 8 rows, then one of 4, then the
// last 0..3 rows with the row kernel.
template <DType DT>
HINAMOE_AVX2_FN void chunk_avx2(const GqaChunkArgs& a) {
  if (!gqa_avx2_knobs().lanes || a.rows < 4) return chunk_rows<DT>(a);
  const int64_t g8 = a.rows / 8, g4 = (a.rows % 8) / 4;
  if (g8 > 0) chunk_lanes<DT, 8>(a, 0, g8, a.scratch);
  if (g4 > 0) chunk_lanes<DT, 4>(a, 8 * g8, 1, a.scratch);
  const int64_t done = 8 * g8 + 4 * g4;
  if (done == a.rows) return;
  GqaChunkArgs rest = a;  // the last rows % 4 rows
  rest.q = a.q + done * a.d;
  rest.rows = a.rows - done;
  rest.lo = a.lo + done;
  rest.hi = a.hi + done;
  if (a.bias) rest.bias = a.bias + done;
  rest.m = a.m + done;
  rest.l = a.l + done;
  rest.acc = a.acc + done * a.d;
  chunk_rows<DT>(rest);
}

}  // namespace

GqaAvx2Knobs& gqa_avx2_knobs() {
  static GqaAvx2Knobs k;
  return k;
}

const GqaTier& gqa_avx2_tier() {
  static const GqaTier t = [] {
    GqaTier x;
    x.name = "avx2";
    x.chunk = chunk_avx2<DType::F32>;
    x.chunk_f16 = chunk_avx2<DType::F16>;
    x.chunk_bf16 = chunk_avx2<DType::BF16>;
    return x;
  }();
  return t;
}

// No AVX-512 GQA kernel yet: the avx512 tier runs these avx2 kernels.
const GqaTier& gqa_avx512_tier() {
  static const GqaTier t = [] {
    GqaTier x = gqa_avx2_tier();
    x.name = "avx512";
    return x;
  }();
  return t;
}

}  // namespace hinamoe
