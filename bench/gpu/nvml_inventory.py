#!/usr/bin/env python3
"""Read the real GPU through hamid's NVML backend and compare with the catalog.

Read-only: it never changes MIG mode or any other setting. Prints the
inventory the daemon would record and, for a model in the simulated catalog,
every difference between the catalog's MIG table and what NVML reports
(profile names, IDs, instance counts, SM counts, placements, memory).
Exit status 1 on a difference in anything but memory per profile (memory is
printed, and the catalog may round).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hamid.devices.catalog import MODELS  # noqa: E402
from hamid.devices.nvml import NvmlBackend  # noqa: E402


def main() -> int:
    b = NvmlBackend()
    bad = 0
    for g in b.gpus():
        print(json.dumps({"index": g.index, "uuid": g.uuid, "name": g.name, "memory_mib": g.memory_mib,
                          "sm_count": g.sm_count, "numa": g.numa_node, "healthy": g.healthy,
                          "mig_capable": g.mig_capable, "mig_enabled": g.mig_enabled,
                          "memory_slices": g.memory_slices, "compute_slices": g.compute_slices,
                          "live_instances": len(g.mig_instances)}))
        print(f"{'profile':<12}{'id':>4}{'max':>5}{'SMs':>5}{'MiB':>8}  placements")
        for p in g.mig_profiles:
            print(f"{p.name:<12}{p.profile_id:>4}{p.max_instances:>5}{p.sm_count:>5}{p.memory_mib:>8}  "
                  + " ".join(f"{x.start}:{x.size}" for x in p.placements))
        model = next((m for m in MODELS.values() if m.nvml_name == g.name), None)
        if model is None:
            print(f"GPU {g.index}: {g.name!r} is not in the catalog")
            continue
        if (model.memory_mib, model.sm_count) != (g.memory_mib, g.sm_count):
            print(f"DIFF total: catalog {model.memory_mib} MiB/{model.sm_count} SMs, NVML {g.memory_mib}/{g.sm_count}")
            bad += 1
        real = {p.name: p for p in g.mig_profiles}
        for cp in model.mig_profiles:
            rp = real.pop(cp.name, None)
            if rp is None:
                print(f"DIFF {cp.name}: in the catalog, not reported by NVML")
                bad += 1
                continue
            for f in ("profile_id", "max_instances", "sm_count", "slices", "placements"):
                if getattr(cp, f) != getattr(rp, f):
                    print(f"DIFF {cp.name}.{f}: catalog {getattr(cp, f)}, NVML {getattr(rp, f)}")
                    bad += 1
            if cp.memory_mib != rp.memory_mib:
                print(f"note {cp.name}.memory_mib: catalog {cp.memory_mib}, NVML {rp.memory_mib}")
        for name in real:
            print(f"DIFF {name}: reported by NVML, not in the catalog")
            bad += 1
    b.close()
    print("catalog matches NVML" if not bad else f"{bad} difference(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
