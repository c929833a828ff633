// Runs every registered test (or those whose name contains argv[1]); prints
// "N passed, M failed" (counted checks) and exits non-zero on failure. Each
// test starts with rng() seeded from the run seed and its name; an exception
// escaping a test is a failure of that test.
#include <chrono>
#include <cstdlib>
#include <exception>

#include "test_util.h"

namespace ht {
uint64_t seed() {
  static const uint64_t s = [] {
    const char* env = std::getenv("HINAMOE_TEST_SEED");
    const uint64_t v = env && *env ? std::strtoull(env, nullptr, 0)
                                   : (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
    std::printf("seed %llu (set HINAMOE_TEST_SEED to reproduce)\n", (unsigned long long)v);
    return v;
  }();
  return s;
}
}  // namespace ht

int main(int argc, char** argv) {
  auto& r = ht::Registry::get();
  ht::seed();
  const char* only = argc > 1 ? argv[1] : nullptr;  // optional substring filter
  for (auto& [name, fn] : r.tests) {
    if (only && !std::strstr(name, only)) continue;
    r.current = name;
    const int f0 = r.failed;
    const auto t0 = std::chrono::steady_clock::now();
    ht::reseed(ht::seed() ^ ht::name_hash(name));
    try {
      fn();
    } catch (const std::exception& e) {
      ht::check(false, std::string("uncaught exception: ") + e.what());
    } catch (...) {
      ht::check(false, "uncaught exception of unknown type");
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-28s %s (%.2f s)\n", name, r.failed == f0 ? "ok" : "FAILED", s);
    std::fflush(stdout);
  }
  std::printf("%d passed, %d failed\n", r.passed, r.failed);
  return r.failed == 0 ? 0 : 1;
}
