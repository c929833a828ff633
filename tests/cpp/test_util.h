// The one test harness of hinamoe_kernel_tests (tests/cpp, tests/cpp/amx,
// tests/cpp/numa) plus helpers shared by the kernel tests: TEST(name)
// registers a case; ht::check / CHECK / CHECK_MSG / CHECK_THROWS count one
// result each and print failures; rng() is reseeded before every test from
// the run seed (HINAMOE_TEST_SEED, printed) and the test's name, so a failure
// reproduces with the seed, also when run alone (filter argument); seeded
// random data, exact f16/bf16 encodings written independently of the
// library, and NaN poisoning.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace ht {

struct Registry {
  std::vector<std::pair<const char*, std::function<void()>>> tests;
  int passed = 0, failed = 0;
  std::string current;
  static Registry& get() {
    static Registry r;
    return r;
  }
};

struct Register {
  Register(const char* name, std::function<void()> fn) { Registry::get().tests.push_back({name, std::move(fn)}); }
};

#define HT_CAT2(a, b) a##b
#define HT_CAT(a, b) HT_CAT2(a, b)
#define TEST(name)                                              \
  static void name();                                           \
  static ::ht::Register HT_CAT(ht_reg_, name)(#name, &name);    \
  static void name()

// One check = one counted result. Prints failures with the current test name.
inline bool check(bool ok, const std::string& what) {
  auto& r = Registry::get();
  if (ok) {
    ++r.passed;
  } else {
    ++r.failed;
    std::printf("FAIL [%s] %s\n", r.current.c_str(), what.c_str());
    std::fflush(stdout);
  }
  return ok;
}

// check() with the source location and expression (the CHECK macros).
inline bool check_at(bool ok, const char* file, int line, const char* expr, const std::string& msg) {
  if (ok) return check(true, "");
  const char* base = std::strrchr(file, '/');
  return check(false, std::string(base ? base + 1 : file) + ":" + std::to_string(line) + ": " + expr +
                          (msg.empty() ? "" : " -- " + msg));
}

// Stable 64-bit FNV-1a of a test name (seeds the per-test generator).
inline uint64_t name_hash(const char* s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; ++s) h = (h ^ uint8_t(*s)) * 1099511628211ull;
  return h;
}

template <class... A>
std::string fmt(const char* f, A... a) {
  char buf[1024];
  std::snprintf(buf, sizeof buf, f, a...);
  return buf;
}

// The run's seed: HINAMOE_TEST_SEED or fresh from random_device.
uint64_t seed();
inline std::mt19937_64& rng() {
  static std::mt19937_64 g(seed());
  return g;
}
// Reseeds rng() (the runner does this before each test).
inline void reseed(uint64_t s) { rng().seed(s); }
inline double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng()); }
inline int64_t randint(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng()); }

// ---- exact encodings (independent of the library's conversions) ----
inline uint32_t fbits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bitsf(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// Decodes IEEE half from first principles.
inline double half_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 31) v = m ? NAN : INFINITY;
  else if (e == 0) v = std::ldexp(double(m), -24);
  else v = std::ldexp(double(1024 + m), e - 25);
  return s ? -v : v;
}

// Encodes a value that is exactly a half (checked); used for test data.
inline uint16_t half_exact(double v) {
  if (std::isnan(v)) return 0x7e00;
  if (std::isinf(v)) return v > 0 ? 0x7c00 : 0xfc00;
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  double a = std::fabs(v);
  if (a == 0) return sign;
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  uint16_t h;
  if (e < -13) {  // subnormal: a = m * 2^-24
    h = uint16_t(std::ldexp(a, 24));
  } else {
    const double m = std::ldexp(a, 11 - e) - 1024;  // 10 mantissa bits
    h = uint16_t(((e + 14) << 10) | int(m));
  }
  h |= sign;
  if (half_value(h) != v) std::printf("test bug: %.17g is not a half\n", v);
  return h;
}

inline uint16_t bf16_exact(double v) {
  if (std::isnan(v)) return 0x7fc0;
  const uint32_t u = fbits(float(v));
  if ((u & 0xffff) != 0 || double(float(v)) != v) std::printf("test bug: %.17g is not a bfloat16\n", v);
  return uint16_t(u >> 16);
}

// Test data of one dtype: the exact values (as double) and the raw bytes the
// library reads. dtype: 0 f32, 1 f16, 2 bf16.
struct Buf {
  int dtype = 0;
  std::vector<double> val;
  std::vector<uint8_t> raw;
  const void* data() const { return raw.empty() ? nullptr : raw.data(); }
  void* data() { return raw.empty() ? nullptr : raw.data(); }
  size_t size() const { return val.size(); }
};

// Random values on a grid every dtype represents exactly: f32 any float,
// f16 i/1024 (|i| <= 1024), bf16 i/128 (|i| <= 128), times scale (a power of 2).
inline double grid_value(int dtype, double scale) {
  if (dtype == 0) return double(float(uniform(-1, 1) * scale));
  const int64_t n = dtype == 1 ? 1024 : 128;
  int64_t i;
  do i = randint(-n, n); while (i == 0 && randint(0, 3) != 0);  // few exact zeros
  return double(i) / double(n) * scale;
}

inline void encode(Buf& b) {
  const size_t es = b.dtype == 0 ? 4 : 2;
  b.raw.assign(b.val.size() * es, 0);
  for (size_t i = 0; i < b.val.size(); ++i) {
    if (b.dtype == 0) {
      const float f = float(b.val[i]);
      std::memcpy(&b.raw[i * 4], &f, 4);
    } else {
      const uint16_t h = b.dtype == 1 ? half_exact(b.val[i]) : bf16_exact(b.val[i]);
      std::memcpy(&b.raw[i * 2], &h, 2);
    }
  }
}

inline Buf random_buf(int dtype, size_t n, double scale) {
  Buf b;
  b.dtype = dtype;
  b.val.resize(n);
  for (auto& v : b.val) v = grid_value(dtype, scale);
  encode(b);
  return b;
}

// Reads element i of raw output of `dtype` (NaN stays NaN).
inline double read_raw(const void* p, size_t i, int dtype) {
  if (dtype == 0) { float f; std::memcpy(&f, static_cast<const uint8_t*>(p) + 4 * i, 4); return f; }
  uint16_t h;
  std::memcpy(&h, static_cast<const uint8_t*>(p) + 2 * i, 2);
  return dtype == 1 ? half_value(h) : double(bitsf(uint32_t(h) << 16));
}

// Fills with NaN of the dtype (0xff bytes are NaN in all three).
inline void poison(std::vector<uint8_t>& v) { std::memset(v.data(), 0xff, v.size()); }

inline const char* dtype_str(int d) { return d == 0 ? "f32" : d == 1 ? "f16" : "bf16"; }

// A GEMM's float output Y [M, ldy]: columns c < cols against ref(m, c) =
// {exact sum, sum of |terms|} within float32 summation error of K terms, the
// padding columns beyond untouched (0xff bytes). Reports the first 3 wrong
// values with `what`; returns how many were wrong.
template <class Ref>
int check_gemm_output(const std::vector<float>& Y, int64_t M, int64_t ldy, int64_t cols, int64_t K, Ref&& ref,
                      const std::string& what) {
  int bad = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < ldy; ++c) {
      const float got = Y[size_t(m * ldy + c)];
      bool ok;
      double want = 0;
      if (c < cols) {
        const auto [sum, mag] = ref(m, c);
        want = sum;
        ok = std::fabs(double(got) - sum) <= double(K + 2) * 1.2e-7 * mag + 1e-30;
      } else {
        ok = fbits(got) == 0xffffffffu;  // padding untouched
      }
      if (!ok && bad++ < 3)
        check(false, fmt("%s m=%lld col=%lld: got %.9g want %.9g", what.c_str(), (long long)m, (long long)c, got, want));
    }
  return bad;
}

}  // namespace ht

// CHECK(cond): one counted result. CHECK_MSG(cond, msg): msg is a stream
// expression, built only on failure: CHECK_MSG(a == b, "a=" << a << " b=" << b).
#define CHECK(cond) ::ht::check_at(static_cast<bool>(cond), __FILE__, __LINE__, "CHECK(" #cond ")", std::string())
#define CHECK_MSG(cond, msg)                                                                  \
  do {                                                                                        \
    if (cond) {                                                                               \
      ::ht::check(true, "");                                                                  \
    } else {                                                                                  \
      std::ostringstream ht_os_;                                                              \
      ht_os_ << msg;                                                                          \
      ::ht::check_at(false, __FILE__, __LINE__, "CHECK(" #cond ")", ht_os_.str());            \
    }                                                                                         \
  } while (0)
// CHECK_THROWS(stmt, Exception): `stmt` must throw Exception (or a subclass).
#define CHECK_THROWS(stmt, Exception)                                                         \
  do {                                                                                        \
    bool ht_thrown_ = false;                                                                  \
    try {                                                                                     \
      stmt;                                                                                   \
    } catch (const Exception&) {                                                              \
      ht_thrown_ = true;                                                                      \
    }                                                                                         \
    ::ht::check_at(ht_thrown_, __FILE__, __LINE__, "CHECK_THROWS(" #stmt ", " #Exception ")", \
                   std::string());                                                            \
  } while (0)
