// The attention of GroupQueryAttention over the cache step's rows: (batch
// row, KV head, tile of query tokens) groups whose visible keys are split
// over several items when there are too few groups for the threads (decode
// at batch 1); each item runs the tier's chunk kernel (online softmax), a
// split group's partial states are merged with a log-sum-exp combine, and
// rows whose state is not that of finite scores take the exact path
// (gqa_exact.h).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gqa/gqa_exact.h"
#include "gqa/gqa_step.h"
#include "tuning.h"

namespace hinamoe {
namespace gqa_detail {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNegInf = -kInf;
using tuning::kGqaMinSplitKeys;
using tuning::kGqaPieceKeys;
using tuning::kGqaTileRows;

// Per-thread buffers of the attention items (grow once, reused).
struct ItemScratch {
  std::vector<int64_t> lo, hi;
  std::vector<const float*> bias;
  std::vector<float> m, l, acc, chunk;
};
ItemScratch& item_scratch() {
  static thread_local ItemScratch s;
  return s;
}

}  // namespace

void attend(const GqaShape& s, const GqaAttrs& a, const GqaTensors& t, const GqaTier& tier, const Parallel& par,
            const GqaStep& st) {
  const int64_t B = s.batch, S = s.seq, N = s.num_heads, Nkv = s.kv_num_heads, d = s.head_dim;
  const int64_t G = N / Nkv;
  const DType dt = st.dt;
  const std::vector<RowLengths>& rows = st.rows;
  const std::vector<float>& qbuf = st.q;
  const std::vector<int64_t>&v_bad_first = st.v_bad_first, &v_bad_last = st.v_bad_last;
  auto kv_rows = [&](int64_t b, int64_t h, bool value) { return st.kv_rows(b, h, value); };
  auto row_base = [&](int64_t b) { return st.row_base(b); };
  auto visible = [&](int64_t b, int64_t i, int64_t* lo, int64_t* hi) { st.visible(b, i, lo, hi); };

  // Bias and sink as float (converted once when T is f16 or bf16).
  std::vector<float> bias_f, sink_f;
  const float* bias = static_cast<const float*>(t.attention_bias);
  const float* sink = static_cast<const float*>(t.head_sink);
  if (dt != DType::F32) {
    if (t.attention_bias) {
      bias_f.resize(size_t(t.bias_batch * t.bias_heads * S * t.bias_keys));
      for (size_t i = 0; i < bias_f.size(); ++i) bias_f[i] = load_as_f32(t.attention_bias, int64_t(i), dt);
      bias = bias_f.data();
    }
    if (t.head_sink) {
      sink_f.resize(size_t(N));
      for (int64_t n = 0; n < N; ++n) sink_f[size_t(n)] = load_as_f32(t.head_sink, n, dt);
      sink = sink_f.data();
    }
  }
  const GqaChunkFn chunk = dt == DType::F16 ? tier.chunk_f16 : dt == DType::BF16 ? tier.chunk_bf16 : tier.chunk;

  // Work items. A group is (b, h, tile of query tokens); its visible keys
  //    [klo, khi) are split over several items when there are too few groups
  //    to keep the threads busy (decode at batch 1).
  const int64_t tile_tok = std::max<int64_t>(1, kGqaTileRows / G);
  const int64_t tiles = (S + tile_tok - 1) / tile_tok;
  const int64_t groups = B * Nkv * tiles;
  std::vector<int64_t> klo(groups), khi(groups), split_begin(groups + 1);
  const int64_t target = par.threads > 1 ? 4 * int64_t(par.threads) : 1;
  split_begin[0] = 0;
  for (int64_t gi = 0; gi < groups; ++gi) {
    const int64_t b = gi / (Nkv * tiles), tile = gi % tiles;
    const int64_t i0 = tile * tile_tok, i1 = std::min(S, i0 + tile_tok) - 1;
    int64_t lo0, hi0, lo1, hi1;
    visible(b, i0, &lo0, &hi0);
    visible(b, i1, &lo1, &hi1);
    klo[gi] = lo0;
    khi[gi] = hi1;
    const int64_t keys = khi[gi] - klo[gi];
    int64_t splits = 1;
    if (groups < target) {
      splits = std::min((target + groups - 1) / groups, (keys + kGqaMinSplitKeys - 1) / kGqaMinSplitKeys);
      splits = std::max<int64_t>(1, splits);
    }
    split_begin[gi + 1] = split_begin[gi] + splits;
  }
  const int64_t items = split_begin[groups];
  const int64_t tile_rows_max = tile_tok * G;
  const int64_t state_floats = tile_rows_max * (d + 2);
  std::vector<float> partial(items > groups ? size_t(items * state_floats) : 0);

  // Row r of a tile = token i0 + r / G, head h*G + r % G.
  // Bias columns are absolute positions; the kernels index them by cache row.
  auto bias_row = [&](int64_t b, int64_t n, int64_t i) {
    const int64_t bb = t.bias_batch > 1 ? b : 0, bn = t.bias_heads > 1 ? n : 0;
    return bias + ((bb * t.bias_heads + bn) * S + i) * t.bias_keys + row_base(b);
  };
  const bool use_sink = t.head_sink != nullptr || a.smooth_softmax;
  // A row leaves the fast path when its state is not that of finite scores
  // over >= 1 visible key with finite sums (gqa_exact.h says which cases):
  // m NaN (a kernel saw a NaN or +inf score) or -inf (all masked), l or acc
  // not finite, a NaN or +inf sink, or a non-finite hidden V row of a prompt.
  auto finalize = [&](int64_t b, int64_t h, int64_t i0, int64_t nrows, const float* m, const float* l,
                      const float* acc) {
    for (int64_t r = 0; r < nrows; ++r) {
      const int64_t i = i0 + r / G, n = h * G + r % G;
      const int64_t o = ((b * S + i) * N + n) * d;
      const float* ar = acc + r * d;
      int64_t lo, hi;
      visible(b, i, &lo, &hi);
      const float sk = sink ? sink[n] : 0.0f;
      const size_t bh = size_t(b * Nkv + h);
      const int64_t rb = row_base(b);  // v_bad_* are positions, lo/hi cache rows
      bool exact = !std::isfinite(m[r]) || !std::isfinite(l[r]) || (use_sink && !(sk < kInf)) ||
                   v_bad_last[bh] >= hi + rb || (v_bad_first[bh] >= 0 && v_bad_first[bh] < lo + rb);
      for (int64_t j = 0; j < d; ++j) exact |= !(std::fabs(ar[j]) <= std::numeric_limits<float>::max());
      if (exact) {
        GqaExactRow er;
        er.q = qbuf.data() + (((b * Nkv + h) * S + i) * G + r % G) * d;
        er.d = d;
        er.k = kv_rows(b, h, false);
        er.v = kv_rows(b, h, true);
        er.dt = dt;
        er.lo = lo;
        er.hi = hi;
        er.total = rows[b].total - rb;
        er.fresh = rows[b].past - rb;
        if (bias) er.bias = bias_row(b, n, i);
        er.softcap = a.softcap;
        er.has_sink = use_sink;
        er.sink = sk;
        std::vector<float> ex(static_cast<size_t>(d));
        gqa_exact_row(er, ex.data());
        for (int64_t j = 0; j < d; ++j) store_from_f32(t.output, o + j, dt, ex[size_t(j)]);
        continue;
      }
      float scale_acc = 1.0f, denom = l[r];
      if (use_sink) {
        const float M = std::max(m[r], sk);
        scale_acc = std::exp(m[r] - M);
        denom = l[r] * scale_acc + std::exp(sk - M);
      }
      const float f = scale_acc / denom;
      if (dt == DType::F32) {
        float* of = static_cast<float*>(t.output) + o;
        for (int64_t j = 0; j < d; ++j) of[j] = ar[j] * f;
      } else {
        for (int64_t j = 0; j < d; ++j) store_from_f32(t.output, o + j, dt, ar[j] * f);
      }
    }
  };

  // Log-sum-exp merge of a split group's partial states, run by whichever
  // item of the group finishes last (no extra pass over the pool).
  std::vector<std::atomic<int>> splits_done(items > groups ? size_t(groups) : 0);
  auto merge = [&](int64_t gi) {
    const int64_t splits = split_begin[gi + 1] - split_begin[gi];
    const int64_t b = gi / (Nkv * tiles), h = (gi / tiles) % Nkv, tile = gi % tiles;
    const int64_t i0 = tile * tile_tok, nrows = (std::min(S, i0 + tile_tok) - i0) * G;
    ItemScratch& sc = item_scratch();
    sc.m.assign(nrows, kNegInf);
    sc.l.assign(nrows, 0.0f);
    sc.acc.assign(size_t(nrows * d), 0.0f);
    for (int64_t p = 0; p < splits; ++p) {
      const float* st = partial.data() + (split_begin[gi] + p) * state_floats;
      for (int64_t r = 0; r < nrows; ++r) {
        const float mp = st[r];
        if (std::isnan(mp) || std::isnan(sc.m[r])) {  // a NaN / +inf score: the row goes exact
          sc.m[r] = std::numeric_limits<float>::quiet_NaN();
          continue;
        }
        const float* pa = st + 2 * nrows + r * d;
        if (mp == kNegInf) {  // nothing visible there but masked keys: only a NaN from 0 x Inf matters
          bool finite = true;
          for (int64_t j = 0; j < d; ++j) finite &= std::isfinite(pa[j]);
          if (!finite) sc.m[r] = std::numeric_limits<float>::quiet_NaN();
          continue;
        }
        const float M = std::max(sc.m[r], mp);
        const float fo = sc.m[r] == kNegInf ? 0.0f : std::exp(sc.m[r] - M), fp = std::exp(mp - M);
        sc.l[r] = sc.l[r] * fo + st[nrows + r] * fp;
        float* acc = sc.acc.data() + r * d;
        for (int64_t j = 0; j < d; ++j) acc[j] = acc[j] * fo + pa[j] * fp;
        sc.m[r] = M;
      }
    }
    finalize(b, h, i0, nrows, sc.m.data(), sc.l.data(), sc.acc.data());
  };

  par.for_each(size_t(items), [&](size_t item) {
    const int64_t gi = int64_t(std::upper_bound(split_begin.begin(), split_begin.end(), int64_t(item)) -
                               split_begin.begin()) - 1;
    const int64_t part = int64_t(item) - split_begin[gi], splits = split_begin[gi + 1] - split_begin[gi];
    const int64_t b = gi / (Nkv * tiles), h = (gi / tiles) % Nkv, tile = gi % tiles;
    const int64_t i0 = tile * tile_tok, ntok = std::min(S, i0 + tile_tok) - i0, nrows = ntok * G;
    // Even split of the group's keys, boundaries on multiples of 8.
    const int64_t keys = khi[gi] - klo[gi];
    auto bound = [&](int64_t p) {
      if (p >= splits) return khi[gi];
      return std::min(khi[gi], klo[gi] + ((keys * p / splits) & ~int64_t(7)));
    };
    const int64_t a0 = bound(part), a1 = bound(part + 1);

    ItemScratch& sc = item_scratch();
    sc.lo.resize(nrows);
    sc.hi.resize(nrows);
    sc.bias.resize(nrows);
    sc.m.assign(nrows, kNegInf);
    sc.l.assign(nrows, 0.0f);
    sc.acc.assign(size_t(nrows * d), 0.0f);
    sc.chunk.resize(size_t(gqa_chunk_scratch_floats(nrows, kGqaPieceKeys)));
    for (int64_t r = 0; r < nrows; ++r) {
      const int64_t i = i0 + r / G, n = h * G + r % G;
      visible(b, i, &sc.lo[r], &sc.hi[r]);
      if (bias) sc.bias[r] = bias_row(b, n, i);
    }
    GqaChunkArgs ca;
    ca.q = qbuf.data() + ((b * Nkv + h) * S + i0) * G * d;
    ca.rows = nrows;
    ca.d = d;
    ca.k = kv_rows(b, h, false);
    ca.v = kv_rows(b, h, true);
    ca.kv_stride = d;
    ca.lo = sc.lo.data();
    ca.hi = sc.hi.data();
    ca.bias = bias ? sc.bias.data() : nullptr;
    ca.softcap = a.softcap;
    ca.m = sc.m.data();
    ca.l = sc.l.data();
    ca.acc = sc.acc.data();
    ca.scratch = sc.chunk.data();
    for (int64_t k0 = a0; k0 < a1; k0 += kGqaPieceKeys) {
      ca.k0 = k0;
      ca.k1 = std::min(a1, k0 + kGqaPieceKeys);
      ca.same_q = k0 > a0;
      chunk(ca);
    }
    if (splits == 1) {
      finalize(b, h, i0, nrows, sc.m.data(), sc.l.data(), sc.acc.data());
    } else {
      float* st = partial.data() + item * state_floats;
      std::memcpy(st, sc.m.data(), sizeof(float) * nrows);
      std::memcpy(st + nrows, sc.l.data(), sizeof(float) * nrows);
      std::memcpy(st + 2 * nrows, sc.acc.data(), sizeof(float) * nrows * d);
      if (splits_done[size_t(gi)].fetch_add(1, std::memory_order_acq_rel) + 1 == splits) merge(gi);
    }
  });

}

}  // namespace gqa_detail
}  // namespace hinamoe
