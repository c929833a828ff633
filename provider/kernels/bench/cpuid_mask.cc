// libhinamoe_cpuid_mask.so: preloaded into a benchmark process
// (LD_PRELOAD, HINAMOE_CPUID_MASK=avx2 | avx512), it makes every library in
// the process see a CPU without the instruction sets above that level, so
// ORT's CPU EP (MLAS), ggml and HinaMoE all pick the kernels they would
// pick on such a CPU. That is how a same-instruction-set comparison is
// measured on a host with more (hina-bench --cpu-as).
//
// How: Linux CPUID faulting (arch_prctl ARCH_SET_CPUID 0, x86 flag
// cpuid_fault) turns every CPUID instruction of this thread, and of the
// threads it creates later, into SIGSEGV. The handler runs the real CPUID
// with faulting briefly off, clears the hidden feature bits and steps over
// the instruction. Other faults go to the handler that was there before.
// XGETBV cannot be trapped; the libraries we care about require the CPUID
// bit as well as the OS state bit, so clearing the CPUID bits suffices.
#include <asm/prctl.h>
#include <cpuid.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr uint32_t bit(int i) { return 1u << i; }

// Bits hidden for "avx2": every AVX-512 extension, AVX10, AVX-VNNI and the
// other VEX extensions newer than AVX2, and AMX. "avx512" hides only AMX.
struct Hidden {
  uint32_t l7_0_ebx = 0, l7_0_ecx = 0, l7_0_edx = 0, l7_1_eax = 0, l7_1_edx = 0, l0d_eax = 0;
};

constexpr uint32_t kAmxEdx = bit(22) | bit(24) | bit(25);  // AMX-BF16, AMX-TILE, AMX-INT8
constexpr uint32_t kAmx71Eax = bit(21);                    // AMX-FP16
constexpr uint32_t kAmx71Edx = bit(8);                     // AMX-COMPLEX
constexpr uint32_t kAmxXcr0 = bit(17) | bit(18);           // XTILECFG, XTILEDATA state

Hidden g_hide;
struct sigaction g_prev;

bool set_faulting(bool on) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, on ? 0 : 1) == 0; }

void on_segv(int sig, siginfo_t* info, void* ctx) {
  auto* uc = static_cast<ucontext_t*>(ctx);
  auto& g = uc->uc_mcontext.gregs;
  const auto* ip = reinterpret_cast<const uint8_t*>(g[REG_RIP]);
  // A faulted CPUID arrives with si_code SI_KERNEL; only then read the ip.
  if (info->si_code == SI_KERNEL && ip != nullptr && ip[0] == 0x0f && ip[1] == 0xa2) {
    const uint32_t leaf = uint32_t(g[REG_RAX]), sub = uint32_t(g[REG_RCX]);
    uint32_t a, b, c, d;
    const int saved = errno;
    set_faulting(false);
    __cpuid_count(leaf, sub, a, b, c, d);
    set_faulting(true);
    errno = saved;
    if (leaf == 7 && sub == 0) {
      b &= ~g_hide.l7_0_ebx;
      c &= ~g_hide.l7_0_ecx;
      d &= ~g_hide.l7_0_edx;
    } else if (leaf == 7 && sub == 1) {
      a &= ~g_hide.l7_1_eax;
      d &= ~g_hide.l7_1_edx;
    } else if (leaf == 0xd && sub == 0) {
      a &= ~g_hide.l0d_eax;
    } else if (leaf == 0x24 && (g_hide.l7_1_edx & bit(19))) {
      a = b = c = d = 0;  // AVX10 leaf, hidden with AVX10
    }
    g[REG_RAX] = a;
    g[REG_RBX] = b;
    g[REG_RCX] = c;
    g[REG_RDX] = d;
    g[REG_RIP] += 2;
    return;
  }
  // Not ours: hand over to whoever was installed before (or die as usual).
  if (g_prev.sa_flags & SA_SIGINFO) {
    g_prev.sa_sigaction(sig, info, ctx);
  } else if (g_prev.sa_handler != SIG_DFL && g_prev.sa_handler != SIG_IGN) {
    g_prev.sa_handler(sig);
  } else {
    signal(sig, SIG_DFL);  // the faulting instruction runs again and kills
  }
}

[[noreturn]] void fail(const char* why) {
  std::fprintf(stderr, "hinamoe cpuid mask: %s\n", why);
  std::fflush(stderr);
  _exit(87);
}

__attribute__((constructor)) void install() {
  const char* level = std::getenv("HINAMOE_CPUID_MASK");
  if (level == nullptr || *level == '\0') return;
  Hidden h;
  h.l7_0_edx = kAmxEdx;
  h.l7_1_eax = kAmx71Eax;
  h.l7_1_edx = kAmx71Edx;
  h.l0d_eax = kAmxXcr0;
  if (std::strcmp(level, "avx2") == 0) {
    // EBX: F, DQ, IFMA, PF, ER, CD, BW, VL.
    h.l7_0_ebx = bit(16) | bit(17) | bit(21) | bit(26) | bit(27) | bit(28) | bit(30) | bit(31);
    // ECX: VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ.
    h.l7_0_ecx = bit(1) | bit(6) | bit(11) | bit(12) | bit(14);
    // EDX: 4VNNIW, 4FMAPS, VP2INTERSECT, FP16.
    h.l7_0_edx |= bit(2) | bit(3) | bit(8) | bit(23);
    // 7.1 EAX: AVX-VNNI, AVX512-BF16, AVX-IFMA; EDX: AVX-VNNI-INT8, AVX-NE-CONVERT, AVX10.
    h.l7_1_eax |= bit(4) | bit(5) | bit(23);
    h.l7_1_edx |= bit(4) | bit(5) | bit(19);
    h.l0d_eax |= bit(5) | bit(6) | bit(7);  // opmask, ZMM_Hi256, Hi16_ZMM state
  } else if (std::strcmp(level, "avx512") != 0) {
    fail("HINAMOE_CPUID_MASK must be avx2 or avx512");
  }
  g_hide = h;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGSEGV, &sa, &g_prev) != 0) fail("cannot install the SIGSEGV handler");
  if (!set_faulting(true))
    fail("CPUID faulting is not available here (arch_prctl ARCH_SET_CPUID failed; "
         "/proc/cpuinfo needs the cpuid_fault flag)");
}

}  // namespace
