// hinamoe_amx_tests entry point: runs every registered test, prints the
// seed (HINAMOE_TEST_SEED to reproduce) and "N passed, M failed".
#include <chrono>
#include <cstdlib>
#include <exception>

#include "test_harness.h"

namespace amxtest {
namespace {
int g_failures = 0;
uint64_t g_seed = 0;
std::mt19937_64 g_rng;
}  // namespace

std::vector<Case>& registry() {
  static std::vector<Case> r;
  return r;
}

void fail(const char* file, int line, const std::string& what) {
  if (++g_failures <= 10) std::printf("    %s:%d: %s\n", file, line, what.c_str());
  if (g_failures == 11) std::printf("    (further failures in this test not shown)\n");
}

std::mt19937_64& rng() { return g_rng; }
uint64_t run_seed() { return g_seed; }

}  // namespace amxtest

int main(int argc, char** argv) {
  using namespace amxtest;
  const char* env = std::getenv("HINAMOE_TEST_SEED");
  g_seed = env ? std::strtoull(env, nullptr, 0)
               : uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  std::printf("seed %llu (set HINAMOE_TEST_SEED to reproduce)\n", (unsigned long long)g_seed);
  const char* only = argc > 1 ? argv[1] : nullptr;  // optional substring filter
  int passed = 0, failed = 0;
  for (const Case& c : registry()) {
    if (only && std::string(c.name).find(only) == std::string::npos) continue;
    g_failures = 0;
    g_rng.seed(g_seed ^ std::hash<std::string>()(c.name));
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.fn();
    } catch (const std::exception& e) {
      fail(__FILE__, __LINE__, std::string("exception: ") + e.what());
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s %s (%.0f ms)\n", g_failures ? "FAIL" : "ok  ", c.name, ms);
    (g_failures ? failed : passed)++;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
