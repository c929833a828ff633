// Which tiers this CPU runs: CPUID for the instructions, XGETBV for whether
// the OS saves the register state they use (YMM; for AVX-512 also the
// opmask and ZMM registers): without it AVX code faults even if CPUID says yes.
#include <cstdint>
#include <cstring>

#include "amx/amx_detect.h"
#include "tier.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define HINAMOE_X86 1
#endif

namespace hinamoe {
namespace {

struct Features {
  bool avx2 = false, fma = false, f16c = false, os_ymm = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, os_zmm = false;
  bool avx_vnni = false;     // VEX vpdpbusd on ymm
  bool avx512_vnni = false;  // EVEX vpdpbusd on zmm
  bool avx512_bf16 = false;  // vcvtne2ps2bf16, vdpbf16ps
};

Features detect() {
  Features f;
#ifdef HINAMOE_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1u, avx = (c >> 28) & 1u;
  f.fma = (c >> 12) & 1u;
  f.f16c = (c >> 29) & 1u;
  if (osxsave && avx) {
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    f.os_ymm = (lo & 0x6u) == 0x6u;    // XMM and YMM state enabled
    f.os_zmm = (lo & 0xe6u) == 0xe6u;  // and opmask, ZMM0-15 upper halves, ZMM16-31
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = (b >> 5) & 1u;
    f.avx512f = (b >> 16) & 1u;
    f.avx512dq = (b >> 17) & 1u;
    f.avx512bw = (b >> 30) & 1u;
    f.avx512vl = (b >> 31) & 1u;
    f.avx512_vnni = (c >> 11) & 1u;
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    f.avx_vnni = (a >> 4) & 1u;
    f.avx512_bf16 = (a >> 5) & 1u;
  }
#endif
  return f;
}

const Features& features() {
  static const Features f = detect();  // thread-safe static init
  return f;
}

}  // namespace

std::string avx_vnni_unavailable_reason() {
  const std::string avx2 = tier_unavailable_reason("avx2");
  if (!avx2.empty()) return avx2;
  return features().avx_vnni ? "" : "CPU lacks AVX-VNNI (CPUID.7.1:EAX[4])";
}

std::string avx512_bf16_unavailable_reason() {
  const std::string avx512 = tier_unavailable_reason("avx512");
  if (!avx512.empty()) return avx512;
  return features().avx512_bf16 ? "" : "CPU lacks AVX512-BF16 (CPUID.7.1:EAX[5])";
}

std::string avx512_vnni_unavailable_reason() {
  const std::string avx512 = tier_unavailable_reason("avx512");
  if (!avx512.empty()) return avx512;
  return features().avx512_vnni ? "" : "CPU lacks AVX512-VNNI (CPUID.7.0:ECX[11])";
}

const char* tier_names() { return "auto, amx, avx512, avx2, ref, amx-emu"; }

std::string tier_unavailable_reason(const std::string& name) {
  if (name == "ref" || name == "amx-emu") return "";
  if (name == "amx") {
    const std::string why = amx_unavailable_reason();
    return why.empty() ? "" : "tier amx: " + why;
  }
  if (name == "avx2") {
#ifndef HINAMOE_X86
    return "tier avx2 needs an x86-64 CPU";
#else
    const Features& f = features();
    std::string missing;
    if (!f.avx2) missing += " AVX2";
    if (!f.fma) missing += " FMA";
    if (!f.f16c) missing += " F16C";
    if (!missing.empty()) return "tier avx2 needs CPU support for" + missing;
    if (!f.os_ymm) return "tier avx2 needs the OS to save YMM registers (XGETBV says it does not)";
    return "";
#endif
  }
  if (name == "avx512") {
#ifndef HINAMOE_X86
    return "tier avx512 needs an x86-64 CPU";
#else
    const Features& f = features();
    std::string missing;
    if (!f.avx512f) missing += " AVX512F";
    if (!f.avx512bw) missing += " AVX512BW";
    if (!f.avx512vl) missing += " AVX512VL";
    if (!f.avx512dq) missing += " AVX512DQ";
    if (!f.avx2) missing += " AVX2";  // the kernels are compiled with these too
    if (!f.fma) missing += " FMA";
    if (!f.f16c) missing += " F16C";
    if (!missing.empty()) return "tier avx512 needs CPU support for" + missing;
    if (!f.os_zmm)
      return "tier avx512 needs the OS to save ZMM and opmask registers (XGETBV says it does not)";
    return "";
#endif
  }
  return "unknown kernel tier '" + name + "' (expected one of: " + tier_names() + ")";
}

std::vector<std::string> supported_tiers() {
  std::vector<std::string> out;
  if (tier_unavailable_reason("amx").empty()) out.push_back("amx");
  if (tier_unavailable_reason("avx512").empty()) out.push_back("avx512");
  if (tier_unavailable_reason("avx2").empty()) out.push_back("avx2");
  out.push_back("ref");
  out.push_back("amx-emu");
  return out;
}

const KernelTier* select_tier(const std::string& name, std::string* error) {
  const std::string want = name == "auto" ? supported_tiers().front() : name;
  const std::string why = tier_unavailable_reason(want);
  if (!why.empty()) {
    if (error) *error = why;
    return nullptr;
  }
  if (error) error->clear();
  if (want == "amx") return &amx_tier();
  if (want == "amx-emu") return &amx_emu_tier();
  if (want == "avx512") return &avx512_tier();
  return want == "avx2" ? &avx2_tier() : &ref_tier();
}

}  // namespace hinamoe
