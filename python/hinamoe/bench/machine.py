"""Facts about the machine a benchmark runs on: its CPU's name, last-level
cache, and the HinaMoE tier it runs."""

from __future__ import annotations

import sys
from pathlib import Path

L3_BYTES_DEFAULT = 32 * 2 ** 20


def l3_bytes() -> int:
    try:
        base = Path("/sys/devices/system/cpu/cpu0/cache")
        best = 0
        for idx in base.glob("index*"):
            level = int((idx / "level").read_text())
            if level == 3:
                size = (idx / "size").read_text().strip()
                mult = {"K": 1024, "M": 2 ** 20}.get(size[-1], 1)
                best = max(best, int(size.rstrip("KM")) * mult)
        return best or L3_BYTES_DEFAULT
    except Exception:
        return L3_BYTES_DEFAULT


def cpu_name() -> str:
    """The CPU's model name, with "(seen as avx2)" under hina-bench --cpu-as."""
    from .cpu_mask import active

    seen_as = f" (seen as {active()}: hina-bench --cpu-as)" if active() else ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + seen_as
    except OSError:
        pass
    import platform

    return (platform.processor() or platform.machine()) + seen_as


def hinamoe_tier(isa: str = "auto") -> str | None:
    """Registers the EP and returns the kernel tier `isa` selects on this CPU;
    if the EP is not usable or the CPU cannot run that tier, prints why and
    returns None (before any model is built)."""
    try:
        import hinamoe

        hinamoe.register()
        if isa == "auto":
            return hinamoe.best_tier()
        why = hinamoe.tier_unavailable_reason(isa)
    except Exception as exc:  # noqa: BLE001
        print(f"hina-bench: the HinaMoE EP is not usable: {exc}\n"
              "  (build/install it, or pass --no-hinamoe to time the CPU EP alone)",
              file=sys.stderr)
        return None
    if why:
        print(f"hina-bench: --isa {isa}: {why}", file=sys.stderr)
        return None
    return isa
