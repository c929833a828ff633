// Runs every registered test; the last line is "N passed, M failed".
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "test_harness.h"

namespace numa_test {

namespace {

struct Entry {
  const char* name;
  TestFn fn;
};

std::vector<Entry>& registry() {
  static std::vector<Entry> r;
  return r;
}

int g_failures = 0;  // failed checks of the running test
std::mt19937_64 g_rng;

}  // namespace

Registrar::Registrar(const char* name, TestFn fn) { registry().push_back(Entry{name, fn}); }

void fail(const char* file, int line, const char* expr, const std::string& msg) {
  if (++g_failures <= 10)
    std::printf("    CHECK failed at %s:%d: %s%s%s\n", file, line, expr, msg.empty() ? "" : " -- ", msg.c_str());
  else if (g_failures == 11)
    std::printf("    (further failures of this test not shown)\n");
}

std::mt19937_64& rng() { return g_rng; }

int64_t uniform(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g_rng); }

}  // namespace numa_test

int main() {
  using namespace numa_test;
  uint64_t seed = 0;
  if (const char* s = std::getenv("HINAMOE_TEST_SEED"); s && *s) {
    seed = std::strtoull(s, nullptr, 0);
  } else {
    seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  std::printf("seed %llu (set HINAMOE_TEST_SEED to reproduce)\n", static_cast<unsigned long long>(seed));
  int passed = 0, failed = 0;
  for (const Entry& e : registry()) {
    g_failures = 0;
    g_rng.seed(seed ^ std::hash<std::string>()(e.name));
    const auto t0 = std::chrono::steady_clock::now();
    e.fn();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s %s (%.0f ms)\n", g_failures == 0 ? "PASS" : "FAIL", e.name, ms);
    (g_failures == 0 ? passed : failed)++;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
