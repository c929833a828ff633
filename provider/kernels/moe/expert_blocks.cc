// Per-route expert outputs for the token-transforming tiers (AMX): weights
// in place as the A operand, tokens gathered once into the VNNI layout.
//
// NUMA (more than one node; paper §5.3, Algorithm 2): after the gather, each
// projection phase becomes (a) node-partitioned items (node, expert, row
// block), claimed as in expert_rows.cc (own node first, then stealing), in
// which kb.node_partial computes the node's partial sums over its local
// segments of the weight into float rows [row][M] (node 0's buffer holds the
// sums); then (b) per (expert, row block) the partials of nodes 1.. are added
// in node order and the fused epilogue runs once: gate/up bias + activation
// into the VNNI activations, down bias (+ routing weight) into the rows.
// One node: the plain blocks, nothing else.
#include <exception>
#include <mutex>

#include "expert_pipeline.h"

namespace hinamoe {
namespace detail {
namespace {

// Row blocks of a partitioned phase: whole 32-row panels of each residue
// class, i.e. multiples of row_block * Tx (the largest period among the
// phase's tables), capped so that a phase still has blocks to share.
int64_t partition_align(const ExpertBlockKernels& kb, int64_t rows,
                        const std::vector<std::shared_ptr<const numa::SegmentTable>>& tabs) {
  int64_t tx = 1;
  for (const auto& t : tabs)
    if (t) tx = std::max(tx, t->period_rows);
  const int64_t cap = std::max(kb.row_block, (rows + 1) / 2 / kb.row_block * kb.row_block);
  return std::min(kb.row_block * tx, cap);
}

}  // namespace

// Token-transforming tiers (AMX): gather each expert's tokens into the VNNI
// layout once, then fused gate/up blocks and down blocks. Exceptions from a
// kernel (the emulator's TileError) are caught on the worker thread and
// returned as a message: they must not cross the thread pool.
std::string expert_outputs_blocks(const MoEShape& shape, const MoEAttrs& at, const MoETensors& t, int64_t t0,
                                  const Routes& routes, const ExpertBlockKernels& kb, const Parallel& par,
                                  NumaRun* nr, std::vector<float>* y_out) {
  const int64_t H = shape.hidden, I = shape.inter, E = shape.experts;
  const bool gated = is_gated(at.activation);
  const int64_t F1 = gated && at.gate_layout != GateLayout::Separate ? 2 * I : I;
  const DType dt = t.dtype;  // bf16
  const int64_t R = routes.count();
  const int64_t* begin = routes.expert_begin.data();
  const char* in = static_cast<const char*>(t.input) + t0 * H * 2;

  // Per-expert offsets into the VNNI token and activation buffers.
  std::vector<int64_t> xoff(size_t(E + 1), 0), aoff(size_t(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t M = begin[e + 1] - begin[e];
    xoff[e + 1] = xoff[e] + (M ? kb.vnni_elems(H, M) : 0);
    aoff[e + 1] = aoff[e] + (M ? kb.vnni_elems(I, M) : 0);
  }
  std::vector<uint16_t> xv(size_t(xoff[E])), actv(size_t(aoff[E]));
  std::vector<int32_t> rows(static_cast<size_t>(R));
  for (int64_t p = 0; p < R; ++p) rows[p] = int32_t(routes.token[p]);
  y_out->assign(size_t(R * H), 0.0f);
  float* yr = y_out->data();

  std::mutex err_mu;
  std::string err;
  auto guarded = [&](auto&& fn) {
    return [&, fn](const auto& arg) {
      try {
        fn(arg);
      } catch (const std::exception& ex) {
        std::lock_guard<std::mutex> lock(err_mu);
        if (err.empty()) err = ex.what();
      }
    };
  };
  auto w16 = [](const void* base, int64_t off) { return static_cast<const uint16_t*>(base) + off; };
  auto bias = [](const void* base, int64_t off) -> const void* {
    return base ? static_cast<const uint16_t*>(base) + off : nullptr;
  };

  std::vector<int64_t> active;
  for (int64_t e = 0; e < E; ++e)
    if (begin[e + 1] > begin[e]) active.push_back(e);
  par.for_each(active.size(), guarded([&](size_t i) {
    const int64_t e = active[i];
    kb.gather(in, dt, H, &rows[begin[e]], begin[e + 1] - begin[e], &xv[xoff[e]]);
  }));
  if (!err.empty()) return err;

  if (nr != nullptr) {
    // Exceptions must not cross the pool: the first one is kept as the error.
    auto keep = [&](const std::exception& ex) {
      std::lock_guard<std::mutex> lock(err_mu);
      if (err.empty()) err = ex.what();
    };
    const int nodes = nr->nodes;
    const int64_t N1 = gated ? 2 * I : I;
    // Phase 1: node partials of the gate/up rows, sums, bias + activation.
    {
      std::vector<std::shared_ptr<const numa::SegmentTable>> tab1(static_cast<size_t>(E)), tab3(static_cast<size_t>(E));
      for (int64_t e : active) {
        tab1[e] = weight_table(*nr, w16(t.fc1_w, e * F1 * H), F1, H, dt);
        if (t.fc3_w) tab3[e] = weight_table(*nr, w16(t.fc3_w, e * I * H), I, H, dt);
      }
      std::vector<std::shared_ptr<const numa::SegmentTable>> all(tab1);
      all.insert(all.end(), tab3.begin(), tab3.end());
      const int64_t per_j = gated && at.gate_layout == GateLayout::Interleaved ? 2 : 1;  // fc1 rows per j
      const int64_t jal = partition_align(kb, per_j * I, all) / per_j;
      const std::vector<Item> items = make_items(routes, E, I, par.threads, std::max(jal, kb.row_block));
      const int64_t stride = R * N1;
      std::vector<float> sums(static_cast<size_t>(stride)), part(static_cast<size_t>((nodes - 1) * stride));
      run_node_items(par, *nr, items.size(), [&](int node, size_t i, std::vector<float>&) {
        try {
          const Item it = items[i];
          const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
          float* Y = (node == 0 ? sums.data() : &part[(node - 1) * stride]) + p0 * N1;
          RowRange rr[2];
          const int n = gate_up_ranges(at, I, it.b0, it.b1, rr);
          for (int q = 0; q < n; ++q) {
            const uint16_t* W = rr[q].fc3 ? w16(t.fc3_w, e * I * H) : w16(t.fc1_w, e * F1 * H);
            kb.node_partial(rr[q].fc3 ? *tab3[e] : *tab1[e], node, W, H, rr[q].a, rr[q].b, &xv[xoff[e]], M,
                            Y + rr[q].out * M, M);
          }
        } catch (const std::exception& ex) {
          keep(ex);
        }
      });
      if (!err.empty()) return err;
      par.for_each(items.size(), guarded([&](size_t i) {
        const Item it = items[i];
        const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
        float* Y = sums.data() + p0 * N1;
        RowRange rr[2];
        const int n = gate_up_ranges(at, I, it.b0, it.b1, rr);
        for (int q = 0; q < n; ++q)  // rows [out, out + b - a) of [N1][M]: one contiguous run
          add_partials(Y, part.data() + p0 * N1, nodes, stride, 1, 0, rr[q].out * M,
                       (rr[q].out + rr[q].b - rr[q].a) * M);
        kb.gate_up_finish(at, I, bias(t.fc1_b, e * F1), bias(t.fc3_b, e * I), dt, Y, M, it.b0, it.b1,
                          &actv[aoff[e]]);
      }));
      if (!err.empty()) return err;
    }
    // Phase 2: node partials of the down rows, sums, bias -> y rows.
    {
      std::vector<std::shared_ptr<const numa::SegmentTable>> tab2(static_cast<size_t>(E));
      for (int64_t e : active) tab2[e] = weight_table(*nr, w16(t.fc2_w, e * H * I), H, I, dt);
      const std::vector<Item> items =
          make_items(routes, E, H, par.threads, std::max(partition_align(kb, H, tab2), kb.row_block));
      const int64_t stride = R * H;
      std::vector<float> sums(static_cast<size_t>(stride)), part(static_cast<size_t>((nodes - 1) * stride));
      run_node_items(par, *nr, items.size(), [&](int node, size_t i, std::vector<float>&) {
        try {
          const Item it = items[i];
          const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
          float* Y = (node == 0 ? sums.data() : &part[(node - 1) * stride]) + p0 * H;
          kb.node_partial(*tab2[e], node, w16(t.fc2_w, e * H * I), I, it.b0, it.b1, &actv[aoff[e]], M,
                          Y + it.b0 * M, M);
        } catch (const std::exception& ex) {
          keep(ex);
        }
      });
      if (!err.empty()) return err;
      par.for_each(items.size(), guarded([&](size_t i) {
        const Item it = items[i];
        const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
        float* Y = sums.data() + p0 * H;
        add_partials(Y, part.data() + p0 * H, nodes, stride, 1, 0, it.b0 * M, it.b1 * M);
        kb.down_finish(bias(t.fc2_b, e * H), dt, Y, M, it.b0, it.b1, nullptr, false, yr + p0 * H, H);
      }));
    }
    return err;
  }

  // Gate/up and down in one pass over the pool (work_items.h).
  const std::vector<Item> up_items = make_items(routes, E, I, par.threads, kb.row_block);
  const std::vector<Item> down_items = make_items(routes, E, H, par.threads, kb.row_block);
  run_up_then_down(
      par, up_items, down_items, E, guarded([&](const Item& it) {
        const int64_t e = it.expert, M = begin[e + 1] - begin[e];
        kb.gate_up(at, H, I, w16(t.fc1_w, e * F1 * H), bias(t.fc1_b, e * F1),
                   t.fc3_w ? w16(t.fc3_w, e * I * H) : nullptr, bias(t.fc3_b, e * I), dt, &xv[xoff[e]], M, it.b0,
                   it.b1, &actv[aoff[e]]);
      }),
      guarded([&](const Item& it) {
        const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
        kb.down(H, I, w16(t.fc2_w, e * H * I), bias(t.fc2_b, e * H), dt, &actv[aoff[e]], M, it.b0, it.b1, nullptr,
                false, yr + p0 * H, H);
      }));
  return err;
}

}  // namespace detail
}  // namespace hinamoe
