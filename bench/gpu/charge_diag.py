"""What the shim charges a workload against what its GPU work really took
(issue 22's diagnosis of per-class charge bias), one process per row.

Each row runs one limits_work.py class for --secs under the shim (preloaded,
CUDA_DEVICE_SM_LIMIT=99 policy force, so it is charged but hardly held; the
monitor off with --raw: no feedback, the charges are the per-launch measured
costs alone, as a container that never ran alone is charged) with torch's
profiler (CUPTI) on, and reports over the same window:

  cupti_kernel  the sum of the kernels' GPU durations (CUPTI), and their union
                (time any kernel ran: what NVML's busy share measures)
  cupti_other   memset and memcpy time (not kernel launches the shim sees)
  charged       the region's gpu_time_ns (what the shim charged)
  nvml          the device's busy share (nvmlDeviceGetUtilizationRates, every 50 ms) x window

A row with --bare runs without the shim. Read-only on the GPU's settings.

    python3 bench/gpu/charge_diag.py --out FILE [--classes dyn,small,...] [--secs 3] [--raw] [--bare]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SHIM = Path(os.environ.get("HAMID_BENCH_SHIM") or ROOT / "shim" / "build" / "libvgpu.so")


class _Util(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def nvml_busy_sampler():
    """A thread sampling the device's busy share every 50 ms; returns (samples list, stop event)."""
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    lib.nvmlInit_v2()
    h = ctypes.c_void_p()
    lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h))
    out: list = []
    stop = threading.Event()

    def loop():
        u = _Util()
        while not stop.is_set():
            if lib.nvmlDeviceGetUtilizationRates(h, ctypes.byref(u)) == 0:
                out.append((time.time(), u.gpu))
            time.sleep(0.05)
    threading.Thread(target=loop, daemon=True).start()
    return out, stop


def child(cls: str, secs: float) -> dict:
    """Runs in the measured process: warm-up, then the profiled window."""
    sys.path.insert(0, str(HERE))
    import torch
    import limits_work as lw
    torch.cuda.init()
    step = lw.make(cls)
    t = time.perf_counter()
    while time.perf_counter() - t < 1.5:
        step()
    torch.cuda.synchronize()
    samples, stop = nvml_busy_sampler()
    time.sleep(0.3)
    from torch.profiler import ProfilerActivity, profile
    g0 = lw.region_read()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.time()
        while time.time() - t0 < secs:
            step()
        torch.cuda.synchronize()
        t1 = time.time()
    g1 = lw.region_read()
    time.sleep(1.2)  # NVML's sample covering the window's end
    stop.set()
    fd, trace = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    prof.export_chrome_trace(trace)
    ev = json.load(open(trace)).get("traceEvents", [])
    os.unlink(trace)
    kern, other, spans = 0.0, {}, []
    names: dict = {}
    for e in ev:
        cat = e.get("cat", "")
        if e.get("ph") != "X" or "dur" not in e:
            continue
        if cat == "kernel":
            kern += e["dur"]
            spans.append((e["ts"], e["ts"] + e["dur"]))
            names[e["name"][:60]] = names.get(e["name"][:60], 0) + e["dur"]
        elif cat in ("gpu_memset", "gpu_memcpy"):
            other[cat] = other.get(cat, 0) + e["dur"]
    spans.sort()
    union, end = 0.0, None
    for a, b in spans:
        if end is None or a > end:
            union += b - a
            end = b
        elif b > end:
            union += b - end
            end = b
    # NVML's samples cover the preceding 1/6..1 s: those taken from 0.5 s into the window to its end + 0.5 s
    busy = [u for ts, u in samples if t0 + 0.5 <= ts <= t1 + 0.5]
    win = t1 - t0
    return {"cls": cls, "window_s": win, "kernels": len(spans), "cupti_kernel_s": kern / 1e6,
            "cupti_union_s": union / 1e6, "cupti_other_s": {k: v / 1e6 for k, v in other.items()},
            "charged_s": None if g0 is None else (g1 - g0) / 1e9,
            "nvml_busy_s": (sum(busy) / len(busy) / 100 * win) if busy else None,
            "top": sorted(((v / 1e6, k) for k, v in names.items()), reverse=True)[:8]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--classes", default="gemm,small,dyn,train,graph")
    ap.add_argument("--secs", type=float, default=3)
    ap.add_argument("--raw", action="store_true", help="the shim's monitor off: no feedback (k_gap 0, k_all 1)")
    ap.add_argument("--bare", action="store_true", help="also each class without the shim")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(a.child, a.secs)), flush=True)
        return
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="chargediag-"))
    for cls in a.classes.split(","):
        for bare in ([True] if a.bare else []) + [False]:
            e = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_DEVICE_", "LD_PRELOAD"))}
            if not bare:
                e.update(LD_PRELOAD=str(SHIM), CUDA_DEVICE_SM_LIMIT="99", GPU_CORE_UTILIZATION_POLICY="force",
                         CUDA_DEVICE_MEMORY_SHARED_CACHE=str(tmp / f"{cls}-{time.time_ns()}.cache"))
                if a.raw:
                    e["HAMID_SHIM_NO_MONITOR"] = "1"
            p = subprocess.run([sys.executable, __file__, "--out", a.out, "--child", cls, "--secs", str(a.secs)],
                               env=e, capture_output=True, text=True, timeout=300)
            res = next((json.loads(x[7:]) for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
            row = {"cls": cls, "shim": None if bare else str(SHIM), "raw": a.raw, "result": res,
                   "stderr": p.stderr[-3000:]}
            rows.append(row)
            if res:
                print(f"{cls:6} {'bare' if bare else 'shim'}: window {res['window_s']:.2f} s, kernels "
                      f"{res['cupti_kernel_s']:.3f} s (union {res['cupti_union_s']:.3f}), other "
                      f"{res['cupti_other_s']}, charged {res['charged_s']}, NVML {res['nvml_busy_s']}", flush=True)
            else:
                print(f"{cls} failed: {p.stderr[-2000:]}", flush=True)
    Path(a.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
