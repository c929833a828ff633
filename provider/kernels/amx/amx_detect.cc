// AMX detection: CPUID.7.0:EDX[24] AMX-TILE and [22] AMX-BF16 ([25] AMX-INT8
// for the int8 kernels), XCR0[17] XTILECFG and [18] XTILEDATA enabled by the
// OS, and Linux's
// arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) — without the last,
// the first tile instruction that touches TILEDATA raises SIGILL.
#include "amx_detect.h"

#include <cerrno>
#include <cstring>

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define HINA_AMX_DETECT 1
#endif

namespace hinamoe {

#if HINA_AMX_DETECT
namespace {

constexpr long kArchGetXcompPerm = 0x1022;
constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtiledata = 18;

unsigned long long xgetbv0() {
  unsigned lo, hi;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

std::string request_permission() {
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    const int e = errno;
    return std::string("kernel refused AMX tile data (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): ") +
           std::strerror(e) + ")";
  }
  unsigned long long perm = 0;  // double-check the grant took effect
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &perm) != 0 || !(perm & (1ull << kXfeatureXtiledata)))
    return "kernel did not grant AMX tile data (ARCH_GET_XCOMP_PERM lacks XFEATURE_XTILEDATA)";
  return "";
}

}  // namespace

std::string amx_cpu_os_reason() {
  unsigned a, b, c, d;
  if (__get_cpuid_max(0, nullptr) < 7) return "CPU lacks CPUID leaf 7 (no AMX)";
  __cpuid_count(7, 0, a, b, c, d);
  if (!(d & (1u << 24))) return "CPU lacks AMX-TILE (CPUID.7.0:EDX[24])";
  if (!(d & (1u << 22))) return "CPU lacks AMX-BF16 (CPUID.7.0:EDX[22])";
  __cpuid(1, a, b, c, d);
  if (!(c & (1u << 27))) return "OS has not enabled XSAVE (CPUID.1:ECX[27] OSXSAVE)";
  const unsigned long long xcr0 = xgetbv0();
  if (!(xcr0 & (1ull << 17))) return "OS does not enable AMX tile config state (XCR0[17] XTILECFG)";
  if (!(xcr0 & (1ull << 18))) return "OS does not enable AMX tile data state (XCR0[18] XTILEDATA)";
  return "";
}

std::string amx_unavailable_reason() {
  static const std::string reason = [] {
    std::string r = amx_cpu_os_reason();
    return r.empty() ? request_permission() : r;
  }();
  return reason;
}

std::string amx_int8_unavailable_reason() {
  const std::string r = amx_unavailable_reason();
  if (!r.empty()) return r;
  unsigned a, b, c, d;
  __cpuid_count(7, 0, a, b, c, d);
  return (d & (1u << 25)) ? "" : "CPU lacks AMX-INT8 (CPUID.7.0:EDX[25])";
}

#else

std::string amx_cpu_os_reason() { return "AMX detection needs an x86-64 Linux build"; }
std::string amx_unavailable_reason() { return amx_cpu_os_reason(); }
std::string amx_int8_unavailable_reason() { return amx_cpu_os_reason(); }

#endif

}  // namespace hinamoe
