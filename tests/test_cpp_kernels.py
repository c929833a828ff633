"""Builds and runs the C++ kernel tests (tests/cpp) against the operator
library, once plain and once under AddressSanitizer + UBSan."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "provider" / "kernels"

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("g++") is None,
                                reason="needs cmake and g++")


def _build_and_run(name: str, sanitize: bool) -> str:
    build = ROOT / "build" / f"cpp-tests-{name}"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(KERNELS), "-B", str(build), *gen,
                    "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                    f"-DHINAMOE_SANITIZE={'ON' if sanitize else 'OFF'}"],
                   check=True, capture_output=True, text=True)
    subprocess.run(["cmake", "--build", str(build), "--target", "hinamoe_kernel_tests", "-j", "2"],
                   check=True, capture_output=True, text=True)
    env = dict(os.environ)
    if sanitize:
        env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=1"
        env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
    proc = subprocess.run([str(build / "hinamoe_kernel_tests")], capture_output=True, text=True,
                          env=env, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    m = re.search(r"^(\d+) passed, (\d+) failed", out, re.M)
    assert m, out[-3000:]
    assert int(m.group(1)) > 0 and int(m.group(2)) == 0, out[-3000:]
    return out


def test_kernel_tests_plain():
    _build_and_run("plain", sanitize=False)


def test_kernel_tests_asan_ubsan():
    _build_and_run("asan", sanitize=True)
