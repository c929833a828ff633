// Run-time AMX detection: the CPU has the instructions, the OS saves the
// tile state, and the kernel has granted this process tile-data permission.
#pragma once

#include <string>

namespace hinamoe {

// "" when the *_amx kernels may run in this process; otherwise why not,
// naming the failing check, e.g. "CPU lacks AMX-TILE (CPUID.7.0:EDX[24])".
// The first call requests ARCH_REQ_XCOMP_PERM (process-wide, once); the
// answer is cached. Thread-safe.
std::string amx_unavailable_reason();

// The detection steps without the permission request (for tests/reports):
// same messages, "" if CPUID and XCR0 allow AMX.
std::string amx_cpu_os_reason();

// "" when the AMX-INT8 kernels (qmoe_i8.h *_amx) may run: everything
// amx_unavailable_reason() checks, plus AMX-INT8 (CPUID.7.0:EDX[25]).
std::string amx_int8_unavailable_reason();

}  // namespace hinamoe
