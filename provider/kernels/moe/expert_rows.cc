// The float weight format of the expert pipeline (expert_pipeline.h): the
// row-streaming tiers (ref, avx2, avx512, and the f32/f16 weights of the AMX
// tiers) multiply the tokens by the weight rows in place with the tier's
// gemm_rows; on more than one NUMA node, over each node's local segments of
// the rows (segment tables from the plan cache).
#include <cstring>
#include <memory>

#include "../aligned_buffer.h"
#include "../numa/segment_table.h"
#include "../scratch.h"
#include "../tuning.h"
#include "expert_pipeline.h"

namespace hinamoe {
namespace detail {
namespace {

// One node's partial of rows [r0, r1) of W [*, K]:
//   P[m*ldp + (r - r0)] = sum over the node's segments (r, k0, k1) of
//                         sum_{k in [k0, k1)} W[r*K + k] * X[m*ldx + k]
// (0 for rows without a local segment). Rows r and r + Tx (Tx = the table's
// period) have the same segments, so each segment of a residue row is one
// strided GEMM over the rows r, r + Tx, ... < r1 (ldw = Tx*K): straight into
// P when Tx == 1 and the row has one segment, else via tmp.
void node_partial(const numa::SegmentTable& tb, int node, const KernelTier& tier, DType dt, const void* W,
                  int64_t K, int64_t r0, int64_t r1, const float* X, int64_t ldx, int64_t M, float* P, int64_t ldp,
                  std::vector<float>& tmp) {
  if (M <= 0 || r1 <= r0) return;
  const size_t es = dtype_size(dt);
  const char* w = static_cast<const char*>(W);
  const GemmRowsStridedFn strided = tier.gemm_rows_strided[int(dt)];
  const GemmRowsFn rows = tier.gemm_rows[int(dt)];
  // out[m*ldo + i] = segment dot of row r + i*step, i < cnt.
  auto seg = [&](int64_t r, int64_t step, int64_t cnt, int64_t k0, int64_t k1, float* out, int64_t ldo) {
    const char* wp = w + size_t(r * K + k0) * es;
    if (strided != nullptr) {
      strided(wp, step * K, k1 - k0, 0, cnt, X + k0, ldx, M, out, ldo);
    } else {
      for (int64_t i = 0; i < cnt; ++i) rows(wp + size_t(i * step * K) * es, k1 - k0, 0, 1, X + k0, ldx, M, out + i, ldo);
    }
  };
  const int64_t Tx = std::max<int64_t>(1, tb.period_rows);
  const bool have = node < tb.nodes;
  const int64_t rlim = std::min(r1, r0 + Tx);  // one row per residue class present in [r0, r1)
  for (int64_t r = r0; r < rlim; ++r) {
    const int64_t rho = r % Tx;
    const int64_t s0 = have ? tb.row_begin[size_t(node)][size_t(rho)] : 0;
    const int64_t s1 = have ? tb.row_begin[size_t(node)][size_t(rho) + 1] : 0;
    const int64_t cnt = (r1 - r + Tx - 1) / Tx;
    if (Tx == 1 && s1 - s0 == 1) {
      const numa::Segment& sg = tb.segments[size_t(node)][size_t(s0)];
      seg(r, 1, cnt, sg.k_start, sg.k_end, P + (r - r0), ldp);
      continue;
    }
    if (s1 == s0) {
      for (int64_t m = 0; m < M; ++m)
        for (int64_t i = 0; i < cnt; ++i) P[m * ldp + (r - r0) + i * Tx] = 0.0f;
      continue;
    }
    if (tmp.size() < size_t(M * cnt)) tmp.resize(size_t(M * cnt));
    for (int64_t si = s0; si < s1; ++si) {
      const numa::Segment& sg = tb.segments[size_t(node)][size_t(si)];
      seg(r, Tx, cnt, sg.k_start, sg.k_end, tmp.data(), cnt);
      for (int64_t m = 0; m < M; ++m) {
        float* p = P + m * ldp + (r - r0);
        const float* q = tmp.data() + m * cnt;
        if (si == s0) {
          for (int64_t i = 0; i < cnt; ++i) p[i * Tx] = q[i];
        } else {
          for (int64_t i = 0; i < cnt; ++i) p[i * Tx] += q[i];
        }
      }
    }
  }
}

// The float weights of one call: tokens xs (or xs16) and activations act (or
// act16) as rows of scratch; with `pairs`, bf16 rows on the tier's bf16-pair
// kernel.
struct RowsFormat {
  RowsFormat(const KernelTier& tier_, const ExpertDims& d, const MoETensors& t)
      : tier(tier_),
        dt(t.dtype),
        es(dtype_size(t.dtype)),
        H(d.H),
        I(d.I),
        F1(d.F1),
        fc1(static_cast<const char*>(t.fc1_w)),
        fc3(static_cast<const char*>(t.fc3_w)),
        fc2(static_cast<const char*>(t.fc2_w)),
        rows(tier_.gemm_rows[int(t.dtype)]) {}

  const KernelTier& tier;
  DType dt;
  size_t es;
  int64_t H, I, F1;
  const char *fc1, *fc3, *fc2;
  GemmRowsFn rows;
  GemmRowsBf16Fn pairs = nullptr;
  const float* xs = nullptr;  // gathered tokens [R, ldx]
  const uint16_t* xs16 = nullptr;
  int64_t ldx = 0;
  float* act = nullptr;  // activations [R, lda]
  uint16_t* act16 = nullptr;
  int64_t lda = 0;
  std::vector<std::shared_ptr<const numa::SegmentTable>> tabs[3];  // fc1, fc3, fc2 (NUMA: [E] each)

  const char* weight(int fc, int64_t e) const {
    return fc == 1 ? fc1 + e * F1 * H * es : fc == 3 ? fc3 + e * I * H * es : fc2 + e * H * I * es;
  }
  void gemm(int fc, int64_t e, int64_t r0, int64_t r1, int64_t p0, int64_t M, float* Y, int64_t ldy) const {
    const char* w = weight(fc, e);
    const bool down = fc == 2;
    if (pairs != nullptr) {
      pairs(reinterpret_cast<const uint16_t*>(w), down ? I : H, r0, r1, down ? act16 + p0 * lda : xs16 + p0 * ldx,
            down ? lda : ldx, M, Y, ldy);
    } else {
      rows(w, down ? I : H, r0, r1, down ? act + p0 * lda : xs + p0 * ldx, down ? lda : ldx, M, Y, ldy);
    }
  }
  void prepare_numa(NumaRun& nr, int64_t e) {
    tabs[0][size_t(e)] = weight_table(nr, weight(1, e), F1, H, dt);
    if (fc3 != nullptr) tabs[1][size_t(e)] = weight_table(nr, weight(3, e), I, H, dt);
    tabs[2][size_t(e)] = weight_table(nr, weight(2, e), H, I, dt);
  }
  void node_gemm(int node, int fc, int64_t e, int64_t r0, int64_t r1, int64_t p0, int64_t M, float* Y, int64_t ldy,
                 std::vector<float>& tmp) const {
    const bool down = fc == 2;
    node_partial(*tabs[fc == 1 ? 0 : fc == 3 ? 1 : 2][size_t(e)], node, tier, dt, weight(fc, e), down ? I : H, r0,
                 r1, down ? act + p0 * lda : xs + p0 * ldx, down ? lda : ldx, M, Y, ldy, tmp);
  }
  void put(int64_t p, int64_t j, float v) const {
    if (act16 != nullptr) act16[p * lda + j] = f32_to_bf16(v);
    else act[p * lda + j] = v;
  }
  void activations_done(int64_t) const {}
};

}  // namespace

void expert_outputs_rows(const MoEShape& shape, const MoEAttrs& at, const MoETensors& t, int64_t t0,
                         const Routes& routes, const KernelTier& tier, const Parallel& par, NumaRun* nr,
                         std::vector<float>* y_out) {
  const ExpertDims d(shape, at);
  const int64_t H = d.H, I = d.I, E = d.E;
  const DType dt = t.dtype;
  const size_t es = dtype_size(dt);
  const int64_t R = routes.count();
  const int64_t* begin = routes.expert_begin.data();
  int64_t active = 0;
  for (int64_t e = 0; e < E; ++e) active += begin[e + 1] > begin[e];
  // bf16 experts on a tier that multiplies bf16 pairs keep the tokens and the
  // activations as bf16 rows (the activations rounded once, as on the AMX
  // tiers' tiles) where there are enough tokens per expert to be compute-bound.
  const GemmRowsBf16Fn pairs = dt == DType::BF16 && nr == nullptr && R >= tuning::kPairsMinTokensPerExpert * active
                                   ? tier.gemm_rows_bf16
                                   : nullptr;

  // xs: gathered inputs [R, ldx]; act: activations [R, lda]; y: the
  // per-route down outputs [R, H]. y is its own buffer: with gate/up and down
  // in one pass, an expert's down items write while other experts' gate/up
  // items still read their inputs. With `pairs`, xs16 / act16 (bf16 rows)
  // replace xs / act.
  const int64_t ldx = padded_ld(H), lda = padded_ld(I);
  Scratch<AlignedVector<float>> xs_s, act_s;
  Scratch<std::vector<float>> h1_s;
  Scratch<std::vector<uint16_t>> xs16_s, act16_s;
  AlignedVector<float> &xs = *xs_s, &act = *act_s;
  std::vector<uint16_t> &xs16 = *xs16_s, &act16 = *act16_s;
  if (pairs != nullptr) {
    xs16.assign(size_t(R * ldx), 0);
    act16.assign(size_t(R * lda), 0);
  } else {
    xs.assign(size_t(R * ldx), 0.0f);
    act.assign(size_t(R * lda), 0.0f);
  }
  h1_s->assign(size_t(R * d.N1), 0.0f);
  y_out->assign(size_t(R * H), 0.0f);

  if (pairs != nullptr) {  // gather the tokens as they are (bf16)
    const uint16_t* in = static_cast<const uint16_t*>(t.input) + t0 * H;
    maybe_parallel(par, R, R * H, [&](size_t p) {
      std::memcpy(&xs16[p * ldx], in + routes.token[p] * H, size_t(H) * 2);
    });
  } else {  // gather each expert's tokens (grouped order) as float rows
    const int64_t chunk = 16;
    const char* in = static_cast<const char*>(t.input) + t0 * H * es;
    maybe_parallel(par, (R + chunk - 1) / chunk, R * H, [&](size_t c) {
      const int64_t p1 = std::min(R, int64_t(c) * chunk + chunk);
      for (int64_t p = int64_t(c) * chunk; p < p1; ++p) {
        const int64_t tok = routes.token[p];
        float* dst = &xs[p * ldx];
        if (dt == DType::F32) {
          std::memcpy(dst, in + tok * H * 4, size_t(H) * 4);
        } else {
          for (int64_t h = 0; h < H; ++h) dst[h] = load_as_f32(in, tok * H + h, dt);
        }
      }
    });
  }

  RowsFormat f(tier, d, t);
  f.pairs = pairs;
  f.ldx = ldx;
  f.lda = lda;
  if (pairs != nullptr) {
    f.xs16 = xs16.data();
    f.act16 = act16.data();
  } else {
    f.xs = xs.data();
    f.act = act.data();
  }
  if (nr != nullptr)
    for (auto& tb : f.tabs) tb.resize(size_t(E));
  run_expert_pipeline(d, at, ExpertBiases{t.fc1_b, t.fc3_b, t.fc2_b, dt}, routes, par, nr, f, h1_s->data(),
                      y_out->data());
}

}  // namespace detail
}  // namespace hinamoe
