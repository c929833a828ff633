// Tiny test harness for the NUMA tests: TEST(name) registers a function,
// CHECK/CHECK_MSG record failures (a test fails if any check fails), and
// every test gets an RNG seeded from the run seed (HINAMOE_TEST_SEED) and its
// name, so a failure reproduces with the printed seed.
#pragma once

#include <cstdint>
#include <random>
#include <sstream>
#include <string>

namespace numa_test {

using TestFn = void (*)();

struct Registrar {
  Registrar(const char* name, TestFn fn);
};

// Records a failed check of the running test (printed, up to a limit).
void fail(const char* file, int line, const char* expr, const std::string& msg);
// The running test's RNG.
std::mt19937_64& rng();
// Uniform integer in [lo, hi].
int64_t uniform(int64_t lo, int64_t hi);

}  // namespace numa_test

#define TEST(name)                                                    \
  static void name();                                                 \
  static const numa_test::Registrar name##_registrar(#name, &name);   \
  static void name()

#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) numa_test::fail(__FILE__, __LINE__, #cond, "");      \
  } while (0)

// msg is a stream expression: CHECK_MSG(a == b, "a=" << a << " b=" << b)
#define CHECK_MSG(cond, msg)                                          \
  do {                                                                \
    if (!(cond)) {                                                    \
      std::ostringstream os_;                                         \
      os_ << msg;                                                     \
      numa_test::fail(__FILE__, __LINE__, #cond, os_.str());          \
    }                                                                 \
  } while (0)
