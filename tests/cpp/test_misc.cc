// Tier selection, the thread pool, the bandwidth probe, the C ABI,
// concurrent calls and the drivers' per-thread scratch pools.
#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <thread>

#include "bandwidth.h"
#include "fma_peak.h"
#include "c_api.h"
#include "moe/moe_ffn.h"
#include "scratch.h"
#include "test_util.h"
#include "thread_pool.h"

using namespace hinamoe;

TEST(tier_selection) {
  std::string err;
  const KernelTier* a = select_tier("auto", &err);
  ht::check(a != nullptr && err.empty(), "auto resolves: " + err);
  ht::check(a && std::string(a->name) == supported_tiers().front(), "auto = best supported tier");
  ht::check(select_tier("ref", &err) == &ref_tier(), "ref always available");
  ht::check(select_tier("avx1024", &err) == nullptr && err.find("avx512") != std::string::npos &&
                err.find("avx2") != std::string::npos && err.find("ref") != std::string::npos,
            "unknown tier lists the names: " + err);
  // Each ISA tier: selectable exactly where it has no reason against it, and
  // then listed by supported_tiers(), avx512 before avx2.
  for (const char* name : {"amx", "avx512", "avx2"}) {
    const std::string why = tier_unavailable_reason(name);
    const KernelTier* t = select_tier(name, &err);
    const auto& st = supported_tiers();
    const bool listed = std::find(st.begin(), st.end(), name) != st.end();
    CHECK_MSG(why.empty() ? (t != nullptr && std::string(t->name) == name && err.empty() && listed)
                          : (t == nullptr && err == why && why.find(name) != std::string::npos && !listed),
              name << ": reason '" << why << "', select error '" << err << "'");
  }
  if (tier_unavailable_reason("avx512").empty()) {
    const auto& st = supported_tiers();
    CHECK(std::find(st.begin(), st.end(), "avx512") < std::find(st.begin(), st.end(), "avx2"));
  }
  ht::check(!tier_unavailable_reason("bogus").empty(), "unknown tier has a reason");
  // tier.h: best first; the emulator (tests only) always last, right after ref.
  const std::vector<std::string> st = supported_tiers();
  ht::check(st.size() >= 2 && st.back() == "amx-emu" && st[st.size() - 2] == "ref", "ref is the last real tier, amx-emu last");
  std::printf("  tiers here:");
  for (auto& t : supported_tiers()) std::printf(" %s", t.c_str());
  for (const char* name : {"avx512", "avx2"})
    std::printf("  (%s: %s)", name, tier_unavailable_reason(name).empty() ? "yes" : tier_unavailable_reason(name).c_str());
  std::printf("\n");
  ht::check(std::string(hinamoe_best_tier()) == supported_tiers().front(), "C ABI best tier");
  ht::check(std::string(hinamoe_tier_unavailable_reason("ref")).empty(), "C ABI ref reason empty");
  ht::check(!std::string(hinamoe_tier_unavailable_reason("nope")).empty(), "C ABI unknown reason");
}

TEST(thread_pool_covers_each_index_once) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    const Parallel par = pool.parallel();
    for (size_t n : {0, 1, 2, 7, 1000}) {
      for (int rep = 0; rep < 20; ++rep) {
        std::vector<std::atomic<int>> hits(n);
        for (auto& h : hits) h.store(0);
        par.for_each(n, [&](size_t i) { hits[i].fetch_add(1); });
        bool ok = true;
        for (auto& h : hits) ok &= h.load() == 1;
        if (!ht::check(ok, ht::fmt("threads=%d n=%zu rep=%d", threads, n, rep))) break;
      }
    }
    // Nested use runs inline instead of deadlocking.
    std::atomic<int> total{0};
    par.for_each(4, [&](size_t) { par.for_each(3, [&](size_t) { total.fetch_add(1); }); });
    ht::check(total.load() == 12, "nested for_each");
  }
}

TEST(bandwidth_probe) {
  const double gbs = read_bandwidth_gbs(size_t(32) << 20, 2, 3);
  ht::check(std::isfinite(gbs) && gbs > 0, ht::fmt("probe returned %g GB/s", gbs));
  const double c = hinamoe_read_bandwidth_gbs(size_t(8) << 20, 1, 2);
  ht::check(std::isfinite(c) && c > 0, ht::fmt("C ABI probe returned %g GB/s", c));
  std::printf("  read bandwidth (32 MiB, 2 threads): %.1f GB/s\n", gbs);
}

TEST(read_probe_passes) {
  // One thread and several; repeated passes over the same buffer and threads.
  for (int threads : {1, 2, 3}) {
    ReadProbe probe(size_t(8) << 20, threads);
    ht::check(probe.threads() == threads, ht::fmt("threads() = %d", probe.threads()));
    const size_t slice = (size_t(8) << 20) / size_t(threads) / 256 * 256;
    ht::check(probe.bytes() == slice * size_t(threads), ht::fmt("%d threads: bytes() = %zu", threads, probe.bytes()));
    for (int pass = 0; pass < 5; ++pass) {
      const double gbs = probe.pass_gbs();
      if (!ht::check(std::isfinite(gbs) && gbs > 0, ht::fmt("%d threads, pass %d: %g GB/s", threads, pass, gbs)))
        break;
    }
  }
  // Tiny requests still stream at least 4 KiB per thread.
  ReadProbe tiny(1, 2);
  ht::check(tiny.bytes() == 2 * 4096, ht::fmt("tiny probe streams %zu bytes", tiny.bytes()));
  ht::check(tiny.pass_gbs() > 0, "tiny probe pass");
  CHECK_THROWS(ReadProbe(0, 1), std::invalid_argument);
  CHECK_THROWS(ReadProbe(4096, 0), std::invalid_argument);
  CHECK_THROWS(ReadProbe(4096, ReadProbe::kMaxThreads + 1), std::invalid_argument);
}

TEST(read_probe_c_api) {
  char err[256] = "poison";
  HinamoeReadProbe* p = nullptr;
  int rc = hinamoe_read_probe_create(size_t(4) << 20, 2, &p, err, sizeof err);
  ht::check(rc == 0 && p != nullptr && err[0] == '\0', std::string("create: ") + err);
  ht::check(hinamoe_read_probe_bytes(p) == (size_t(4) << 20), ht::fmt("bytes %zu", hinamoe_read_probe_bytes(p)));
  for (int pass = 0; pass < 3; ++pass) {
    const double gbs = hinamoe_read_probe_pass_gbs(p);
    ht::check(std::isfinite(gbs) && gbs > 0, ht::fmt("C ABI pass %d: %g GB/s", pass, gbs));
  }
  hinamoe_read_probe_free(p);
  hinamoe_read_probe_free(nullptr);
  ht::check(hinamoe_read_probe_pass_gbs(nullptr) == 0.0, "NULL probe passes at 0");
  p = reinterpret_cast<HinamoeReadProbe*>(&err);  // must be reset to NULL on failure
  rc = hinamoe_read_probe_create(0, 1, &p, err, sizeof err);
  ht::check(rc == 1 && p == nullptr && std::string(err).find("bytes") != std::string::npos,
            std::string("bytes = 0 rejected: ") + err);
  rc = hinamoe_read_probe_create(4096, 0, &p, err, sizeof err);
  ht::check(rc == 1 && std::string(err).find("threads") != std::string::npos,
            std::string("threads = 0 rejected: ") + err);
  rc = hinamoe_read_probe_create(4096, 1, nullptr, err, sizeof err);
  ht::check(rc == 1, "out = NULL rejected");
}

TEST(fma_peak_probe) {
  if (!tier_unavailable_reason("avx2").empty()) {
    ht::check(fma_peak_per_s(1) == 0.0, "no AVX2: the FMA probe reports 0");
    return;
  }
  // Physical bounds: at least 1 lane-FMA per ns per thread (any AVX2 core
  // above 0.0625 GHz), at most 2 x 16 lanes per cycle at 6 GHz per thread.
  for (int threads : {1, 2}) {
    const double r = fma_peak_per_s(threads);
    ht::check(r > 1e9 && r < threads * 32 * 6e9, ht::fmt("%d threads: %g lane-FMA/s", threads, r));
    const double c = hinamoe_fma_peak_per_s(threads, 256);
    ht::check(c > 1e9 && c < threads * 32 * 6e9, ht::fmt("C ABI, %d threads: %g lane-FMA/s", threads, c));
  }
  ht::check(fma_peak_per_s(1, 128) == 0.0, "only 256- and 512-bit chains");
  // 512-bit chains: 16 lanes each, so at most 2 x 32 lanes per cycle at 6 GHz.
  const double z = fma_peak_per_s(1, 512);
  if (tier_unavailable_reason("avx512").empty())
    ht::check(z > 1e9 && z < 64 * 6e9, ht::fmt("512-bit: %g lane-FMA/s", z));
  else
    ht::check(z == 0.0, "no AVX-512: the 512-bit probe reports 0");
  std::printf("  FMA peak (1 thread): %.1f G lane-FMA/s (256-bit), %.1f (512-bit)\n", fma_peak_per_s(1) / 1e9,
              z / 1e9);
}

namespace {
struct SmallCase {
  int64_t T = 6, H = 24, I = 16, E = 5, k = 2;
  ht::Buf x, lg, w1, w2, w3;
  explicit SmallCase(int dtype) {
    x = ht::random_buf(dtype, size_t(T * H), 1.0);
    lg = ht::random_buf(dtype, size_t(T * E), 1.0);
    w1 = ht::random_buf(dtype, size_t(E * I * H), 0.25);
    w3 = ht::random_buf(dtype, size_t(E * I * H), 0.25);
    w2 = ht::random_buf(dtype, size_t(E * H * I), 0.25);
  }
};
}  // namespace

TEST(c_api_matches_cpp) {
  for (int dtype = 0; dtype < 3; ++dtype) {
    SmallCase c(dtype);
    const size_t es = dtype == 0 ? 4 : 2;
    std::vector<uint8_t> o1(size_t(c.T * c.H) * es), o2(o1.size());
    ht::poison(o1);
    ht::poison(o2);
    MoEShape s{c.T, c.H, c.I, c.E};
    MoEAttrs a;
    a.k = c.k;
    a.activation = Activation::SwiGLU;
    a.alpha = 1.702f;
    a.beta = 1.0f;
    a.limit = 7.0f;
    MoETensors t;
    t.dtype = DType(dtype);
    t.input = c.x.data(); t.router = c.lg.data(); t.fc1_w = c.w1.data(); t.fc2_w = c.w2.data(); t.fc3_w = c.w3.data();
    t.output = o1.data();
    const std::string e1 = moe_ffn(s, a, t, ref_tier(), serial());
    char err[256] = "x";
    const int rc = hinamoe_moe_ffn(c.T, c.H, c.I, c.E, c.k, 4, 0, 0, 1.702f, 1.0f, 7.0f, 0, dtype, c.x.data(),
                                   c.lg.data(), c.w1.data(), nullptr, c.w2.data(), nullptr, c.w3.data(), nullptr,
                                   o2.data(), "ref", 2, err, sizeof err);
    ht::check(e1.empty() && rc == 0 && err[0] == 0, ht::fmt("C ABI rc=%d err='%s' cpp='%s'", rc, err, e1.c_str()));
    ht::check(o1 == o2, std::string(ht::dtype_str(dtype)) + ": C ABI (ref, 2 threads) equals C++ (ref, serial)");
    // Errors come back as text.
    const int rc2 = hinamoe_moe_ffn(c.T, c.H, c.I, c.E, 9, 4, 0, 0, 1, 0, INFINITY, 0, dtype, c.x.data(),
                                    c.lg.data(), c.w1.data(), nullptr, c.w2.data(), nullptr, c.w3.data(), nullptr,
                                    o2.data(), "auto", 1, err, sizeof err);
    ht::check(rc2 != 0 && std::string(err) == "k=9 exceeds the number of experts (5)", std::string("C ABI k>E: ") + err);
    const int rc3 = hinamoe_moe_ffn(c.T, c.H, c.I, c.E, 2, 4, 0, 0, 1, 0, INFINITY, 0, dtype, c.x.data(),
                                    c.lg.data(), c.w1.data(), nullptr, c.w2.data(), nullptr, c.w3.data(), nullptr,
                                    o2.data(), "sse9", 1, err, 8);
    ht::check(rc3 != 0 && std::strlen(err) == 7, "C ABI bad tier, message truncated to the buffer");
  }
}

TEST(concurrent_calls) {
  // Several threads call moe_ffn at once (own data, shared tier): no shared mutable state.
  const KernelTier* tier = select_tier("auto", nullptr);
  std::vector<std::unique_ptr<SmallCase>> cases;
  std::vector<std::vector<float>> want(4), got(4);
  for (int i = 0; i < 4; ++i) cases.emplace_back(new SmallCase(0));
  auto call = [&](int i, std::vector<float>* out, const Parallel& par) {
    SmallCase& c = *cases[i];
    MoEShape s{c.T, c.H, c.I, c.E};
    MoEAttrs a;
    a.k = c.k;
    a.activation = Activation::Gelu;
    MoETensors t;
    t.input = c.x.data(); t.router = c.lg.data(); t.fc1_w = c.w1.data(); t.fc2_w = c.w2.data();
    out->assign(size_t(c.T * c.H), NAN);
    t.output = out->data();
    return moe_ffn(s, a, t, *tier, par);
  };
  for (int i = 0; i < 4; ++i) call(i, &want[i], serial());
  std::vector<std::thread> th;
  std::atomic<int> errors{0};
  for (int i = 0; i < 4; ++i)
    th.emplace_back([&, i] {
      ThreadPool pool(2);
      for (int rep = 0; rep < 5; ++rep)
        if (!call(i, &got[i], rep % 2 ? pool.parallel() : serial()).empty()) errors++;
    });
  for (auto& x : th) x.join();
  bool same = errors.load() == 0;
  for (int i = 0; i < 4; ++i) same &= want[i] == got[i];
  ht::check(same, "concurrent results equal serial ones");
}

// Scratch: a buffer given back is the next lease's (same storage), leases
// held together get distinct buffers, and one over kScratchKeepBytes is
// freed, not kept. On a fresh thread, so the pool starts empty.
TEST(scratch_pool_reuses_and_bounds_buffers) {
  std::thread([] {
    const float* first = nullptr;
    {
      Scratch<std::vector<float>> a;
      CHECK(a->capacity() == 0);
      a->assign(1000, 1.0f);
      first = a->data();
    }
    {
      Scratch<std::vector<float>> a;
      CHECK_MSG(a->data() == first && a->capacity() >= 1000, "the returned buffer is reused");
      Scratch<std::vector<float>> b;
      CHECK_MSG(b->capacity() == 0, "a lease held at the same time gets its own buffer");
      b->assign(2000, 2.0f);
    }
    {
      Scratch<std::vector<float>> a;
      a->assign(kScratchKeepBytes / sizeof(float) + 1, 0.0f);
    }
    {
      Scratch<std::vector<float>> a, b, c;
      const size_t cap = kScratchKeepBytes / sizeof(float);
      CHECK_MSG(a->capacity() < cap && b->capacity() < cap && c->capacity() == 0,
                "a buffer over the limit is not kept: " << a->capacity() << ", " << b->capacity() << ", "
                                                        << c->capacity());
    }
  }).join();
}
