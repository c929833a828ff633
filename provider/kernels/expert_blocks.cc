// Per-route expert outputs for the token-transforming tiers (AMX): weights
// in place as the A operand, tokens gathered once into the VNNI layout.
#include <exception>
#include <mutex>

#include "moe_work.h"

namespace hinamoe {
namespace detail {

// Token-transforming tiers (AMX): gather each expert's tokens into the VNNI
// layout once, then fused gate/up blocks and down blocks. Exceptions from a
// kernel (the emulator's TileError) are caught on the worker thread and
// returned as a message: they must not cross the thread pool.
std::string expert_outputs_blocks(const MoEShape& shape, const MoEAttrs& at, const MoETensors& t, int64_t t0,
                                  const Routes& routes, const ExpertBlockKernels& kb, const Parallel& par,
                                  std::vector<float>* y_out) {
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
    return [&, fn](size_t i) {
      try {
        fn(i);
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

  const std::vector<Item> up_items = make_items(routes, E, I, par.threads, kb.row_block);
  par.for_each(up_items.size(), guarded([&](size_t i) {
    const Item it = up_items[i];
    const int64_t e = it.expert, M = begin[e + 1] - begin[e];
    kb.gate_up(at, H, I, w16(t.fc1_w, e * F1 * H), bias(t.fc1_b, e * F1),
               t.fc3_w ? w16(t.fc3_w, e * I * H) : nullptr, bias(t.fc3_b, e * I), dt, &xv[xoff[e]], M, it.b0,
               it.b1, &actv[aoff[e]]);
  }));
  if (!err.empty()) return err;

  const std::vector<Item> down_items = make_items(routes, E, H, par.threads, kb.row_block);
  par.for_each(down_items.size(), guarded([&](size_t i) {
    const Item it = down_items[i];
    const int64_t e = it.expert, p0 = begin[e], M = begin[e + 1] - p0;
    kb.down(H, I, w16(t.fc2_w, e * H * I), bias(t.fc2_b, e * H), dt, &actv[aoff[e]], M, it.b0, it.b1, nullptr,
            false, yr + p0 * H, H);
  }));
  return err;
}

}  // namespace detail
}  // namespace hinamoe
