// The software prefetch of the row-streaming micro-kernels (gemm_rows_avx2.cc,
// gemm_rows_avx512.cc), by the size of a call's block of R rows:
//  * contiguous and <= LinMax KiB (short rows): the next block, as one linear
//    stream, as many bytes per step as the step reads (per-row prefetch left
//    each block's first lines cold: K = 768 bf16 streamed 20-40% slower),
//    into L2 (into L1 up to 24 KiB measured 25-50% slower at 2-4 tokens on
//    Zen 5: hina-bench ffn A/B against ggml, 2026-12-04);
//  * else per row, Dist bytes ahead into Hint, running on past the row's end
//    into the same row of the next block (the next micro-kernel call).
// Each tier passes its own knobs (HINAMOE_PF_* / HINAMOE_AVX512_PF_*, and why
// their defaults: see there). _mm_prefetch is SSE, so this holds no code
// beyond baseline x86-64 and inlines into either tier's target functions.
#pragma once

#include <xmmintrin.h>

#include <cstdint>

namespace hinamoe {

template <class E, int R, int64_t StepElems, int64_t Dist, int Hint, int64_t LinMaxKiB>
struct WeightPrefetch {
  static constexpr int64_t step_bytes = R * StepElems * int64_t(sizeof(E));
  static constexpr int64_t ahead = Dist / int64_t(sizeof(E));
  const E* w;
  int64_t K, ldw;
  const char* next_block;
  bool lin;  // the next block linearly, else per row

  __attribute__((always_inline)) WeightPrefetch(const E* w_, int64_t K_, int64_t ldw_)
      : w(w_), K(K_), ldw(ldw_), next_block(reinterpret_cast<const char*>(w_ + R * ldw_)) {
    const int64_t block_bytes = R * K * int64_t(sizeof(E));
    lin = ldw == K && block_bytes <= LinMaxKiB * 1024;
  }

  // Before the step that reads elements [k, k + StepElems) of the rows.
  __attribute__((always_inline)) void before(int64_t k) const {
    if (lin) {
      const int64_t off = (k / StepElems) * step_bytes;
      const char* pn = next_block + off;
      // Steps under a line (few rows of 16-bit weights): once per line.
      for (int64_t b = 0; b < step_bytes && (step_bytes >= 64 || (off & 63) < step_bytes); b += 64)
        _mm_prefetch(pn + b, _MM_HINT_T1);
    } else if (Dist > 0 && ((k * int64_t(sizeof(E))) & 63) == 0) {
      const E* pf = k + ahead < K ? w + k + ahead : w + R * ldw + (k + ahead - K);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) _mm_prefetch(reinterpret_cast<const char*>(pf + r * ldw), _mm_hint(Hint));
    }
  }
};

}  // namespace hinamoe
