"""`python -m hinamoe`: versions, library path, kernel tiers and EP devices."""
from __future__ import annotations

import platform
import sys


def main() -> int:
    import onnxruntime as ort

    import hinamoe

    print(f"hinamoe      {hinamoe.__version__}")
    print(f"onnxruntime  {ort.__version__}")
    print(f"python       {sys.version.split()[0]} ({platform.machine()})")
    print(f"library      {hinamoe.get_library_path()}")
    print(f"EP name      {hinamoe.get_ep_name()}")
    best = hinamoe.best_tier()
    print(f"kernel tier  {best}  (what isa=auto uses on this CPU)")
    gqa = hinamoe.gqa_tier("auto")
    if gqa != best:
        print(f"GQA tier     {gqa}  (isa=auto runs GroupQueryAttention on {gqa} here; isa={best} picks {best})")
    notes = {"amx-emu": " (AMX kernels on the software tile emulator: slow, for tests)"}
    for name in ("amx", "avx512", "avx2", "ref", "amx-emu"):
        why = hinamoe.tier_unavailable_reason(name)
        state = "available" + notes.get(name, "") if not why else "unavailable: " + why
        print(f"  {name:<8} {state}")
    print(f"NUMA nodes   {hinamoe.numa_nodes('auto')}  (option numa=auto; run under "
          "`numactl --interleave=all` on multi-socket machines)")
    devices = hinamoe.get_ep_devices()
    print(f"EP devices   {len(devices)}")
    for d in devices:
        meta = dict(d.ep_metadata)
        print(f"  {d.ep_name} on {d.device.type} (vendor {d.ep_vendor}): {meta}")
    return 0 if devices else 1


if __name__ == "__main__":
    sys.exit(main())
