// The C ABI: thin wrappers that turn C arguments into the C++ structs and
// exceptions/errors into return codes (nothing may unwind into C callers).
#include "c_api.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

#include "bandwidth.h"
#include "fma_peak.h"
#include "amx/tile_peak.h"
#include "gqa/gqa.h"
#include "moe/moe_ffn.h"
#include "numa/topology.h"
#include "thread_pool.h"

using namespace hinamoe;

namespace {

void set_err(char* err, size_t len, const std::string& msg) {
  if (!err || len == 0) return;
  const size_t n = std::min(len - 1, msg.size());
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

// One pool per calling thread, kept between calls (thread start-up would
// otherwise dominate small calls) and rebuilt when the thread count changes.
ThreadPool* pool_for(int threads) {
  thread_local std::unique_ptr<ThreadPool> pool;
  if (!pool || pool->threads() != threads) {
    pool.reset();
    pool.reset(new ThreadPool(threads));
  }
  return pool.get();
}

// The topology of a C-ABI name: nullptr for one node ("off", "", NULL),
// else built once per name and kept for the process (plans are cached per
// topology object). *ok = false on an unknown name (reason in *why).
const numa::Topology* topology_for(const char* name, bool* ok, std::string* why) {
  *ok = true;
  const std::string n = name ? name : "";
  if (n.empty() || n == "off") return nullptr;
  static std::mutex mu;
  static auto* topos = new std::map<std::string, std::unique_ptr<numa::Topology>>();  // never destroyed
  std::lock_guard<std::mutex> lock(mu);
  auto it = topos->find(n);
  if (it != topos->end()) return it->second.get();
  std::unique_ptr<numa::Topology> t = numa::select_topology(n, why);
  if (!t) {
    *ok = false;
    *why = "unknown NUMA topology '" + n + "' (expected off, " + numa::topology_names() + ")";
    return nullptr;
  }
  return topos->emplace(n, std::move(t)).first->second.get();
}

}  // namespace

// The C handle is the C++ object itself.
struct HinamoeReadProbe : ReadProbe {
  using ReadProbe::ReadProbe;
};

extern "C" {

double hinamoe_read_bandwidth_gbs(size_t bytes, int threads, int repeats) {
  try {
    return read_bandwidth_gbs(bytes, threads, repeats);
  } catch (...) {
    return 0.0;
  }
}

int hinamoe_read_probe_create(size_t bytes, int threads, HinamoeReadProbe** out, char* err, size_t err_len) {
  if (!out) {
    set_err(err, err_len, "read probe: out is NULL");
    return 1;
  }
  *out = nullptr;
  try {
    *out = new HinamoeReadProbe(bytes, threads);
    set_err(err, err_len, "");
    return 0;
  } catch (const std::invalid_argument& e) {
    set_err(err, err_len, e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    set_err(err, err_len, "read probe: cannot allocate " + std::to_string(bytes) + " bytes");
    return 2;
  } catch (const std::exception& e) {
    set_err(err, err_len, std::string("read probe: ") + e.what());
    return 2;
  }
}

double hinamoe_read_probe_pass_gbs(HinamoeReadProbe* probe) {
  try {
    return probe ? probe->pass_gbs() : 0.0;
  } catch (...) {
    return 0.0;
  }
}

size_t hinamoe_read_probe_bytes(const HinamoeReadProbe* probe) { return probe ? probe->bytes() : 0; }

void hinamoe_read_probe_free(HinamoeReadProbe* probe) { delete probe; }

double hinamoe_tile_peak_per_s(int threads, int int8) {
  try {
    return tile_peak_per_s(threads, int8 != 0);
  } catch (...) {
    return 0.0;
  }
}

double hinamoe_fma_peak_per_s(int threads, int bits) {
  try {
    return fma_peak_per_s(threads, bits);
  } catch (...) {
    return 0.0;
  }
}

const char* hinamoe_best_tier(void) {
  static const std::string best = supported_tiers().front();
  return best.c_str();
}

const char* hinamoe_tier_unavailable_reason(const char* name) {
  thread_local std::string why;
  why = tier_unavailable_reason(name ? name : "");
  return why.c_str();
}

const char* hinamoe_gqa_tier(const char* name) {
  std::string err;
  const GqaTier* t = select_gqa_tier(name ? name : "", &err);
  return t ? t->name : "";
}

const char* hinamoe_tier_names(void) { return tier_names(); }

int hinamoe_moe_ffn(int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t k, int activation,
                    int gate_layout, int normalize_routing_weights, float alpha, float beta, float limit,
                    int limit_after_activation, int dtype, const void* input, const void* router,
                    const void* fc1_w, const void* fc1_b, const void* fc2_w, const void* fc2_b,
                    const void* fc3_w, const void* fc3_b, void* output, const char* tier, int threads,
                    char* err, size_t err_len) {
  return hinamoe_moe_ffn_ex(tokens, hidden, inter, experts, k, activation, gate_layout, normalize_routing_weights,
                            alpha, beta, limit, limit_after_activation, dtype, input, router, fc1_w, fc1_b, fc2_w,
                            fc2_b, fc3_w, fc3_b, output, tier, threads, nullptr, 0, err, err_len);
}

int hinamoe_numa_nodes(const char* numa, char* err, size_t err_len) {
  try {
    bool ok = true;
    std::string why;
    const numa::Topology* topo = topology_for(numa, &ok, &why);
    if (!ok) {
      set_err(err, err_len, why);
      return -1;
    }
    set_err(err, err_len, "");
    return topo ? topo->num_nodes() : 1;
  } catch (const std::exception& e) {
    set_err(err, err_len, std::string("hinamoe_numa_nodes failed: ") + e.what());
    return -1;
  }
}

int hinamoe_moe_ffn_ex(int64_t tokens, int64_t hidden, int64_t inter, int64_t experts, int64_t k, int activation,
                       int gate_layout, int normalize_routing_weights, float alpha, float beta, float limit,
                       int limit_after_activation, int dtype, const void* input, const void* router,
                       const void* fc1_w, const void* fc1_b, const void* fc2_w, const void* fc2_b,
                       const void* fc3_w, const void* fc3_b, void* output, const char* tier, int threads,
                       const char* numa, int64_t numa_page_size, char* err, size_t err_len) {
  try {
    if (dtype < 0 || dtype >= kNumDTypes) {
      set_err(err, err_len, "unknown dtype " + std::to_string(dtype) + " (0 float32, 1 float16, 2 bfloat16)");
      return 1;
    }
    MoEShape shape;
    shape.tokens = tokens;
    shape.hidden = hidden;
    shape.inter = inter;
    shape.experts = experts;
    MoEAttrs attrs;
    attrs.k = k;
    attrs.activation = static_cast<Activation>(activation);
    attrs.gate_layout = static_cast<GateLayout>(gate_layout);
    attrs.normalize_routing_weights = normalize_routing_weights != 0;
    attrs.alpha = alpha;
    attrs.beta = beta;
    attrs.limit = limit;
    attrs.limit_after_activation = limit_after_activation != 0;
    MoETensors t;
    t.dtype = static_cast<DType>(dtype);
    t.input = input;
    t.router = router;
    t.fc1_w = fc1_w;
    t.fc1_b = fc1_b;
    t.fc2_w = fc2_w;
    t.fc2_b = fc2_b;
    t.fc3_w = fc3_w;
    t.fc3_b = fc3_b;
    t.output = output;
    std::string msg;
    const KernelTier* kt = select_tier(tier ? tier : "auto", &msg);
    if (!kt) {
      set_err(err, err_len, msg);
      return 2;
    }
    bool topo_ok = true;
    MoEOptions opt;
    opt.topology = topology_for(numa, &topo_ok, &msg);
    if (!topo_ok) {
      set_err(err, err_len, msg);
      return 2;
    }
    opt.page_size = numa_page_size;
    const Parallel par = threads > 1 ? pool_for(threads)->parallel() : serial();
    msg = moe_ffn(shape, attrs, t, *kt, par, opt);
    if (!msg.empty()) {
      set_err(err, err_len, msg);
      return 3;
    }
    set_err(err, err_len, "");
    return 0;
  } catch (const std::exception& e) {
    set_err(err, err_len, std::string("hinamoe_moe_ffn failed: ") + e.what());
    return 4;
  } catch (...) {
    set_err(err, err_len, "hinamoe_moe_ffn failed: unknown exception");
    return 4;
  }
}

}  // extern "C"
