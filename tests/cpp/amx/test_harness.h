// A tiny test harness for hinamoe_amx_tests: TEST(name) registers a case,
// CHECK(...) records a failure without stopping, the seed comes from
// HINAMOE_TEST_SEED (printed), and each test gets its own seeded generator.
#pragma once

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace amxtest {

struct Case {
  const char* name;
  void (*fn)();
};
std::vector<Case>& registry();
struct Registrar {
  Registrar(const char* n, void (*f)()) { registry().push_back({n, f}); }
};

void fail(const char* file, int line, const std::string& what);
std::mt19937_64& rng();  // reseeded per test from the run seed and the test name
uint64_t run_seed();

}  // namespace amxtest

#define TEST(name)                                              \
  static void name();                                           \
  static ::amxtest::Registrar registrar_##name(#name, &name);   \
  static void name()

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) ::amxtest::fail(__FILE__, __LINE__, "CHECK(" #cond ")");        \
  } while (0)

#define CHECK_MSG(cond, msg)                                                             \
  do {                                                                                   \
    if (!(cond)) ::amxtest::fail(__FILE__, __LINE__, std::string("CHECK(" #cond "): ") + (msg)); \
  } while (0)

// Expects `stmt` to throw hinamoe::amx::TileError.
#define CHECK_TILE_ERROR(stmt)                                                        \
  do {                                                                                \
    bool thrown_ = false;                                                             \
    try {                                                                             \
      stmt;                                                                           \
    } catch (const ::hinamoe::amx::TileError&) {                                      \
      thrown_ = true;                                                                 \
    }                                                                                 \
    if (!thrown_) ::amxtest::fail(__FILE__, __LINE__, "no TileError from: " #stmt);   \
  } while (0)
