"""``hina-bench --cpu-as avx2``: run a benchmark as on a CPU without the
instruction sets above AVX2, so ONNX Runtime's CPU EP (MLAS), ggml builds
that choose their kernels at run time, and HinaMoE's ``auto`` all pick what
they would pick on an AVX2 machine. On a host with AVX-512 the CPU EP
otherwise runs its AVX-512/VNNI kernels beside HinaMoE's ``avx2`` tier, which
is not a same-instruction-set comparison.

The process re-executes itself with ``libhinamoe_cpuid_mask.so`` preloaded
(provider/kernels/bench/cpuid_mask.cc): Linux CPUID faulting turns each CPUID
instruction into a signal whose handler answers with the hidden bits cleared.
ggml compiled with ``GGML_NATIVE=ON`` has its instruction set fixed at build
time; the ffn benchmark leaves such a build out under ``--cpu-as avx2``.
"""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

LEVELS = ("avx2", "avx512")
ENV = "HINAMOE_CPUID_MASK"
LIBRARY = "libhinamoe_cpuid_mask.so"
_SYS_ARCH_PRCTL, _ARCH_GET_CPUID = 158, 0x1011  # x86-64 syscall number, <asm/prctl.h>


def library_path() -> Path:
    return Path(__file__).resolve().parent.parent / LIBRARY


def active() -> str | None:
    """The level this process runs under (set by the re-execution), or None."""
    level = os.environ.get(ENV)
    return level if level in LEVELS and LIBRARY in os.environ.get("LD_PRELOAD", "") else None


def host_reason() -> str:
    """Why this host cannot hide CPUID bits (the OS, the CPU or its
    hypervisor); "" when it can."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"--cpu-as needs Linux on x86-64 (this is {sys.platform} on {platform.machine()})"
    try:
        flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "")
    except OSError:
        flags = ""
    if "cpuid_fault" not in flags.split():
        return ("--cpu-as needs CPUID faulting, and /proc/cpuinfo lacks the cpuid_fault flag "
                "(the CPU, or its hypervisor, does not offer it)")
    # A seccomp filter (some containers) may refuse arch_prctl itself.
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_GET_CPUID, 0) < 0:
        return f"--cpu-as: arch_prctl(ARCH_GET_CPUID) failed: {os.strerror(ctypes.get_errno())}"
    return ""


def unavailable_reason() -> str:
    """Why --cpu-as cannot work here; "" when it can."""
    why = host_reason()
    if why:
        return why
    lib = library_path()
    if not lib.is_file():
        return f"--cpu-as: {lib} is missing (reinstall hinamoe)"
    if any(c in str(lib) for c in " :"):
        return f"--cpu-as: LD_PRELOAD cannot name {lib} (a space or colon in the path)"
    return ""


def reexec(level: str, argv: list[str]) -> None:
    """Replace this process by ``python -m hinamoe.bench <argv>`` under the
    mask; raises SystemExit with the reason when that is not possible."""
    why = unavailable_reason()
    if why:
        raise SystemExit(f"hina-bench: {why}")
    if os.environ.get(ENV) == level:  # already re-executed once: the preload did not stay
        raise SystemExit(f"hina-bench --cpu-as {level}: {LIBRARY} is not in LD_PRELOAD after "
                         "re-executing; something removed it")
    env = dict(os.environ)
    env[ENV] = level
    env["LD_PRELOAD"] = " ".join(p for p in (str(library_path()), env.get("LD_PRELOAD", "")) if p)
    # faulthandler would take SIGSEGV from the mask's handler at start-up.
    env.pop("PYTHONFAULTHANDLER", None)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "hinamoe.bench", *argv], env)


def verify(level: str) -> str:
    """In the re-executed process: checks that the hidden instruction sets
    are hidden (HinaMoE's own CPUID-based detection must not see them) and
    returns the line the benchmarks print."""
    from .. import _native

    hidden_tier = "avx512" if level == "avx2" else "amx"
    if not _native.tier_unavailable_reason(hidden_tier):
        raise SystemExit(f"hina-bench --cpu-as {level}: the mask did not take effect "
                         f"(tier {hidden_tier} is still usable); is {LIBRARY} preloaded?")
    return (f"--cpu-as {level}: CPUID hides every instruction set above {level.upper()} from "
            f"this process (ORT's CPU EP, ggml's run-time dispatch, HinaMoE's auto -> "
            f"{_native.best_tier()})")
