// The NUMA-partitioned AMX bf16 path (paper §5.3, Algorithm 2) on the tile
// emulator: one node's partial over its local segments equals a float64 sum
// over the elements a brute-force page map puts on that node (interleaved
// placement, random pages, runs of pages on one node; segment ends off the
// 32-element k-blocks; rows r, r + Tx, ... or runs of rows sharing tiles;
// 1..70 tokens); tokens outside a node's segments never reach its sums (inf
// there stays out); the MoE driver runs the partitioned phases for amx-emu
// bf16 under fake topologies and not on one node; on a one-node table the
// partials + epilogues equal the plain blocks bit for bit.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "amx/block_epilogue.h"
#include "amx/hina_microkernel.h"
#include "moe/moe_ffn.h"
#include "numa/plan_cache.h"
#include "numa/segment_table.h"
#include "numa/topology.h"
#include "../moe_test_helpers.h"
#include "../ref_moe.h"
#include "../test_util.h"

using namespace hinamoe;

namespace {

// Node of element (r, k) of a bf16 weight [*, K] whose buffer starts `offset`
// bytes into a page: page = byte / P counted from that page, then the map.
struct PageMap {
  int64_t P, offset;
  int nodes, first_node;
  std::vector<int> page_nodes;  // empty: interleaved from first_node
  int node_of(int64_t r, int64_t k, int64_t K) const {
    const int64_t page = (offset + (r * K + k) * 2) / P;
    return page_nodes.empty() ? int((page + first_node) % nodes) : page_nodes[size_t(page)];
  }
};

// A random weight/table case: W [N, K] bf16, tokens x [M, K] bf16-exact.
struct Case {
  int64_t N, K, M;
  PageMap map;
  numa::SegmentTable table;
  ht::Buf w, x;
  std::vector<uint16_t> xv;  // x in the VNNI layout
};

// placement: 0 interleaved; 1 every page on a random node; 2 runs of 1..16
// pages on one node (bound or first-touch memory: whole rows share a node).
bool make_case(Case* c, int nodes, int placement) {
  c->N = ht::randint(1, 80);
  c->K = ht::randint(1, 300);
  c->M = std::vector<int64_t>{1, 3, 16, 17, 32, 33, 70}[size_t(ht::randint(0, 6))];
  const int64_t pages[] = {64, 96, 128, 256, 4096};
  PageMap& m = c->map;
  m.P = pages[ht::randint(0, 4)];
  m.offset = 2 * ht::randint(0, m.P / 2 - 1);  // any whole bf16 element: odd element offsets too
  m.nodes = nodes;
  m.first_node = int(ht::randint(0, nodes - 1));
  std::string err;
  if (placement != 0) {
    m.page_nodes.resize(size_t(numa::pages_spanned(c->N, c->K, 16, m.P, m.offset)));
    for (size_t p = 0; p < m.page_nodes.size();) {
      const size_t run = placement == 1 ? 1 : size_t(ht::randint(1, 16));
      const int n = int(ht::randint(0, nodes - 1));
      for (size_t q = 0; q < run && p < m.page_nodes.size(); ++q) m.page_nodes[p++] = n;
    }
    err = numa::build_page_map_table(c->N, c->K, 16, nodes, m.P, m.offset, m.page_nodes, &c->table);
  } else {
    err = numa::build_interleaved_table(c->N, c->K, 16, nodes, m.P, m.offset, m.first_node, &c->table);
  }
  if (!ht::check(err.empty(), "table: " + err)) return false;
  c->w = ht::random_buf(2, size_t(c->N * c->K), 1.0);
  c->x = ht::random_buf(2, size_t(c->M * c->K), 1.0);
  std::vector<int32_t> rows(size_t(c->M));
  for (int64_t i = 0; i < c->M; ++i) rows[size_t(i)] = int32_t(i);
  c->xv.assign(size_t(amx_vnni_elems(c->K, c->M)), 0xffff);
  amx_gather_vnni(c->x.data(), DType::BF16, c->K, rows.data(), c->M, c->xv.data());
  return true;
}

const uint16_t* w16(const Case& c) { return static_cast<const uint16_t*>(c.w.data()); }

std::string describe(const Case& c, int node, int64_t r0, int64_t r1) {
  return ht::fmt("N=%lld K=%lld M=%lld P=%lld offset=%lld nodes=%d first=%d %s Tx=%lld node=%d rows [%lld,%lld)",
                 (long long)c.N, (long long)c.K, (long long)c.M, (long long)c.map.P, (long long)c.map.offset,
                 c.map.nodes, c.map.first_node, c.map.page_nodes.empty() ? "interleaved" : "page-map",
                 (long long)c.table.period_rows, node, (long long)r0, (long long)r1);
}

// Checks one node's partial P (rows [r0, r1), row stride ldp) against the
// float64 sum over the elements the page map puts on `node`, tokens x.
// Grid values (i/128) make every product and partial sum exact in fp32, so
// the slack only covers a future kernel that sums in another order.
bool check_partial(const Case& c, int node, int64_t r0, int64_t r1, const std::vector<float>& P, int64_t ldp,
                   const std::vector<double>& x) {
  double excess = 0, at_err = 0;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t m = 0; m < c.M; ++m) {
      double want = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        if (c.map.node_of(r, k, c.K) != node) continue;
        const double p = c.w.val[size_t(r * c.K + k)] * x[size_t(m * c.K + k)];
        want += p;
        mag += std::fabs(p);
      }
      const double got = P[size_t((r - r0) * ldp + m)];
      const double err = std::isnan(got) ? INFINITY : std::fabs(got - want);
      if (err - 1e-6 * mag > excess) {
        excess = err - 1e-6 * mag;
        at_err = err;
      }
    }
  return ht::check(excess == 0, describe(c, node, r0, r1) + ht::fmt(": error %.3g over tolerance", at_err));
}

}  // namespace

TEST(amx_node_partial_matches_page_map_reference) {
  for (int rep = 0; rep < 36; ++rep) {
    const int nodes = 2 << (rep % 3);
    Case c;
    if (!make_case(&c, nodes, rep % 4 == 3 ? 1 : rep % 4 == 2 ? 2 : 0)) continue;
    const int64_t r0 = ht::randint(0, c.N - 1), r1 = ht::randint(r0 + 1, c.N);
    const int64_t ldp = c.M + ht::randint(0, 3);
    std::vector<float> sum(size_t((r1 - r0) * ldp), 0.0f);
    for (int node = 0; node < nodes; ++node) {
      std::vector<float> P(size_t((r1 - r0) * ldp), std::numeric_limits<float>::quiet_NaN());  // poisoned
      amx_node_partial_emu(c.table, node, w16(c), c.K, r0, r1, c.xv.data(), c.M, P.data(), ldp);
      check_partial(c, node, r0, r1, P, ldp, c.x.val);
      for (int64_t r = 0; r < r1 - r0; ++r)
        for (int64_t m = 0; m < c.M; ++m) sum[size_t(r * ldp + m)] += P[size_t(r * ldp + m)];
    }
    // Node partials add up to the whole product.
    double worst = 0;
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t m = 0; m < c.M; ++m) {
        double want = 0, mag = 0;
        for (int64_t k = 0; k < c.K; ++k) {
          const double p = c.w.val[size_t(r * c.K + k)] * c.x.val[size_t(m * c.K + k)];
          want += p;
          mag += std::fabs(p);
        }
        worst = std::max(worst, std::fabs(sum[size_t((r - r0) * ldp + m)] - want) / (mag + 1e-30));
      }
    CHECK_MSG(worst <= 1e-5, describe(c, -1, r0, r1) << ": sum of node partials, max relative error " << worst);
  }
}

TEST(amx_node_partial_reads_no_token_outside_its_segments) {
  // Tokens are +inf wherever the element is not on the node (for every row
  // of the block): staged edge blocks must zero them, not multiply 0 * inf.
  // Interleaved tables with Tx = 1 (every row has the same segments) and
  // pages that do not start on a 32-element k-block.
  for (int rep = 0; rep < 12; ++rep) {
    const int nodes = 2 << (rep % 3);
    Case c;
    c.M = ht::randint(1, 40);
    c.map.P = 64 * ht::randint(1, 3);
    c.K = c.map.P * nodes / 2 * ht::randint(1, 3);  // rows of whole page rounds: Tx = 1
    c.N = ht::randint(1, 40);
    c.map.offset = 2 * ht::randint(1, c.map.P / 2 - 1);
    c.map.nodes = nodes;
    c.map.first_node = int(ht::randint(0, nodes - 1));
    std::string err = numa::build_interleaved_table(c.N, c.K, 16, nodes, c.map.P, c.map.offset, c.map.first_node,
                                                    &c.table);
    if (!ht::check(err.empty() && c.table.period_rows == 1, err + ht::fmt(" Tx=%lld", (long long)c.table.period_rows)))
      continue;
    c.w = ht::random_buf(2, size_t(c.N * c.K), 1.0);
    const int node = int(ht::randint(0, nodes - 1));
    c.x = ht::random_buf(2, size_t(c.M * c.K), 1.0);
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t k = 0; k < c.K; ++k)
        if (c.map.node_of(0, k, c.K) != node) c.x.val[size_t(m * c.K + k)] = INFINITY;
    ht::encode(c.x);
    std::vector<int32_t> rows(size_t(c.M));
    for (int64_t i = 0; i < c.M; ++i) rows[size_t(i)] = int32_t(i);
    c.xv.assign(size_t(amx_vnni_elems(c.K, c.M)), 0);
    amx_gather_vnni(c.x.data(), DType::BF16, c.K, rows.data(), c.M, c.xv.data());
    std::vector<float> P(size_t(c.N * c.M), std::numeric_limits<float>::quiet_NaN());
    amx_node_partial_emu(c.table, node, w16(c), c.K, 0, c.N, c.xv.data(), c.M, P.data(), c.M);
    check_partial(c, node, 0, c.N, P, c.M, c.x.val);
  }
}

namespace {

const numa::Topology& fake_topology(int nodes) {
  static std::unique_ptr<numa::Topology> t[9];
  if (!t[nodes]) t[nodes] = numa::select_topology("fake:" + std::to_string(nodes), nullptr);
  return *t[nodes];
}

}  // namespace

TEST(amx_emu_bf16_moe_runs_partitioned_phases) {
  // bf16 MoE on amx-emu with more than 32 tokens per expert (two token
  // blocks): fake 2/4/8 nodes run both GEMM phases partitioned (one worker:
  // it steals the other nodes' items) and match the unpartitioned run and
  // the float64 reference; no topology or one real node: no partitioned call.
  const KernelTier* tier = select_tier("amx-emu", nullptr);
  if (!CHECK(tier != nullptr)) return;
  const int64_t T = 40, H = 150, I = 70, E = 3, k = 2;
  ht::Buf x = ht::random_buf(2, size_t(T * H), 1.0), lg = ht::random_buf(2, size_t(T * E), 2.0);
  ht::Buf w1 = ht::random_buf(2, size_t(E * 2 * I * H), 0.125), w2 = ht::random_buf(2, size_t(E * H * I), 0.125);
  ht::Buf b1 = ht::random_buf(2, size_t(E * 2 * I), 0.25), b2 = ht::random_buf(2, size_t(E * H), 0.25);
  ref::Params RP;
  RP.act = 4;
  RP.layout = 1;
  RP.alpha = double(1.702f);
  RP.beta = 1.0;
  RP.limit = 7.0;
  const std::vector<double> want = ref::moe(T, H, I, E, k, RP, x.val, lg.val, w1.val, b1.val, w2.val, b2.val, {}, {});
  double scale = 1e-3;
  for (double v : want) scale = std::max(scale, std::fabs(v));
  const double tol = 1e-2 * scale;

  MoEShape s{T, H, I, E};
  MoEAttrs a;
  a.k = k;
  a.activation = Activation::SwiGLU;
  a.gate_layout = GateLayout::Interleaved;
  a.alpha = 1.702f;
  a.beta = 1.0f;
  a.limit = 7.0f;
  MoETensors t;
  t.dtype = DType::BF16;
  t.input = x.data();
  t.router = lg.data();
  t.fc1_w = w1.data();
  t.fc1_b = b1.data();
  t.fc2_w = w2.data();
  t.fc2_b = b2.data();
  auto run = [&](const MoEOptions& opt, std::vector<uint8_t>* out) {
    out->assign(size_t(T * H) * 2, 0);
    ht::poison(*out);
    t.output = out->data();
    return moe_ffn(s, a, t, *tier, serial(), opt);
  };
  auto diff = [&](const std::vector<uint8_t>& out, const std::vector<double>& ref) {
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double g = ht::read_raw(out.data(), i, 2);
      worst = std::max(worst, std::isnan(g) ? INFINITY : std::fabs(g - ref[i]));
    }
    return worst;
  };

  MoEStats st;
  MoEOptions opt;
  opt.stats = &st;
  std::vector<uint8_t> plain, part;
  CHECK(run(opt, &plain).empty());
  CHECK_MSG(st.partitioned_phases == 0 && st.partition_items == 0, "no topology: phases " << st.partitioned_phases);
  CHECK_MSG(diff(plain, want) <= tol, "unpartitioned vs reference " << diff(plain, want) << " > " << tol);
  const std::unique_ptr<numa::Topology> sys = numa::select_topology("sysfs", nullptr);
  if (sys && sys->num_nodes() == 1) {
    opt.topology = sys.get();
    CHECK(run(opt, &part).empty());
    CHECK_MSG(st.partitioned_phases == 0 && st.partition_items == 0, "one node: phases " << st.partitioned_phases);
  }
  std::vector<double> plain_v(want.size());
  for (size_t i = 0; i < plain_v.size(); ++i) plain_v[i] = ht::read_raw(plain.data(), i, 2);
  for (int nodes : {2, 4, 8}) {
    for (int64_t page : {int64_t(128), int64_t(0)}) {
      numa::PlanCache plans;
      opt.topology = &fake_topology(nodes);
      opt.plans = &plans;
      opt.page_size = page;
      const std::string err = run(opt, &part);
      CHECK_MSG(err.empty(), err);
      CHECK_MSG(st.partitioned_phases == 2 && st.partition_items > 0 && st.stolen_items > 0,
                "fake:" << nodes << " page " << page << ": phases " << st.partitioned_phases << " items "
                        << st.partition_items << " stolen " << st.stolen_items);
      CHECK_MSG(diff(part, want) <= tol && diff(part, plain_v) <= tol,
                "fake:" << nodes << " page " << page << ": vs reference " << diff(part, want) << ", vs unpartitioned "
                        << diff(part, plain_v) << ", tol " << tol);
    }
  }
}

TEST(amx_partials_on_a_one_node_table_equal_the_plain_blocks) {
  // With the whole weight on node 0, node_partial + the finishes must give
  // exactly what the one-node blocks give (same k-block order per output):
  // gate/up activations bit for bit in the VNNI layout, and down rows with
  // the routing weight and accumulation into existing values.
  const Activation acts[] = {Activation::Relu, Activation::Gelu, Activation::Silu, Activation::Identity,
                             Activation::Relu2, Activation::SwiGLU, Activation::GeGLU};
  int n = 0;
  for (Activation act : acts) {
    const bool gated = is_gated(act);
    for (int layout = 0; layout < (gated ? 3 : 1); ++layout, ++n) {
      const int64_t H = ht::randint(1, 140), I = ht::randint(1, 90), M = ht::randint(1, 70);
      MoEAttrs at;
      at.activation = act;
      at.gate_layout = GateLayout(layout);
      at.alpha = 1.702f;
      at.beta = 1.0f;
      at.limit = 7.0f;
      const bool sep = gated && layout == 0;
      const int64_t F1 = gated && !sep ? 2 * I : I;
      ht::Buf w1 = ht::random_buf(2, size_t(F1 * H), 0.25), w2 = ht::random_buf(2, size_t(H * I), 0.25);
      ht::Buf w3 = sep ? ht::random_buf(2, size_t(I * H), 0.25) : ht::Buf{};
      ht::Buf b1 = ht::random_buf(2, size_t(F1), 0.5), b2 = ht::random_buf(2, size_t(H), 0.5);
      ht::Buf b3 = sep ? ht::random_buf(2, size_t(I), 0.5) : ht::Buf{};
      ht::Buf x = ht::random_buf(2, size_t(M * H), 1.0);
      std::vector<int32_t> rows(static_cast<size_t>(M));
      for (int64_t i = 0; i < M; ++i) rows[size_t(i)] = int32_t(i);
      std::vector<uint16_t> xv(static_cast<size_t>(amx_vnni_elems(H, M)));
      amx_gather_vnni(x.data(), DType::BF16, H, rows.data(), M, xv.data());
      auto u16 = [](const ht::Buf& b) { return static_cast<const uint16_t*>(b.data()); };

      std::vector<uint16_t> act_plain(size_t(amx_vnni_elems(I, M)), 0xffff), act_part(act_plain);
      amx_gate_up_block_emu(at, H, I, u16(w1), b1.data(), u16(w3), b3.data(), DType::BF16, xv.data(), M, 0, I,
                            act_plain.data());
      const numa::SegmentTable t1 = numa::single_node_table(F1, H, 16), t3 = numa::single_node_table(I, H, 16);
      std::vector<float> h(size_t((gated ? 2 * I : I) * M), std::numeric_limits<float>::quiet_NaN());
      amx_node_partial_emu(t1, 0, u16(w1), H, 0, F1, xv.data(), M, h.data(), M);
      if (sep) amx_node_partial_emu(t3, 0, u16(w3), H, 0, I, xv.data(), M, h.data() + I * M, M);
      amx::amx_gate_up_finish(at, I, b1.data(), b3.data(), DType::BF16, h.data(), M, 0, I, act_part.data());
      CHECK_MSG(act_plain == act_part, "gate/up act=" << int(act) << " layout=" << layout << " H=" << H << " I=" << I
                                                      << " M=" << M << ": activations differ");

      std::vector<float> rw(static_cast<size_t>(M)), y_plain(static_cast<size_t>(M * (H + 3))), y_part;
      for (auto& v : rw) v = float(ht::uniform(0.1, 1.0));
      for (auto& v : y_plain) v = float(ht::uniform(-1, 1));
      y_part = y_plain;
      const bool accumulate = n % 2 == 0;
      amx_down_block_emu(H, I, u16(w2), b2.data(), DType::BF16, act_plain.data(), M, 0, H, rw.data(), accumulate,
                         y_plain.data(), H + 3);
      const numa::SegmentTable t2 = numa::single_node_table(H, I, 16);
      std::vector<float> acc(size_t(H * M), std::numeric_limits<float>::quiet_NaN());
      amx_node_partial_emu(t2, 0, u16(w2), I, 0, H, act_plain.data(), M, acc.data(), M);
      amx::amx_down_finish(b2.data(), DType::BF16, acc.data(), M, 0, H, rw.data(), accumulate, y_part.data(), H + 3);
      CHECK_MSG(y_plain == y_part, "down H=" << H << " I=" << I << " M=" << M << " accumulate=" << accumulate
                                             << ": rows differ");
    }
  }
}
