"""hina-bench --cpu-as: the preloaded CPUID mask hides the instruction sets
above a level from the whole process (every thread, every library), leaves
the rest of CPUID alone, and keeps ordinary crashes crashes.

The reference for what the CPU has is the kernel's own view (/proc/cpuinfo
flags); the process under test runs the CPUID instruction itself, from
machine code mapped with ctypes, in the main thread and in a new thread."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from hinamoe.bench import cpu_mask

pytestmark = pytest.mark.skipif(bool(cpu_mask.host_reason()),
                                reason=cpu_mask.host_reason() or "available")


def test_the_mask_library_is_installed():
    assert cpu_mask.unavailable_reason() == ""

# Runs CPUID(leaf 7, sub 0) and CPUID(1) in the main thread and in a fresh
# thread; prints [[ebx7, ecx7, edx7, ecx1], ...] for both as JSON.
PROBE = r"""
import ctypes, json, mmap, threading
# uint32 f(uint32 leaf, uint32 sub, uint32 *out4): cpuid, store eax..edx
code = bytes([0x53, 0x49, 0x89, 0xd0, 0x89, 0xf8, 0x89, 0xf1, 0x0f, 0xa2,
              0x41, 0x89, 0x00, 0x41, 0x89, 0x58, 0x04, 0x41, 0x89, 0x48, 0x08,
              0x41, 0x89, 0x50, 0x0c, 0x5b, 0xc3])
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
fn = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32))(addr)
def regs(leaf, sub):
    out = (ctypes.c_uint32 * 4)()
    fn(leaf, sub, out)
    return list(out)
def probe():
    l7, l1 = regs(7, 0), regs(1, 0)
    return [l7[1], l7[2], l7[3], l1[2]]
res = [probe()]
t = threading.Thread(target=lambda: res.append(probe()))
t.start(); t.join()
print(json.dumps(res))
"""


def _env(level: str | None) -> dict:
    env = dict(os.environ)
    env.pop("PYTHONFAULTHANDLER", None)
    if level is not None:
        env["LD_PRELOAD"] = str(cpu_mask.library_path())
        env[cpu_mask.ENV] = level
    return env


def _probe(level: str | None) -> list[list[int]]:
    r = subprocess.run([sys.executable, "-c", PROBE], env=_env(level), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _cpuinfo_flags() -> set[str]:
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _bit(x: int, i: int) -> bool:
    return bool((x >> i) & 1)


def test_unmasked_cpuid_matches_the_kernels_view():
    flags = _cpuinfo_flags()
    for ebx7, ecx7, _edx7, ecx1 in _probe(None):
        assert _bit(ebx7, 5) == ("avx2" in flags)
        assert _bit(ebx7, 16) == ("avx512f" in flags)
        assert _bit(ecx7, 11) == ("avx512_vnni" in flags)
        assert _bit(ecx1, 12) == ("fma" in flags)


@pytest.mark.parametrize("level", cpu_mask.LEVELS)
def test_mask_hides_above_level_in_every_thread(level):
    flags = _cpuinfo_flags()
    plain = _probe(None)[0]
    masked = _probe(level)
    assert len(masked) == 2  # main thread, then a thread created after the mask
    for ebx7, ecx7, edx7, ecx1 in masked:
        # What the level keeps is kept, bit for bit where nothing is hidden.
        assert ecx1 == plain[3]
        assert _bit(ebx7, 5) == ("avx2" in flags)
        assert not _bit(edx7, 24) and not _bit(edx7, 25)  # AMX-TILE, AMX-INT8
        if level == "avx2":
            for i in (16, 17, 21, 26, 27, 28, 30, 31):  # AVX-512 F, DQ, IFMA, PF, ER, CD, BW, VL
                assert not _bit(ebx7, i)
            for i in (1, 6, 11, 12, 14):  # VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ
                assert not _bit(ecx7, i)
        else:
            assert ebx7 == plain[0] and ecx7 == plain[1]


def test_other_segfaults_still_kill_the_process():
    r = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.string_at(0)"],
                       env=_env("avx2"), capture_output=True, timeout=60)
    assert r.returncode == -signal.SIGSEGV


def test_unknown_level_is_a_clear_error():
    r = subprocess.run([sys.executable, "-c", "print('ran')"], env=_env("avx1"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "ran" not in r.stdout
    assert "HINAMOE_CPUID_MASK must be avx2 or avx512" in r.stderr


def test_hina_bench_cpu_as_runs_the_avx2_tier(tmp_path):
    """End to end: the CLI re-executes itself under the mask; HinaMoE's auto
    and the recorded machine facts say avx2, and the points ran."""
    out = tmp_path / "res"
    r = subprocess.run(
        [sys.executable, "-m", "hinamoe.bench", "--cpu-as", "avx2", "ffn", "--quick",
         "--models", "qwen3-30b-a3b:8", "--dtypes", "int4", "--tokens", "1", "--threads", "1",
         "--no-ggml", "--no-plot", "--no-progress", "--out", str(out)],
        env=_env(None), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--cpu-as avx2: CPUID hides" in r.stdout
    res = json.loads((out / "results.json").read_text())
    assert res["meta"]["cpu_as"] == "avx2" and res["meta"]["tier"] == "avx2"
    assert "seen as avx2" in res["meta"]["cpu"]
    eps = {p["ep"] for p in res["points"]}
    assert {"HinaMoE", "CPU"} <= eps


def test_a_lost_preload_is_an_error_not_a_loop():
    """A re-executed process whose LD_PRELOAD lost the mask stops with a
    message instead of re-executing itself forever."""
    env = _env(None)
    env[cpu_mask.ENV] = "avx2"
    r = subprocess.run([sys.executable, "-m", "hinamoe.bench", "--cpu-as", "avx2", "ffn", "--list-models"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "not in LD_PRELOAD after re-executing" in r.stderr
