"""The shim's H100 benchmark: PyTorch and CUDA programs with and without
libvgpu.so, every ratio against a baseline measured in the same run, printed
as one table beside HAMi-core's published H100 figures.

Owns orchestration only: each measurement is a separate process
(torch_work.py or cbench), because the shim reads its limits once per
process. Started by bench/gpu/run.sh, which builds what this needs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIM = ROOT / "shim" / "build" / "libvgpu.so"
TORCH = [sys.executable, str(ROOT / "bench" / "gpu" / "torch_work.py")]
MiB = 1 << 20
GiB = 1 << 30

R: dict = {}
ROWS: list[tuple[str, str, str, str]] = []
WORK = Path(tempfile.gettempdir())


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def region_path() -> str:
    fd, p = tempfile.mkstemp(prefix="region-", suffix=".cache", dir=WORK)
    os.close(fd)
    os.unlink(p)
    return p


# Every variable the shim reads a limit or policy from: dropped from the inherited environment, since the
# hardened shim refuses CUDA on any value it cannot parse and a stray one would change a row.
SHIM_VARS = ("CUDA_DEVICE_", "HAMID_", "LD_PRELOAD", "GPU_CORE_UTILIZATION_POLICY", "CUDA_TASK_PRIORITY")
LIMITS_PATH = "/usr/local/vgpu/hamid.limits"  # the daemon's limits file (shim/include/hamid_limits.h)


def env(preload=True, region=None, **kv) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(SHIM_VARS)}
    e["PYTHONUNBUFFERED"] = "1"
    if preload:
        e["LD_PRELOAD"] = str(SHIM)
        e["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = region or region_path()
    e.update({k: str(v) for k, v in kv.items()})
    return e


def run(cmd, e, timeout=180) -> str:
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[-3:]} rc={p.returncode}\nstdout: {p.stdout[-1500:]}\nstderr: {p.stderr[-3000:]}")
    return p.stdout


def last_json(out: str) -> dict:
    for ln in reversed(out.splitlines()):
        if ln.startswith("{"):
            return json.loads(ln)
    raise RuntimeError(f"no JSON in {out[-500:]}")


def cbench(*args) -> list[str]:
    return [str(WORK / "cbench"), *map(str, args)]


def dump(region: str) -> dict:
    return json.loads(subprocess.run([str(WORK / "regiondump"), region], capture_output=True, text=True,
                                     check=True).stdout)


def host_apps() -> dict[int, int]:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, env=env(False)).stdout
    res = {}
    for ln in out.splitlines():
        parts = [x.strip() for x in ln.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
            res[int(parts[0])] = int(parts[1]) * MiB
    return res


class GpuSampler:
    """nvidia-smi sampling GPU utilization (the share of time a kernel ran), SM clock and power."""

    def __enter__(self):
        self.p = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,utilization.gpu,clocks.sm,power.draw",
                                   "--format=csv,noheader,nounits", "-lms", "100"], env=env(False),
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *a):
        self.p.terminate()
        out, _ = self.p.communicate(timeout=30)
        self.rows = []
        for ln in out.splitlines():
            parts = [x.strip() for x in ln.split(",")]
            try:
                ts = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                self.rows.append((ts, float(parts[1]), float(parts[2]), float(parts[3])))
            except (ValueError, IndexError):
                continue

    def window(self, t0, t1):
        sel = [r for r in self.rows if t0 + 0.3 <= r[0] <= t1]
        if not sel:
            return None
        return {k: statistics.mean(r[i] for r in sel) for i, k in ((1, "util"), (2, "sm_mhz"), (3, "watts"))}


def step(name):
    def deco(fn):
        def wrapped():
            t0 = time.time()
            log(f"== {name}")
            try:
                fn()
            except Exception as ex:  # noqa: BLE001 - one failed step must not lose the rest
                R.setdefault("errors", {})[name] = f"{type(ex).__name__}: {ex}"
                log(f"!! {name} failed: {ex}")
                traceback.print_exc()
            log(f"   ({time.time() - t0:.1f} s)")
        return wrapped
    return deco


def row(what, value, target, hami):
    ROWS.append((what, value, target, hami))
    log(f"   {what}: {value} (target {target}; HAMi-core {hami})")


# ---------------------------------------------------------------------------

@step("info")
def info():
    q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                       capture_output=True, text=True).stdout.strip()
    tv = subprocess.run([*TORCH[:1], "-c", "import torch;print(torch.__version__, torch.version.cuda)"],
                        capture_output=True, text=True).stdout.strip()
    R["info"] = {"gpu": q, "torch": tv, "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    log(R["info"])


@step("memory limit")
def memory_limit():
    for backend in ("native", "cudaMallocAsync"):
        kv = dict(CUDA_DEVICE_MEMORY_LIMIT="4g", HAMID_SHIM_LOG_LEVEL=4)
        if backend != "native":
            kv["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
        p = subprocess.run([*TORCH, "memlimit"], env=env(**kv), capture_output=True, text=True, timeout=180)
        res = last_json(p.stdout)
        res["unknown_driver_addresses"] = p.stderr.count("unknown driver address")
        res["shim_errors"] = [ln for ln in p.stderr.splitlines() if "ERROR" in ln][:5]
        R[f"memlimit_{backend}"] = res
        row(f"4 GiB limit, PyTorch {backend}: 3 GiB / 5 GiB alloc, total seen",
            f"{res['alloc_3g']} / {res['alloc_5g']}, {res['total'] / GiB:.2f} GiB", "ok / oom, 4.00 GiB",
            "ok / refused, 4 GiB")


@step("contexts the program makes")
def own_contexts():
    """cuCtxCreate, 1 GiB cuMemAlloc, cuCtxDestroy without a free, five times under a 4 GiB limit: the
    driver frees each round's GiB with its context, so must the shim (or the fourth round is refused)."""
    out = run(cbench("ctx_cycle", 5, 1024), env(CUDA_DEVICE_MEMORY_LIMIT="4g"))
    rounds = [int(ln.split()[2]) for ln in out.splitlines() if ln.startswith("round ")]
    free, total = (int(x) for x in [ln for ln in out.splitlines() if ln.startswith("meminfo ")][0].split()[1:3])
    R["own_contexts"] = {"rounds": rounds, "free": free, "total": total}
    row("4 GiB limit: 5 x (cuCtxCreate, 1 GiB cuMemAlloc, cuCtxDestroy without a free), then used / total",
        f"{sum(1 for r in rounds if r == 0)}/{len(rounds)} ok, {(total - free) / MiB:.0f} / {total / MiB:.0f} MiB",
        "5/5 ok, the primary context's use only", "-")
    # A live context of its own beside the primary one: its overhead counts, also without NVML's figure.
    for reconcile in (False, True):
        reg = region_path()
        p = subprocess.Popen(cbench("ctx_hold", 1024), env=env(region=reg, CUDA_DEVICE_MEMORY_LIMIT="4g",
                                                               HAMID_NVML_RECONCILE=int(reconcile)),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            expect_ready(p)
            time.sleep(0.5)
            inside = dump(reg)["devices"][0]["used"]
            host = host_apps().get(p.pid, 0)
        finally:
            p.communicate("x\n", timeout=60)
        key = "reconciled" if reconcile else "tracking_only"
        R.setdefault("own_context_live", {})[key] = {"inside": inside, "host": host}
        err = (inside - host) / host * 100 if host else float("nan")
        row(f"primary context + a live context of its own (cuCtxCreate) with 1 GiB in it, in-container vs host "
            f"NVML, {'NVML-reconciled' if reconcile else 'tracking only'}",
            f"{inside / MiB:.0f} vs {host / MiB:.0f} MiB ({err:+.2f}%)", "within 2%", "-")


@step("nvidia-smi inside")
def smi_inside():
    reg = region_path()
    holder = subprocess.Popen([*TORCH, "hold", "1024"], env=env(region=reg, CUDA_DEVICE_MEMORY_LIMIT="4g"),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ln = holder.stdout.readline()
        assert ln.startswith("ready"), ln + holder.stderr.read()
        q = ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"]
        inside = subprocess.run(q, env=env(region=reg, CUDA_DEVICE_MEMORY_LIMIT="4g"), capture_output=True,
                                text=True).stdout.strip()
        host = subprocess.run(q, env=env(False), capture_output=True, text=True).stdout.strip()
        full = subprocess.run(["nvidia-smi"], env=env(region=reg, CUDA_DEVICE_MEMORY_LIMIT="4g"),
                              capture_output=True, text=True).stdout
        d = dump(reg)
        R["smi"] = {"inside": inside, "host": host, "region_used": d["devices"][0]["used"], "screen": full[-1500:]}
        row("nvidia-smi inside: used / total MiB", inside.replace(",", " /"), "container use / 4096",
            "used / limit")
    finally:
        holder.communicate("x\n", timeout=60)


def expect_ready(p: subprocess.Popen) -> None:
    """Read one line of a holder process; anything but 'ready' ends it and raises with its stderr."""
    ln = p.stdout.readline()
    if not ln.startswith("ready"):
        p.kill()  # before reading its stderr: a launcher would hold it open
        raise RuntimeError(f"not ready: {ln!r} {p.stderr.read()[-3000:]}")


def ns_to_host(unshare_pid: int) -> dict[int, int]:
    """pid in the namespace -> host pid, for the processes of the pid namespace `unshare --fork` made."""
    kids = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
    ns = os.readlink(f"/proc/{kids[0]}/ns/pid")
    out = {}
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and os.readlink(d / "ns" / "pid") == ns:
                nspid = [ln for ln in (d / "status").read_text().splitlines() if ln.startswith("NSpid:")][0].split()
                out[int(nspid[-1])] = int(nspid[1])
        except (OSError, IndexError):
            continue
    return out


def accounting(reconcile: bool, pidns: bool = False):
    """Four processes of one container against the host's per-process NVML figures. With pidns they run in
    a pid namespace of their own, as in a real container: NVML lists them by host pid, and the shim must find
    that pid to read its own figure (the region's host_pid)."""
    reg = region_path()
    kv = dict(CUDA_DEVICE_MEMORY_LIMIT="60g", HAMID_NVML_RECONCILE=1 if reconcile else 0)
    cmds = [cbench("hold", 512, 256, 256, 128, 64)] * 3 + [[*TORCH, "hold", "1024"]]
    e = env(region=reg, **kv)
    if pidns:
        # its own /proc too, as a container has (CUDA fails with error 304 in a pid namespace that still
        # sees the host's /proc)
        procs = [subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                                   str(ROOT / "bench" / "gpu" / "pidns.py"), json.dumps(cmds)], env=e,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
        waits = [(procs[0], len(cmds))]
    else:
        procs = [subprocess.Popen(c, env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for c in cmds]
        waits = [(p, 1) for p in procs]
    try:
        for p, n in waits:
            for _ in range(n):
                expect_ready(p)
        time.sleep(1.0)
        d = dump(reg)
        host = host_apps()
        per = []
        hostpid = ns_to_host(procs[0].pid) if pidns else {}
        for s in d["procs"]:
            hp = hostpid.get(s["pid"], 0) if pidns else s["pid"]
            per.append({"pid": s["pid"], "host_pid": hp, "nvml_pid": s.get("nvml_pid"), "inside": s["used"],
                        "host": host.get(hp), "context": s["context"]})
        R["host_apps_" + ("pidns" if pidns else "plain")] = host
        inside_total = d["devices"][0]["used"]
        host_total = sum(x["host"] or 0 for x in per)
        found = sum(1 for x in per if x["host"])
        worst = max((abs(x["inside"] - x["host"]) / x["host"] for x in per if x["host"]), default=float("nan"))
        key = "accounting" + ("" if reconcile else "_no_reconcile") + ("_pidns" if pidns else "")
        R[key] = {"procs": per, "inside_total": inside_total, "host_total": host_total, "worst_proc_err": worst,
                  "host_pid_found": found}
        label = ("NVML-reconciled" if reconcile else "tracking only") + (", in a pid namespace" if pidns else "")
        err = (inside_total - host_total) / host_total * 100 if host_total else float("nan")
        row(f"4 procs (VMM, pools, async, array, cuBLAS) in-container vs host NVML, {label}",
            f"total {inside_total / MiB:.0f} vs {host_total / MiB:.0f} MiB ({err:+.2f}%), worst process "
            f"{worst * 100:.2f}%" + (f", NVML pid (inside) found for {sum(1 for x in per if x['nvml_pid'])}"
                                     f"/{len(per)}" if pidns else ""),
            "within 2%", "0.13% (1 proc, cuBLAS + buffers); under-counts VMM/pools")
    finally:
        for p in procs:
            try:
                p.communicate("x\n", timeout=60)
            except Exception:  # noqa: BLE001
                p.kill()


@step("accounting")
def accounting_both():
    accounting(True)
    accounting(False)
    accounting(True, pidns=True)


@step("matmul throughput, no limit")
def matmul_ratio():
    bare, shim = [], []
    for _ in range(3):
        bare.append(last_json(run([*TORCH, "matmul", "3"], env(False)))["tflops"])
        shim.append(last_json(run([*TORCH, "matmul", "3"], env()))["tflops"])
    ratio = statistics.median(shim) / statistics.median(bare)
    R["matmul"] = {"bare": bare, "shim": shim, "ratio": ratio}
    row("8192^3 bf16 matmul, shim (no limit) / bare", f"{ratio:.4f} ({statistics.median(shim):.0f} vs "
        f"{statistics.median(bare):.0f} TFLOP/s)", ">= 0.995", "0.996")


@step("launch cost")
def launch_cost():
    """Observe mode does all the limiter's work on every launch (estimate, charge, sampling with events) but
    never holds a launch back, so the difference to bare is the limiter's cost alone; an enforced limit on
    empty kernels would add the holding back it exists for."""
    res = {}
    cases = [("bare", env(False)), ("shim, no limit", env()),
             ("shim, limit 50, rate limit, observe mode", env(CUDA_DEVICE_SM_LIMIT=50, HAMID_SM_LIMIT_MODE="observe")),
             ("shim, limit 50 in time slots 0-50, observe mode",
              env(CUDA_DEVICE_SM_LIMIT=50, HAMID_SM_SLOTS="0-50", HAMID_SM_LIMIT_MODE="observe"))]
    # Interleaved rounds, every process pinned to the same core (unpinned, the
    # core a process lands on moved the bare figure by 0.7 us between runs);
    # per process its best batch; per case the median over rounds of its
    # difference to the same round's bare process (rounds drift by ~1 us).
    pin = ["taskset", "-c", str(min(3, (os.cpu_count() or 1) - 1))]
    rounds = 21
    for _ in range(rounds):
        for name, e in cases:
            out = run([*pin, *cbench("launch_cost", 200, 40)], e)
            res.setdefault(name, []).append(float(out.split()[-1]))
    bare = res["bare"]
    added = {k: [a - b for a, b in zip(v, bare)] for k, v in res.items() if k != "bare"}
    med = {k: statistics.median(v) for k, v in added.items()}
    R["launch_ns"] = {"added_median_paired": med, "rounds": res}
    q = sorted(bare)
    iqr = (q[3 * len(q) // 4] - q[len(q) // 4]) / 1000
    row(f"empty-kernel launch (CPU side, batches of 200, pinned, {rounds} rounds), bare",
        f"{statistics.median(bare) / 1000:.3f} us (interquartile range over rounds {iqr:.3f} us)", "-", "about 4 us")
    for name, v in added.items():
        d = sorted(v)
        row(f"added per launch, {name} (median of paired rounds, IQR)",
            f"{med[name] / 1000:+.3f} us ({d[len(d) // 4] / 1000:+.2f} .. {d[3 * len(d) // 4] / 1000:+.2f})",
            "~0 (no limit), <= 0.3 us (limit)", "no difference above noise (no limit)")


@step("allocation rate, 8 processes")
def alloc_rate():
    def once(preload):
        reg = region_path()
        start = time.time_ns() + int(3e9)
        e = env(preload, region=reg, CUDA_DEVICE_MEMORY_LIMIT="70g") if preload else env(False)
        ps = [subprocess.Popen(cbench("alloc_rate", 3, 64, start), env=e, stdout=subprocess.PIPE, text=True)
              for _ in range(8)]
        tot = 0.0
        for p in ps:
            out, _ = p.communicate(timeout=120)
            n, ns = out.split()[-2:]
            tot += int(n) / (int(ns) / 1e9)
        return tot
    bare, shim = [], []
    for _ in range(4):  # interleaved rounds, medians: the machine's noise moves single rounds by 5-10 %
        bare.append(once(False))
        shim.append(once(True))
    ratio = statistics.median(shim) / statistics.median(bare)
    R["alloc_rate"] = {"bare": bare, "shim": shim, "ratio": ratio}
    row("cudaMalloc+cudaFree 64 MiB, 8 processes, shim / bare (median of 4 interleaved rounds)",
        f"{ratio:.3f} ({statistics.median(shim):.0f} vs {statistics.median(bare):.0f} pairs/s)", ">= 0.95", "0.77")


# How the limit is applied: time slots (the shim's HAMID_SM_SLOTS; the daemon gave them until
# issue 39 removed them, having stopped writing them to the limits file: a lone container at L % got 0-L),
# or the rate limit alone, which is all the daemon gives now.
MODES = {"slots": lambda lim, other=None: {"HAMID_SM_SLOTS": f"0-{lim}" if other is None else other},
         "rate": lambda lim, other=None: {}}
MODE_LABEL = {"slots": "time slots (as the daemon gives them)", "rate": "rate limit only (no daemon)"}


@step("compute shares")
def shares():
    secs = 2.5
    with GpuSampler() as smp:
        bare = last_json(run([*TORCH, "shares", str(secs)], env(False), timeout=240))
    R["shares_bare"] = bare
    R["gpu_bare"] = {w: smp.window(*bare["_windows"][w]) for w in bare["_windows"]}
    for mode, extra in MODES.items():
        R[f"shares_{mode}"], R[f"gpu_limited_{mode}"] = {}, {}
        for lim in (10, 30, 50, 90):
            with GpuSampler() as smp:
                got = last_json(run([*TORCH, "shares", str(secs)], env(CUDA_DEVICE_SM_LIMIT=lim, **extra(lim)),
                                    timeout=240))
            R[f"shares_{mode}"][lim] = {w: got[w] / bare[w] for w in bare if not w.startswith("_")}
            R[f"gpu_limited_{mode}"][lim] = {w: smp.window(*got["_windows"][w]) for w in got["_windows"]}
        for w, label in (("matmul", "large matmul (8192^3 bf16)"), ("elementwise", "elementwise, 32M fp32"),
                         ("graph_small", "CUDA graph of 100 small (1M) elementwise kernels")):
            vals = " / ".join(f"{R[f'shares_{mode}'][lim][w] * 100:.1f}" for lim in (10, 30, 50, 90))
            hami = ("99.9 / 100 / 100 / 100" if w == "matmul" else
                    ("12.3 at 10" if w != "graph_small" else "graphs not limited"))
            row(f"share of bare throughput at limits 10/30/50/90 %, {label}, {MODE_LABEL[mode]}", vals,
                "10 / 30 / 50 / 90 (+-5)", hami)
            util = []
            for lim in (10, 30, 50, 90):
                g, b = R[f"gpu_limited_{mode}"][lim].get(w), R["gpu_bare"].get(w)
                util.append(f"{g['util'] / b['util'] * 100:.1f} @{g['sm_mhz']:.0f}MHz" if g and b and b["util"]
                            else "n/a")
            bw = R["gpu_bare"].get(w) or {}
            row(f"  same runs, GPU-time share (NVML utilization / bare's; bare at {bw.get('sm_mhz', 0):.0f} MHz)",
                " / ".join(util), "10 / 30 / 50 / 90 (+-5)", "-")


@step("two containers at 30 and 70")
def pairs():
    bare = R.get("shares_bare") or last_json(run([*TORCH, "shares", "2.5"], env(False), timeout=240))
    R["pairs"] = {}
    cases = [("slots", (30, 70), ("0-30", "30-100")), ("rate", (30, 70), (None, None)),
             ("none", (None, None), (None, None))]
    for w in ("matmul", "graph_small"):
        for mode, lims, slots in cases:
            start = time.time_ns() + int(10e9)  # both started (torch import, CUDA init) by then
            envs = []
            for lim, sl in zip(lims, slots):
                kv = {"CUDA_DEVICE_SM_LIMIT": lim} if lim else {}
                if sl:
                    kv["HAMID_SM_SLOTS"] = sl
                envs.append(env(**kv))
            ps = [subprocess.Popen([*TORCH, "one", w, "4", str(start)], env=e,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for e in envs]
            got = []
            for p in ps:
                out, err = p.communicate(timeout=180)
                if p.returncode:
                    raise RuntimeError(err[-2000:])
                got.append(last_json(out)[w] / bare[w])
            R["pairs"][f"{w}_{mode}"] = got
            if mode != "none":
                row(f"two containers 30 % + 70 % together, {w}, {MODE_LABEL[mode]}",
                    f"{got[0] * 100:.1f} / {got[1] * 100:.1f} (sum {sum(got) * 100:.1f})", "30 / 70 (+-5)",
                    "21.4/25.2 it/s vs 23.1/23.1 uncapped (HC#314)")
            else:
                row(f"  baseline: the same two, no limits, {w}", f"{got[0] * 100:.1f} / {got[1] * 100:.1f} "
                    f"(sum {sum(got) * 100:.1f}: time-slicing overhead)", "-", "-")


@step("slot period and power capping")
def period():
    """A large matmul is power-capped when the GPU is fully busy (bare runs at
    lower clocks than a half-idle GPU), so its throughput share at 50 % of the
    time can exceed 50 %. Longer slots let the power cap bite inside them."""
    bare = R.get("shares_bare") or last_json(run([*TORCH, "shares", "2.5"], env(False), timeout=240))
    R["period"] = {}
    periods = (20000, 100000, 250000, 500000)
    for us in periods:
        got = last_json(run([*TORCH, "one", "matmul", "4", "0"],
                            env(CUDA_DEVICE_SM_LIMIT=50, HAMID_SM_SLOTS="0-50", HAMID_SM_PERIOD_US=us), timeout=240))
        R["period"][us] = got["matmul"] / bare["matmul"]
    row("large matmul at 50 % in slots, period 20 / 100 (default) / 250 / 500 ms",
        " / ".join(f"{R['period'][us] * 100:.1f}" for us in periods), "50 (+-5)", "-")


MANY_SHAPES = ("320 matmuls (M = 64..20480 rows, bf16, x 2048 x 2048) in a shuffled order, each followed by a "
               "ReLU: ~640 alternating kernel shapes")


@step("many alternating kernel shapes at 30 %")
def many_shapes():
    """torch_work.py's 'shapes' workload (a loop over 320 matmul sizes and their ReLUs, shuffled) at a 30 %
    limit, in slots and rate-only: the cost table must hold the limit although the shape changes at every
    launch. Throughput share against bare, and GPU-time share (NVML utilization) against bare's."""
    secs = "4"
    res, gpu = {}, {}
    for mode, e in (("bare", env(False)), ("slots", env(CUDA_DEVICE_SM_LIMIT=30, **MODES["slots"](30))),
                    ("rate", env(CUDA_DEVICE_SM_LIMIT=30))):
        with GpuSampler() as smp:
            got = last_json(run([*TORCH, "one", "shapes", secs, "0"], e, timeout=240))
        res[mode] = got["shapes"]
        gpu[mode] = smp.window(*got["_windows"]["shapes"])
    R["many_shapes"] = {"steps_per_s": res, "gpu": gpu, "workload": MANY_SHAPES}
    for mode in ("slots", "rate"):
        g, b = gpu.get(mode), gpu.get("bare")
        util = f"{g['util'] / b['util'] * 100:.1f} @{g['sm_mhz']:.0f}MHz" if g and b and b["util"] else "n/a"
        row(f"many alternating kernel shapes ({MANY_SHAPES}) at 30 %, {MODE_LABEL[mode]}: throughput share / "
            f"GPU-time share (bare at {(b or {}).get('sm_mhz', 0):.0f} MHz)",
            f"{res[mode] / res['bare'] * 100:.1f} / {util}", "30 (+-5)", "-")


@step("limits file in a mount namespace")
def limits_file():
    """The daemon's limits file (hamid.shimlimits.write_limits_file: root, 0644) bound read-only at
    /usr/local/vgpu/hamid.limits in a private mount namespace (limits_check.py): processes with no limit
    variables, or higher ones, are held to the file's 4 GiB and share the region it names; a world-writable
    file refuses CUDA. Outside the namespace the same program with no variables is not limited."""
    sys.path.insert(0, str(ROOT))
    from hamid.shimlimits import ContainerLimits, DeviceLimits, write_limits_file

    uuid = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i", "0"], env=env(False),
                          capture_output=True, text=True, check=True).stdout.strip()
    d = WORK / "limits"
    d.mkdir(mode=0o755)
    region = str(WORK / "limits-region.cache")
    lim = ContainerLimits(devices=(DeviceLimits(uuid=uuid, memory_bytes=4 * GiB),), region_path=region)
    write_limits_file(d / "hamid.limits", lim)
    writable = d / "writable.limits"
    writable.write_bytes((d / "hamid.limits").read_bytes())
    writable.chmod(0o666)
    st = os.stat(d / "hamid.limits")
    made_dir = not os.path.isdir("/usr/local/vgpu")
    if made_dir:
        os.mkdir("/usr/local/vgpu", 0o755)  # a mount point only; the namespace puts a tmpfs on it
    spec = {"file": str(d / "hamid.limits"), "writable_copy": str(writable), "shim": str(SHIM), "region": region,
            "other_region": region_path(), "torch": TORCH, "cbench": str(WORK / "cbench"),
            "regiondump": str(WORK / "regiondump")}
    try:
        p = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable,
                            str(ROOT / "bench" / "gpu" / "limits_check.py"), json.dumps(spec)],
                           capture_output=True, text=True, timeout=400)
        if p.returncode != 0:
            raise RuntimeError(f"limits_check rc={p.returncode}: {p.stdout[-1500:]} {p.stderr[-3000:]}")
        res = last_json(p.stdout)
    finally:
        leaked = os.path.lexists(LIMITS_PATH)
        if made_dir:
            os.rmdir("/usr/local/vgpu")
    control = last_json(run([*TORCH, "tryalloc", "3072", "5120"], env(), timeout=180))
    res.update(written={"uid": st.st_uid, "mode": oct(st.st_mode & 0o7777), "size": st.st_size, "uuid": uuid},
               leaked_outside=leaked, control_outside=control)
    R["limits_file"] = res
    dev = res["region_while_held"]["devices"][0]
    pids = sorted(x["pid"] for x in res["region_while_held"]["procs"])
    row("limits file (4 GiB, root 0644, bound read-only in a mount namespace), no limit variables, beside a "
        "process holding 1 GiB (1.8 with its context): 1 GiB / 3 GiB alloc, total seen",
        f"{res['unset']['allocs']['1024']} / {res['unset']['allocs']['3072']}, {res['unset']['total'] / GiB:.2f} GiB",
        "ok / oom, 4.00 GiB", "- (limits from variables only)")
    row("  same, CUDA_DEVICE_MEMORY_LIMIT(_0)=70g and a region of its own named",
        f"{res['higher']['allocs']['1024']} / {res['higher']['allocs']['3072']}, "
        f"{res['higher']['total'] / GiB:.2f} GiB; its own region created: {res['other_region_exists']}",
        "ok / oom, 4.00 GiB; no", "-")
    row("  the file's region after those two: limit, peak used, live processes",
        f"{dev['limit'] / GiB:.2f} GiB, peak {dev['peak'] / GiB:.2f} GiB, pids {pids} (holder {res['holder_pid']})",
        "4.00 GiB, <= 4.00 GiB, the holder", "-")
    row("  no variables, alone: 3 GiB / 5 GiB alloc, total seen",
        f"{res['alone']['allocs']['3072']} / {res['alone']['allocs']['5120']}, {res['alone']['total'] / GiB:.2f} GiB",
        "ok / oom, 4.00 GiB", "-")
    row("  a world-writable limits file bound instead: CUDA refused",
        f"rc {res['refused']['rc']}, {(res['refused']['stderr'] or ['no shim line'])[0][:220]}",
        "refused, one line naming the file", "-")
    row("  control, outside the namespace, no variables: 3 GiB / 5 GiB alloc, total seen; file visible outside",
        f"{control['allocs']['3072']} / {control['allocs']['5120']}, {control['total'] / GiB:.2f} GiB; {leaked}",
        "ok / ok, the GPU's total; False", "-")


def main():
    global WORK
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    WORK = Path(a.work)
    out = Path(a.out)
    if os.path.lexists(LIMITS_PATH):
        # every row below sets its limits through variables, which the shim ignores when the file is there
        raise SystemExit(f"{LIMITS_PATH} exists on this machine: the shim would take every limit from it; "
                         "run the benchmark where it is absent")
    steps = [info, memory_limit, smi_inside, accounting_both, matmul_ratio, launch_cost, alloc_rate, shares, pairs,
             period, own_contexts, many_shapes, limits_file]
    only = set(filter(None, a.only.split(",")))
    for i, s in enumerate(steps):
        if not only or str(i) in only:
            s()
            # after every step, so a run stopped at its time limit still leaves what it measured
            (out / "results.json").write_text(json.dumps(R, indent=1, default=str))
            (out / "table.md").write_text(table() + "\n")
    print("\n" + table())


def table() -> str:
    lines = [f"shim benchmark, {R.get('info', {}).get('date')} on {R.get('info', {}).get('gpu')}, "
             f"torch {R.get('info', {}).get('torch')}", "",
             "| measurement | hamid shim | target | HAMi-core (published, H100) |", "|---|---|---|---|"]
    lines += [f"| {a_} | {b} | {c} | {d} |" for a_, b, c, d in ROWS]
    if R.get("errors"):
        lines += ["", "errors: " + json.dumps(R["errors"])[:3000]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
