"""Why many alternating kernel shapes run past a 30 % limit: a breakdown for
the H100 benchmark's 'many shapes' row (shim_bench.py, step 11).

For three workloads of torch_work.py (the row's 'shapes': 320 matmul sizes
and their ReLUs, shuffled; 'shapes_mm': the same matmuls without the ReLUs;
'shape_one': one of those shapes, M = 10240, with its ReLU) it runs bare, in
slots 0-30 and rate-only at 30 %, and reports per limited run:

  share     steps/s over bare's (throughput share)
  util      NVML utilization over bare's (GPU-time share)
  charged   the GPU time the shim charged (the region's gpu_time_ns, whole
            process) over the GPU time the process really used, taken as
            its steps (warm-ups included) times bare's GPU time per step
            (bare runs GPU-bound; its power-capped clocks make this a little
            high for the matmuls)
  throttle  the region's throttle_ns over the process's time

Then 'shapes' once more in each mode with HAMID_SHIM_LOG_LEVEL=4, its stderr
summarised (estimate lines, samples clamped at the 500 ns floor, slot
calibration lines) and kept under --out. Read-only on the GPU's settings.

    python3 bench/gpu/shapes_diag.py --work DIR_WITH_REGIONDUMP --out DIR
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import shim_bench as sb  # noqa: E402

WORKLOADS = ("shapes", "shapes_mm", "shape_one")
SECS = "4"


def one(workload: str, e: dict) -> tuple[dict, dict | None, float]:
    t0 = time.time()
    with sb.GpuSampler() as smp:
        got = sb.last_json(sb.run([*sb.TORCH, "one", workload, SECS, "0"], e, timeout=240))
    return got, smp.window(*got["_windows"][workload]), time.time() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    sb.WORK = Path(a.work)
    out = Path(a.out)
    res: dict = {}
    lines = ["| workload | mode | share % | util % | charged / used | throttle / wall |", "|---|---|---|---|---|---|"]
    for w in WORKLOADS:
        bare, bgpu, _ = one(w, sb.env(False))
        ns_per_step = 1e9 / bare[w]
        res[w] = {"bare": {"rate": bare[w], "gpu": bgpu, "steps": bare["_steps_total"]}}
        for mode, extra in (("slots", {"HAMID_SM_SLOTS": "0-30"}), ("rate", {})):
            reg = sb.region_path()
            got, g, wall = one(w, sb.env(region=reg, CUDA_DEVICE_SM_LIMIT=30, **extra))
            d = sb.dump(reg)["devices"][0]
            used = got["_steps_total"] * ns_per_step
            r = {"share": got[w] / bare[w], "util": (g or {}).get("util", 0) / ((bgpu or {}).get("util") or 1),
                 "sm_mhz": (g or {}).get("sm_mhz"), "charged_over_used": d["gpu_time_ns"] / used,
                 "throttle_over_wall": d["throttle_ns"] / (wall * 1e9), "region": d,
                 "steps": got["_steps_total"]}
            res[w][mode] = r
            lines.append(f"| {w} | {mode} | {r['share'] * 100:.1f} | {r['util'] * 100:.1f} | "
                         f"{r['charged_over_used']:.2f} | {r['throttle_over_wall']:.2f} |")
            print(lines[-1], flush=True)
        (out / "shapes_diag.json").write_text(json.dumps(res, indent=1, default=str))
    for mode, extra in (("slots", {"HAMID_SM_SLOTS": "0-30"}), ("rate", {})):
        e = sb.env(CUDA_DEVICE_SM_LIMIT=30, HAMID_SHIM_LOG_LEVEL=4, **extra)
        p = subprocess.run([*sb.TORCH, "one", "shapes", SECS, "0"], env=e, capture_output=True, text=True,
                           timeout=240)
        (out / f"shapes_debug_{mode}.log").write_text(p.stderr[-12_000_000:])
        est = [(int(m.group(1)), int(m.group(2)))
               for m in re.finditer(r"estimate [0-9a-f]+: sample (\d+) ns, estimate (\d+) ns", p.stderr)]
        cal = re.findall(r"slot calibration: charged ([\d.]+) ms, took ([\d.]+) ms, k ([\d.]+)", p.stderr)
        summary = {"rc": p.returncode, "estimate_lines": len(est), "samples_at_floor": sum(1 for s, _ in est if s <= 500),
                   "median_sample_ns": sorted(s for s, _ in est)[len(est) // 2] if est else None,
                   "calibrations": len(cal), "last_calibrations": cal[-5:],
                   "share": (sb.last_json(p.stdout)["shapes"] / res["shapes"]["bare"]["rate"]) if p.returncode == 0
                   else None}
        res[f"debug_{mode}"] = summary
        print(mode, "debug:", json.dumps(summary), flush=True)
    (out / "shapes_diag.json").write_text(json.dumps(res, indent=1, default=str))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
