"""The compute-limit acceptance bench (issue 22) on a real GPU.

Owns orchestration and judgement only: every measurement is a separate
process of bench/gpu/limits_work.py (the shim reads its limits once per
process), each limited run paired with the same workload unlimited in the
same call. The GPU's busy share comes from NVML, read here through ctypes:
per process from nvmlDeviceGetProcessUtilization (smUtil samples), device-wide
from nvmlDeviceGetUtilizationRates, both sampled every 100 ms; the shim's own
accounting (GPU time in the container's region) is reported beside them.

Checks (issue 22 "What must hold"):
  1 singles:  limited share <= L + 5 and >= min(unlimited share, L) - 5;
              unlimited share < L  ->  throughput >= 90 % of unlimited
  2 sharing:  each tenant within +-5 points of its share, all demanding; read over the whole run (the
              former check) and from second SETTLE_S on, by work shares (each tenant's throughput share
              over their sum, of the device's busy share: time slicing spends 7-8 % switching contexts,
              which --free-pairs measures with every tenant unlimited); a tenant that cannot fill its
              limit alone keeps >= 90 % of its alone throughput. staggered: one tenant joins another
              that has run alone for 5 s
  3 priority: high-priority inference beside low-priority training keeps
              >= 90 % of its alone throughput (priority-rounds: the median of --rounds interleaved pairs)
  4 overhead: bench/gpu/shim_bench.py's matmul ratio, launch cost, alloc rate
  5 metrics:  the daemon's /metrics collectors (container utilization ratio, host utilization) against
              NVML, within 5 points (file-mode tenants; sharing rows show them too)

  python3 bench/gpu/limits_bench.py --out DIR [--cases singles,pairs,priority,overhead,repeat,...]
      [--classes gemm,small,...] [--limits 30,60] [--secs 5] [--env K=V ...] [--tag name]
      [--share-modes env,file] [--pin] [--rounds 3] [--variant NAME:K=V,...]
      [--share-secs 10] [--free-pairs] [--mixes gemm+gemm,gemm+dyn,dyn+dyn,gemm+dyn+train]
  HAMID_BENCH_SHIM=path/libvgpu.so: another build of the shim (e.g. other constants) in the same call.
  repeat: each class's unlimited and limited runs interleaved over --rounds rounds, the median reported
  (a single pair of launch-bound runs moves 10-20 % between processes).
  priority-diag: the high-priority tenant beside an idle context, one polling NVML, and the held trainer.
  --pin: each tenant on its own CPUs, the bench's own threads on the rest. An unlimited reference whose
  seconds vary by more than 15 % is measured again and the faster kept (see uneven).

Tenants that share the GPU start on one clock once all of them have warmed up
(limits_work.py's READY handshake). A tenant in "file" mode takes its limits
the way a container of the daemon does: from a limits file (hamid.shimlimits'
writer, the daemon's code) at the shim's fixed path, bind-mounted in the
tenant's own mount namespace (unshare -m; root), and while tenants run, the
daemon's own live pass (hamid.shimlimits.live.LivePass, fed by the daemon's
NVML reading hamid.devices.nvml.NvmlBackend.busy and the tenants' regions)
rewrites the files' live part every second: hold lists (priority) and the
sharing correction. "env" mode sets the limits through HAMi-core's variables
(no daemon, no live part).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
# the shim under test; HAMID_BENCH_SHIM names another build (a variant compiled with other constants, compared
# in the same call)
SHIM = Path(os.environ.get("HAMID_BENCH_SHIM") or ROOT / "shim" / "build" / "libvgpu.so")
WORKER = [sys.executable, str(ROOT / "bench" / "gpu" / "limits_work.py")]
SHIM_VARS = ("CUDA_DEVICE_", "HAMID_", "LD_PRELOAD", "GPU_CORE_UTILIZATION_POLICY", "CUDA_TASK_PRIORITY")
CLASSES = ["gemm", "small", "dyn", "train", "graph", "switch"]
R: dict = {"runs": []}
UNL: dict = {}  # class -> its unlimited NVML share, alone, in this call
UNL_RATE: dict = {}  # class -> its unlimited throughput, alone, in this call
EXTRA: dict = {}
# --pin: tenant i of a run on CPUs [PIN0 + i*PIN_N, PIN0 + (i+1)*PIN_N): a launch-bound workload's throughput
# moves 20 % between unpinned processes (H200 machine, 2026-11-26: training 0.79-1.02 of itself), which drowns
# the 10 % the acceptance allows; the same CPUs for a workload's limited and unlimited runs compare like with like
PIN: list = []
PIN0, PIN_N = 2, 3
CPUS = os.sched_getaffinity(0)  # the machine's, before the bench moves its own threads off the tenants'
TMP = Path(tempfile.mkdtemp(prefix="limbench-"))
LIMITS_DIR = "/usr/local/vgpu"  # where the shim's fixed limits path lives (hamid_limits.h HAMID_LIMITS_PATH)
LIVE_PASS_S = 1.0  # the daemon's pass period (hamid/daemon/service.py PRIORITY_PASS_S)
LIVE = None  # the daemon's live pass (LivePass), one for the whole run as in the daemon
BUSY = None  # the daemon's NVML reading (NvmlBackend)
PASSES: list = []  # what each pass saw and wrote
SAVE: list = []  # main's save(), for cases that save as they go


def save_now():
    """Writes what is measured so far (a long case calls it after each round: kept if the call runs out of
    time)."""
    for f in SAVE:
        f()


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


# ---- NVML through ctypes ----

class ProcSample(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("timeStamp", ctypes.c_ulonglong), ("smUtil", ctypes.c_uint),
                ("memUtil", ctypes.c_uint), ("encUtil", ctypes.c_uint), ("decUtil", ctypes.c_uint)]


class Util(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class Nvml:
    """Samples every 100 ms: device-wide utilization and per-process smUtil (all processes)."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        assert self.lib.nvmlInit_v2() == 0
        self.h = ctypes.c_void_p()
        assert self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.h)) == 0
        name = ctypes.create_string_buffer(96)
        self.lib.nvmlDeviceGetName(self.h, name, 96)
        self.name = name.value.decode()
        uuid = ctypes.create_string_buffer(96)
        self.lib.nvmlDeviceGetUUID(self.h, uuid, 96)
        self.uuid = uuid.value.decode()
        self.dev: list[tuple[float, int]] = []
        self.clk: list[tuple[float, int]] = []  # (t, SM clock MHz): a GEMM's rate per GPU-second follows it
        self.proc: dict[tuple[int, int], int] = {}  # (pid, ts_us) -> smUtil
        self.proc_err = None
        self.stop = threading.Event()
        self.last = 0
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def loop(self):
        buf = (ProcSample * 512)()
        while not self.stop.wait(0.1):
            u = Util()
            if self.lib.nvmlDeviceGetUtilizationRates(self.h, ctypes.byref(u)) == 0:
                self.dev.append((time.time(), u.gpu))
            mhz = ctypes.c_uint()
            if self.lib.nvmlDeviceGetClockInfo(self.h, 1, ctypes.byref(mhz)) == 0:  # NVML_CLOCK_SM
                self.clk.append((time.time(), mhz.value))
            n = ctypes.c_uint(512)
            rc = self.lib.nvmlDeviceGetProcessUtilization(self.h, buf, ctypes.byref(n), ctypes.c_ulonglong(self.last))
            if rc == 0:
                for i in range(n.value):
                    s = buf[i]
                    self.proc[(s.pid, s.timeStamp)] = s.smUtil
                    self.last = max(self.last, s.timeStamp)
            elif rc != 6:  # NVML_ERROR_NOT_FOUND: no sample since the last
                self.proc_err = rc

    def dev_share(self, t0, t1):
        v = [u for t, u in self.dev if t0 + 0.3 <= t <= t1]
        return statistics.mean(v) if v else None

    def sm_clock(self, t0, t1):
        v = [c for t, c in self.clk if t0 <= t <= t1]
        return statistics.mean(v) if v else None

    def proc_share(self, pid, t0, t1):
        v = [u for (p, ts), u in list(self.proc.items()) if p == pid and t0 + 0.3 <= ts / 1e6 <= t1]
        return statistics.mean(v) if v else None


NV: Nvml | None = None


# ---- running workloads ----

def env(limit=None, policy="force", priority=None, preload=True, region=None, extra=None) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(SHIM_VARS)}
    e["PYTHONUNBUFFERED"] = "1"
    if preload:
        e["LD_PRELOAD"] = str(SHIM)
        e["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = region or str(TMP / f"region-{time.time_ns()}.cache")
        if limit:
            e["CUDA_DEVICE_SM_LIMIT"] = str(limit)
        if policy:
            e["GPU_CORE_UTILIZATION_POLICY"] = policy
        if priority is not None:
            e["CUDA_TASK_PRIORITY"] = str(priority)
        e.update(EXTRA)
    e.update(extra or {})
    return e


def filed(limit=None, policy="force", priority=None, file_limit=None) -> dict:
    """A tenant of the daemon's: its limits in a limits file written with the daemon's writer (the env carries
    only the preload and, for limits_work's own reading, the region path the file names). ``file_limit``: what
    the file gives its shim, where that is not the limit the daemon booked (a shim whose limiter does not hold
    it: it runs and charges at ``file_limit``)."""
    from hamid.shimlimits import ContainerLimits, DeviceLimits, write_limits_file
    d = TMP / f"tenant-{time.time_ns()}"
    d.mkdir(mode=0o755)
    region = str(d / "vgpu.cache")
    write_limits_file(d / "hamid.limits", ContainerLimits(
        devices=(DeviceLimits(uuid=NV.uuid, sm_percent=file_limit or limit or 0),), region_path=region, priority=priority,
        sm_policy=policy))
    e = env(region=region, policy=None)
    # for together() and the results only (the shim reads none of these: the file is its only source)
    e["HAMID_BENCH_LIMITS_DIR"] = str(d)
    e["HAMID_BENCH_LIMIT"] = str(limit or 0)
    e["HAMID_BENCH_POLICY"] = policy
    e["HAMID_BENCH_PRIORITY"] = "1" if priority is None else str(priority)
    return e


def _reader(stream, lines: list, ready: threading.Event):
    for ln in stream:
        lines.append(ln)
        if ln.startswith(("READY", "LOADED")):
            ready.set()
    ready.set()  # EOF: the process ended (a failure shows in its return code)


def live_pass(tenants):
    """One pass of the daemon's live pass over the file-mode tenants (all on GPU 0), fed as the daemon feeds
    it (NodeCore.priority_pass): NVML's processes on the GPU mapped to tenants by the host's pid map (each
    tenant's mount namespace shows its limits file at the fixed path), the regions' charges and launch
    stamps."""
    from hamid.shimlimits.hostpids import file_idents, maps_any, owners
    from hamid.shimlimits.live import GpuReading, Tenant
    from limits_work import REGION_LAST_KERNEL_OFF, region_gpu_time
    shims = file_idents([SHIM])  # as the daemon's stateDir/shim: the one shim the tenants preload
    b = BUSY.busy().get(NV.uuid)
    files = {str(Path(t["env"]["HAMID_BENCH_LIMITS_DIR"]) / "hamid.limits"): t for t in tenants}
    on = ((b.pids or frozenset()) | b.busy_pids) if b else frozenset()
    whose = owners(on, {f: f for f in files}, f"{LIMITS_DIR}/hamid.limits")
    ts = []
    for f, t in files.items():
        e = t["env"]
        lim = int(e["HAMID_BENCH_LIMIT"])
        region = e["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
        pids = tuple(sorted(p for p in on if whose.get(p) == f))
        ts.append(Tenant(limits=f, device=0, priority=int(e["HAMID_BENCH_PRIORITY"]), pids=pids,
                         unshimmed=tuple(p for p in pids if lim > 0 and maps_any(p, shims) is False),
                         charged_ns=region_gpu_time(region), charged=lim > 0 and e["HAMID_BENCH_POLICY"] != "disable",
                         last_kernel_ns=region_gpu_time(region, REGION_LAST_KERNEL_OFF) or None,
                         limit_pct=lim, policy=e["HAMID_BENCH_POLICY"]))
    reading = GpuReading(b.busy_pct, b.busy_pids, b.pid_busy) if b else GpuReading(None)
    n = LIVE.run(time.monotonic(), {NV.uuid: (reading, ts)})
    PASSES.append({"t": time.time(), "busy": None if b is None else b.busy_pct,
                   "busy_pids": None if b is None else sorted(b.busy_pids),
                   "pids": {Path(t.limits).parent.name: list(t.pids) for t in ts},
                   "charged": [t.charged_ns for t in ts], "limited": [t.charged for t in ts],
                   "factor": LIVE.factor(NV.uuid), "unaccounted": dict(LIVE.unaccounted),
                   "shared": LIVE.shared(NV.uuid), "written": n, "untrusted": dict(LIVE.untrusted),
                   "pid_busy": None if b is None or b.pid_busy is None else {str(k): v for k, v in b.pid_busy.items()},
                   # NVML's per-pid GPU memory, the memory guard's sensor (memguard.py): first read on a GPU here
                   "pid_mem": None if b is None or b.pid_mem is None else {str(k): v for k, v in b.pid_mem.items()},
                   "stopped": sorted(Path(k[0]).parent.name for k in LIVE.guard.stopped) if LIVE.guard else []})


METRICS_S = 1.0  # a scrape a second (Prometheus scrapes every 15-60 s; more points for the same run)


class Scraper:
    """/metrics as the daemon renders it (point 5): the daemon's own collectors, hamid.shimregion.collector over
    the file-mode tenants' region directories (hami_container_device_utilization_ratio: the GPU time the shim
    accounted since the previous scrape) and hamid.metrics.exporter.HostCollector over NVML
    (hami_host_gpu_utilization_ratio), rendered by prometheus_client.generate_latest and parsed back, every
    METRICS_S while the tenants run. In-process: the device machine cannot run the daemon itself."""

    def __init__(self):
        from prometheus_client import CollectorRegistry
        from hamid.metrics.exporter import HostCollector
        from hamid.shimregion.collector import register_collector
        self.reg = CollectorRegistry()
        register_collector(self.reg, TMP)
        self.reg.register(HostCollector("bench", BUSY.readings))
        self.scrapes: list = []  # (t, {pod: ratio}, host util)
        self.stop = threading.Event()

    def once(self):
        from prometheus_client import generate_latest
        from prometheus_client.parser import text_string_to_metric_families
        ctr, host = {}, None
        for fam in text_string_to_metric_families(generate_latest(self.reg).decode()):
            for smp in fam.samples:
                if smp.name == "hami_container_device_utilization_ratio":
                    ctr[smp.labels["pod"]] = smp.value
                elif smp.name == "hami_host_gpu_utilization_ratio" and smp.labels.get("device_uuid") == NV.uuid:
                    host = smp.value
        self.scrapes.append((time.time(), ctr, host))

    def loop(self):
        while not self.stop.wait(METRICS_S):
            try:
                self.once()
            except Exception as ex:  # noqa: BLE001 - recorded, the run goes on
                R.setdefault("errors", []).append(f"scrape: {type(ex).__name__}: {ex}")

    def container(self, pod, t0, t1):
        """Mean of the pod's ratios whose interval (the previous scrape to this one) lies within [t0, t1]."""
        v = [c[pod] for (tp, _, _), (t, c, _) in zip(self.scrapes, self.scrapes[1:])
             if tp >= t0 and t <= t1 and pod in c]
        return statistics.mean(v) if v else None

    def host(self, t0, t1):
        v = [h for t, _, h in self.scrapes if t0 + METRICS_S <= t <= t1 and h is not None]
        return statistics.mean(v) if v else None


FORGE_S = 0.1  # how often a forging tenant rewrites its region


def forge_region(path, stop):
    """What a tenant may do to its own region (it is mapped writable in the container): every FORGE_S overwrite
    the GPU time the shim charged and the launch stamp, cycling each second through zero, a tiny steady charge,
    a huge one (10 s of GPU time per write) and one that runs backwards, the stamp always zero (as if it never
    launched). The daemon must take no neighbour's limit from it."""
    from limits_work import REGION_GPU_TIME_OFF, REGION_LAST_KERNEL_OFF
    t0, v = time.time(), 0
    while not stop.wait(FORGE_S):
        if not os.path.exists(path) or os.path.getsize(path) < REGION_LAST_KERNEL_OFF + 8:
            continue
        phase = int(time.time() - t0) % 4
        v = {0: 0, 1: v + 100_000, 2: v + 10_000_000_000, 3: max(0, v - 5_000_000_000)}[phase]
        with open(path, "r+b") as f:
            os.pwrite(f.fileno(), v.to_bytes(8, "little"), REGION_GPU_TIME_OFF)
            os.pwrite(f.fileno(), (0).to_bytes(8, "little"), REGION_LAST_KERNEL_OFF)


LATE_STARTUP_S = 4.0  # a late tenant's CUDA start-up and warm-up (its modules are loaded before it is released)


def together(specs, secs):
    """Runs the (class, env) specs at once: each warms up, and once all are ready they start on one clock and
    are measured over the same window; returns their results. File-mode tenants run in their own mount
    namespace, and the daemon's live pass runs every LIVE_PASS_S while any of them does."""
    ps, outs, errs, readies = [], [], [], []
    # a spec may carry a third item, a delay (s): that tenant starts so much later and all end together; and a
    # fourth, late: that tenant (its modules loaded) touches the GPU only so much later (its CUDA start-up and
    # warm-up are its first kernels, as a container that arrives) and runs at once after its warm-up
    delays = [sp[2] if len(sp) > 2 else 0 for sp in specs]
    lates = [bool(sp[3]) if len(sp) > 3 else False for sp in specs]
    specs = [sp[:2] for sp in specs]
    # a late tenant's CUDA start-up and warm-up take a few seconds: the others run on meanwhile
    extra = LATE_STARTUP_S if any(lates) else 0.0
    for (c, e), d, late in zip(specs, delays, lates):
        argv = [*WORKER, c, str(secs + max(delays) - d + (0.0 if late else extra)), "late" if late else "-"]
        if "HAMID_BENCH_LIMITS_DIR" in e:
            argv = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                    'mount --bind "$0" ' + LIMITS_DIR + ' && exec "$@"', e["HAMID_BENCH_LIMITS_DIR"], *argv]
        cpus = set(range(PIN0 + len(ps) * PIN_N, PIN0 + (len(ps) + 1) * PIN_N)) & CPUS
        pre = (lambda c=cpus: os.sched_setaffinity(0, c)) if PIN and cpus else None
        o, er, rd = [], [], threading.Event()

        def popen(argv=argv, e=e, pre=pre, o=o, er=er, rd=rd):
            p = subprocess.Popen(argv, env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, preexec_fn=pre)
            threading.Thread(target=_reader, args=(p.stdout, o, rd), daemon=True).start()
            threading.Thread(target=_reader, args=(p.stderr, er, threading.Event()), daemon=True).start()
            return p
        ps.append(popen())
        outs.append(o), errs.append(er), readies.append(rd)
    deadline = time.time() + 240
    for rd in readies:
        rd.wait(max(0.0, deadline - time.time()))
    pids = []
    for (c, _e), p, o, er, late in zip(specs, ps, outs, errs, lates):
        ready = [ln for ln in o if ln.startswith("LOADED" if late else "READY")]
        if not ready:
            for q in ps:
                q.kill()
            raise RuntimeError(f"{c} never got ready (rc={p.poll()}): {''.join(er)[-2000:]}")
        pids.append(int(ready[0].split()[1]))
    start = time.time_ns() + int(0.3e9)
    for p, d, late in zip(ps, delays, lates):
        if not late:
            p.stdin.write(f"{start + int(d * 1e9)}\n")
            p.stdin.flush()
    filed_t = [{"env": e, "pid": pid} for (c, e), pid, late in zip(specs, pids, lates)
               if "HAMID_BENCH_LIMITS_DIR" in e and not late]
    spawned_at: dict = {}

    def spawner():  # the late tenants, each released at its delay after the common start
        for i in sorted((i for i in range(len(ps)) if lates[i]), key=lambda i: delays[i]):
            time.sleep(max(0.0, start / 1e9 + delays[i] - time.time()))
            spawned_at[i] = time.time()
            ps[i].stdin.write("go\n")
            ps[i].stdin.flush()
            if "HAMID_BENCH_LIMITS_DIR" in specs[i][1]:
                filed_t.append({"env": specs[i][1], "pid": pids[i]})
    st = threading.Thread(target=spawner, daemon=True)
    st.start()
    stop = threading.Event()

    def passes():
        while not stop.wait(LIVE_PASS_S):
            try:
                live_pass(filed_t)
            except Exception as ex:  # noqa: BLE001 - recorded, the run goes on
                R.setdefault("errors", []).append(f"live pass: {type(ex).__name__}: {ex}")
    lt = threading.Thread(target=passes, daemon=True) if filed_t else None
    for _c, e in specs:
        if e.get("HAMID_BENCH_FORGE"):
            threading.Thread(target=forge_region, args=(e["CUDA_DEVICE_MEMORY_SHARED_CACHE"], stop),
                             daemon=True).start()
    scr = None
    if lt:
        live_pass(filed_t)
        lt.start()
        try:
            scr = Scraper()
            scr.once()
            threading.Thread(target=scr.loop, daemon=True).start()
        except Exception as ex:  # noqa: BLE001 - recorded, the run goes on without point 5
            R.setdefault("errors", []).append(f"scraper: {type(ex).__name__}: {ex}")
            scr = None
    res = []
    try:
        st.join(timeout=max(delays) + 5)
        for i, ((c, e), p, o, er) in enumerate(zip(specs, ps, outs, errs)):
            rc = p.wait(timeout=secs + 120)
            time.sleep(0.05)
            if rc != 0:
                raise RuntimeError(f"{c} rc={rc}: {''.join(er)[-2000:]}")
            r = json.loads([ln for ln in o if ln.startswith("{")][-1])
            if e.get("HAMID_SHIM_LOG_LEVEL"):
                r["stderr"] = "".join(er)[-6000:]
            r["nvml_share"] = NV.proc_share(r["pid"], r["t0"], r["t1"])
            r["dev_share"] = NV.dev_share(r["t0"], r["t1"])
            r["sm_clock_s"] = [NV.sm_clock(r["t0"] + k, r["t0"] + k + 1) for k in range(int(r["t1"] - r["t0"]))]
            r["shim_share"] = None if r["shim_gpu_s"] is None else 100 * r["shim_gpu_s"] / (r["t1"] - r["t0"])
            r["limit"] = e.get("HAMID_BENCH_LIMIT", e.get("CUDA_DEVICE_SM_LIMIT"))
            r["priority"] = e.get("HAMID_BENCH_PRIORITY", e.get("CUDA_TASK_PRIORITY"))
            r["mode"] = "file" if "HAMID_BENCH_LIMITS_DIR" in e else "env"
            kern = [ln for ln in o if ln.startswith("KERNELS")]
            r["kernels_t"] = float(kern[0].split()[1]) if kern else None
            r["spawned_t"] = spawned_at.get(i)
            if scr is not None and r["mode"] == "file":
                r["metrics_share"] = scr.container(Path(e["HAMID_BENCH_LIMITS_DIR"]).name, r["t0"], r["t1"])
                r["metrics_host"] = scr.host(r["t0"], r["t1"])
            R["runs"].append(r)
            res.append(r)
    finally:
        stop.set()
        if scr is not None:
            scr.stop.set()
        if lt:
            lt.join(timeout=5)
        if LIVE is not None and LIVE.guard is not None:
            LIVE.guard.resume_all()
        for p in ps:
            if p.poll() is None:
                p.kill()
    return res


def ensure_unl(classes, secs):
    """Each class's unlimited share and throughput alone, measured in this call unless singles did."""
    for c in classes:
        if c not in UNL_RATE:
            unl = reference(c, secs)
            UNL[c], UNL_RATE[c] = unl["nvml_share"], unl["rate"][c]
            steady_ref(c, unl, secs)


def reference(c, secs):
    """The class's unlimited run alone, what its limited runs are read against; a disturbed one (see uneven)
    is measured again and the faster of the two kept."""
    (unl,) = together([(c, env())], secs)
    if uneven(unl, secs):
        (again,) = together([(c, env())], secs)
        R.setdefault("unl_remeasured", []).append({"cls": c, "first": unl["per_s"], "again": again["per_s"]})
        unl = max(unl, again, key=lambda r: r["rate"][c])
    return unl


UNEVEN = 0.85


def uneven(unl, secs):
    """Whether an unlimited run's whole seconds after the first vary by more than 1 - UNEVEN: a steady workload
    alone does not, and a launch-bound one (dyn) at times loses a third of its rate for seconds on the device
    machine with nothing beside it (H200, 2026-11-26: 1.28 M, 0.91, 0.80, 0.79, 1.07 M tokens/s, NVML 74 %
    busy, where every other reference that day read 1.23-1.25 M and 92-99 %): read against such a reference,
    a tenant seems to run at 0.95 of its alone rate while it runs at 0.65. Slowdowns only lower a rate, so
    keeping the faster of two runs makes every ratio against it stricter, never looser."""
    if unl.get("cls") == "switch":  # its parts count different units: uneven by design
        return False
    ps = [x for x in (unl.get("per_s") or [])[1:int(secs)] if x]
    return len(ps) >= 3 and min(ps) < UNEVEN * max(ps)


def steady_ref(c, unl, secs):
    """The class's steady rate alone: the median of its whole seconds from the second on (the first second's
    launches fill the queue: a GEMM loop launches two seconds' work in it), what the sharing runs' steady
    shares are read against."""
    ps = (unl.get("per_s") or [])[1:int(secs)]
    if len(ps) >= 3:
        UNL_STEADY[c] = statistics.median(ps)
        UNL_CLOCK[c] = mean_clock(unl, 1, int(secs))
        R.setdefault("unl_steady", {})[c] = {"median": UNL_STEADY[c], "per_s": unl["per_s"]}


def tput(lim, unl):
    """Throughput ratio; for the switching class the mean over its parts."""
    return statistics.mean(lim["rate"][k] / unl["rate"][k] for k in unl["rate"] if unl["rate"][k])


def fmt(v, nd=1):
    return "-" if v is None else f"{v:.{nd}f}"


ROWS: list[str] = []


def step(fn):
    def wrapped(*a):
        log(f"== {fn.__name__} {a}")
        t0 = time.time()
        try:
            fn(*a)
        except Exception as ex:  # noqa: BLE001 - one failed step must not lose the rest
            R.setdefault("errors", []).append(f"{fn.__name__}{a}: {type(ex).__name__}: {ex}")
            traceback.print_exc()
        log(f"   ({time.time() - t0:.1f} s)")
    return wrapped


@step
def singles(classes, limits, secs):
    out = R.setdefault("singles", {})
    for c in classes:
        s = secs * 2 if c == "switch" else secs
        unl = reference(c, s)
        if unl["nvml_share"] is not None:
            UNL[c] = unl["nvml_share"]
        UNL_RATE[c] = unl["rate"].get(c)
        steady_ref(c, unl, s)
        for lim in limits:
            (lr,) = together([(c, env(limit=lim))], s)
            us, ls = unl["nvml_share"], lr["nvml_share"]
            ratio = tput(lr, unl)
            ok_hi = ls is not None and ls <= lim + 5
            ok_lo = ls is not None and us is not None and ls >= min(us, lim) - 5
            ok_tp = us is None or us >= lim or ratio >= 0.9
            out[f"{c}@{lim}"] = {"unlimited": unl, "limited": lr, "ratio": ratio, "pass": ok_hi and ok_lo and ok_tp}
            ROWS.append(f"| {c} | {lim} | {fmt(us)} | {fmt(ls)} | {fmt(lr['shim_share'])} | {fmt(lr['dev_share'])} | "
                        f"{ratio:.2f} | {'pass' if ok_hi and ok_lo and ok_tp else 'FAIL'} |")
            log(ROWS[-1])
            save_now()


# classes whose throughput is proportional to their GPU time (each keeps the GPU >= 97 % busy alone: H200,
# 2026-11-26), so throughput against the same workload alone and unlimited reads their share of GPU time
TPUT_BOUND = ("gemm", "graph", "dyn")
# a sharing run's tenants are read again from this second on: the daemon's correction learns from its second
# pass and settles within two more (a new mix starts from factor 1, moving at most STEP_MAX a pass)
SETTLE_S = 3
UNL_STEADY = {}  # class -> its steady rate alone (steady_ref)
UNL_CLOCK = {}  # class -> its SM clock (MHz) over those seconds


def mean_clock(r, first, last):
    """The mean SM clock over a run's whole seconds [first, last) (NVML, every 100 ms), reported beside the
    readings: a GEMM at 30 % duty runs at 1980 MHz where saturated it runs at 1361 (H100, 2026-12-07), yet its
    rate per GPU-second rises by 18 %, not 45 %, so the clock is no correction for the throughput reading."""
    v = [c for c in (r.get("sm_clock_s") or [])[first:last] if c]
    return statistics.mean(v) if v else None


def gpu_time_share(share, lim):
    """A GEMM tenant's throughput share as GPU time, calibrated by the same GEMM held alone at ``lim`` % by force
    in this call (iso_reference): alone, NVML's per-process share is its GPU time, and the throughput share
    over-reads it (kernels at a low duty run faster: clocks under the power cap). share x nvml_ref / tput_ref."""
    ref = R.get("iso_reference", {}).get(str(lim))
    if share is None or not ref or not ref["tput"] or ref["nvml"] is None:
        return None
    return share * ref["nvml"] / ref["tput"]
FREE_PAIRS = []  # --free-pairs: each mix also run with every tenant unlimited (time slicing's own cost)


@step
def sharing(name, specs, secs, policy="force", mode="env"):
    """Several tenants at once. NVML's per-process smUtil cannot tell time-sliced processes apart (each active
    one is reported with about the device's utilization: measured, baseline 2026-11-26), so a tenant's share is
    the shim's accounting, checked two ways: their sum against NVML's device-wide busy share, and for the
    GPU-bound classes (TPUT_BOUND) the throughput against the same workload alone and unlimited in this call.
    mode "file": the daemon's limits files and live pass (sharing correction); "env": HAMi-core's variables."""
    mk = filed if mode == "file" else env
    n0 = len(PASSES)
    res = together([(c, mk(limit=lim, policy=policy)) for c, lim in specs], secs)
    # a tenant that cannot fill its share alone (UNL: its unlimited share in this call) is held to that
    want = [min(lim, UNL.get(c, 100)) for c, lim in specs]
    tshare = [100 * r["rate"][c] / UNL_RATE[c] if c in TPUT_BOUND and c in UNL_RATE else None
              for r, (c, _) in zip(res, specs)]
    # the same after the daemon's correction settled: seconds SETTLE_S.. of the run (whole seconds only)
    steady = [100 * statistics.mean(r["per_s"][SETTLE_S:int(secs)]) / UNL_STEADY[c]
              if c in TPUT_BOUND and c in UNL_STEADY and r.get("per_s") and int(secs) > SETTLE_S else None
              for r, (c, _) in zip(res, specs)]
    # shares of the work the GPU delivered (steady): each tenant's steady throughput share over their sum, of
    # the device's busy share. Time slicing spends part of a shared GPU switching (the free pair, both
    # unlimited, sums to 91-92 on the H200: 2026-11-26): that time is nobody's, and this reads each tenant's
    # share of the rest. Only where every tenant's throughput maps to GPU time (TPUT_BOUND).
    work = None
    if all(t is not None for t in steady) and res[0]["dev_share"] is not None:
        work = [t / sum(steady) * res[0]["dev_share"] for t in steady]
    ok_work = work is not None and all(abs(t - w) <= 5 for t, w in zip(work, want))
    # The steady check, tenant by tenant: a GPU-bound one (TPUT_BOUND) within 5 points of its share by its
    # work share where every tenant's is known, else by its steady throughput share; one that cannot fill
    # its limit even alone (its unlimited share under it: not demanding) keeps >= 90 % of its throughput
    # alone (point 1's rule for such a process), and its charges are not checked against its alone share
    # (a time-sliced kernel runs longer than alone: the GPU time it takes in a mix is not its time alone).
    tp_alone = [statistics.mean(r["per_s"][SETTLE_S:int(secs)]) / UNL_STEADY[c]
                if c in UNL_STEADY and r.get("per_s") and int(secs) > SETTLE_S else None
                for r, (c, _) in zip(res, specs)]
    ok_steady = True
    for i, ((c, lim), w) in enumerate(zip(specs, want)):
        if c in TPUT_BOUND:
            got = work[i] if work else steady[i]
            ok_steady = ok_steady and got is not None and abs(got - w) <= 5
        elif w < lim:
            ok_steady = ok_steady and tp_alone[i] is not None and tp_alone[i] >= 0.9
        else:
            ok_steady = ok_steady and res[i]["shim_share"] is not None and abs(res[i]["shim_share"] - w) <= 5
    ok = all(r["shim_share"] is not None and abs(r["shim_share"] - w) <= 5 for r, w in zip(res, want))
    ok = ok and all(t is None or abs(t - w) <= 5 for t, w in zip(tshare, want))
    free = None
    if FREE_PAIRS:  # the same tenants unlimited together: what time slicing alone leaves of the sum (steady)
        fr = together([(c, env()) for c, _ in specs], secs)
        free = [100 * statistics.mean(r["per_s"][SETTLE_S:int(secs)]) / UNL_STEADY[c]
                if c in TPUT_BOUND and c in UNL_STEADY and r.get("per_s") and int(secs) > SETTLE_S else None
                for r, (c, _) in zip(fr, specs)]
    tot = sum(r["shim_share"] or 0 for r in res)
    cross = res[0]["dev_share"] is not None and abs(tot - res[0]["dev_share"]) <= 5
    R.setdefault("sharing", {})[f"{name} {policy} {mode}"] = {
        "runs": res, "want": want, "tput_share": tshare, "pass": ok, "sum_vs_device": cross, "policy": policy,
        "tput_share_steady": steady, "pass_steady": ok_steady, "settle_s": SETTLE_S, "free_tput_share": free,
        "work_share_steady": work, "pass_work": ok_work, "tput_vs_alone_steady": tp_alone,
        "mode": mode, "passes": PASSES[n0:], "metrics": [r.get("metrics_share") for r in res],
        "metrics_host": res[0].get("metrics_host")}
    fac = [p["factor"] for p in PASSES[n0:] if p["shared"]]
    factor = f", factor {fac[-1]:.2f}" if fac else ""
    ROWS.append(f"| share {name} ({policy}, {mode}{factor}) | {'/'.join(str(lim) for _, lim in specs)} | - | "
                f"tput-share {' / '.join(fmt(t) for t in tshare)} | {' / '.join(fmt(r['shim_share']) for r in res)} "
                f"(sum {tot:.1f}) | {fmt(res[0]['dev_share'])} | - | {'pass' if ok else 'FAIL'}"
                f"{'' if cross else ', sum != device'} |")
    log(ROWS[-1])
    ROWS.append(f"| share {name}: from second {SETTLE_S} on | - | - | tput-share {' / '.join(fmt(t) for t in steady)}; "
                f"work share {' / '.join(fmt(t) for t in work) if work else '-'} ({'pass' if ok_work else 'FAIL'}) | - | - | "
                f"{'free pair (both unlimited): ' + ' / '.join(fmt(t) for t in free) if free else '-'}; "
                f"vs alone {' / '.join(fmt(t, 2) for t in tp_alone)} | "
                f"{'pass' if ok_steady else 'FAIL'} |")
    log(ROWS[-1])
    if mode == "file":
        ms = [r.get("metrics_share") for r in res]
        ROWS.append(f"| share {name}: /metrics container ratios / host ratio | - | - | "
                    f"{' / '.join(fmt(m) for m in ms)} (sum {sum(m or 0 for m in ms):.1f}) / "
                    f"{fmt(res[0].get('metrics_host'))} | - | {fmt(res[0]['dev_share'])} | - | - |")
        log(ROWS[-1])


@step
def staggered(name, specs, secs, delay):
    """A tenant joins one that is running (as containers arrive on a node, never all at once): the first spec
    starts alone, the second ``delay`` s later, both in the daemon's files under policy ``default`` (the first
    runs unlimited until the second is busy). Read from the second's second SETTLE_S on: steady throughput
    share against each alone, work shares, each within 5 points of its limit."""
    ensure_unl(tuple(c for c, _ in specs), 8)
    n0 = len(PASSES)
    res = together([(specs[0][0], filed(limit=specs[0][1], policy="default")),
                    (specs[1][0], filed(limit=specs[1][1], policy="default"), delay)], secs)
    offs = [int(delay), 0]
    steady = [100 * statistics.mean(r["per_s"][o + SETTLE_S:o + int(secs)]) / UNL_STEADY[c]
              for r, (c, _), o in zip(res, specs, offs)]
    before = 100 * statistics.mean(res[0]["per_s"][1:int(delay)]) / UNL_STEADY[specs[0][0]] if delay >= 2 else None
    work = [t / sum(steady) * res[1]["dev_share"] for t in steady] if res[1]["dev_share"] is not None else None
    want = [min(lim, UNL.get(c, 100)) for c, lim in specs]
    ok = work is not None and all(abs(t - w) <= 5 for t, w in zip(work, want))
    R.setdefault("staggered", {})[name] = {"runs": res, "want": want, "delay": delay, "steady": steady,
                                           "work": work, "alone_before": before, "pass": ok,
                                           "passes": PASSES[n0:]}
    ROWS.append(f"| staggered {name} (default, file; the second joins after {delay:g} s) | "
                f"{'/'.join(str(lim) for _, lim in specs)} | first alone before: {fmt(before)} | "
                f"tput-share {' / '.join(fmt(t) for t in steady)}; work share "
                f"{' / '.join(fmt(t) for t in work) if work else '-'} | "
                f"{' / '.join(fmt(r['shim_share']) for r in res)} | {fmt(res[1]['dev_share'])} | - | "
                f"{'pass' if ok else 'FAIL'} |")
    log(ROWS[-1])


# The isolation case's starts: the GEMM tenant's start minus its neighbours' (s), staggered both ways by 0-3 s; a
# run takes the next one in turn
ISO_OFFSETS = (-3.0, 2.0, -1.0, 0.5, 3.0, -2.0, 1.0, -0.5)
ISO_OFF: list = []  # --iso-offsets: other starts
ISO_NEIGHBOURS = {"dyn": [("dyn", 70)], "small": [("small", 70)], "hfgen": [("hfgen", 70)],
                  "graph": [("graph", 70)], "train": [("train", 70)],
                  # a tenant outside the daemon and the shim (no limits file, no preload): saturating GEMMs
                  "bare": [("gemm", None)],
                  # small kernels whose region the tenant forges (forge_region)
                  "forge": [("small", "forge")],
                  "trio": [("dyn", 30), ("train", 50)]}


def iso_env(nl, policy):
    """A neighbour's environment: a limit (the daemon's file), None (no shim at all), "forge" (limit 70, its
    region forged while it runs)."""
    if nl is None:
        return env(preload=False)
    if nl == "forge":
        return {**filed(limit=70, policy=policy), "HAMID_BENCH_FORGE": "1"}
    return filed(limit=nl, policy=policy)


@step
def isolation(nb, runs, secs, policy):
    """Issue 37's point B: a GEMM tenant (the daemon's limits file, policy ``policy``, 30 %; 20 % in the trio)
    and neighbour(s) that launch kernels (their own limits files, the same policy), the daemon's live pass
    running. The later side's processes start ISO_OFFSETS s after the other side's measurement began (0-3 s
    either way; their CUDA start-up and warm-up are their first kernels, as a container that arrives), so a
    GEMM tenant that starts first runs alone, unheld, until its neighbour's first kernels. Read from the
    GEMM tenant's per-second launches against its unlimited steady rate alone in this call, over its whole
    seconds from one second after both sides' first kernels (one second to react): the mean and the largest
    second. Pass: the mean at most the limit + 5 points, every run."""
    lim = 20 if nb == "trio" else 30
    ensure_unl(("gemm",), 8)
    iso_reference(lim, secs)
    out = R.setdefault("isolation", {}).setdefault(f"{nb} {policy}", {"runs": [], "limit": lim})
    for i in range(runs):
        off = (ISO_OFF or ISO_OFFSETS)[i % len(ISO_OFF or ISO_OFFSETS)]
        late_g = off < 0
        n0 = len(PASSES)
        specs = [("gemm", filed(limit=lim, policy=policy), -off if late_g else 0.0, late_g),
                 *[(c, iso_env(nl, policy), 0.0 if late_g else off, not late_g) for c, nl in ISO_NEIGHBOURS[nb]]]
        res = together(specs, secs)
        g = res[0]
        # both sides' first kernels: the late side's KERNELS line; the other side's ran in its warm-up
        late_k = g["kernels_t"] if late_g else max(r["kernels_t"] for r in res[1:])
        from_t = max(g["t0"], late_k) + 1.0
        first = max(1, int(from_t - g["t0"]) + (0 if (from_t - g["t0"]).is_integer() else 1))
        ps = g["per_s"][first:int(g["t1"] - g["t0"])]
        shares = [100 * x / UNL_STEADY["gemm"] for x in ps]
        mean = statistics.mean(shares) if shares else None
        last = int(g["t1"] - g["t0"])
        gpu_t = gpu_time_share(mean, lim)
        # judged by GPU time (the throughput share calibrated by the force reference); where the reference has
        # no NVML reading, by throughput (stricter: it over-reads)
        judged = gpu_t if gpu_t is not None else mean
        ok = judged is not None and judged <= lim + 5
        out["runs"].append({"offset": off, "gemm": g, "neighbours": res[1:], "from_s": first, "shares": shares,
                            "mean": mean, "gpu_time": gpu_t, "clock": mean_clock(g, first, last),
                            "max_s": max(shares) if shares else None, "pass": ok,
                            "alone_before": [100 * x / UNL_STEADY["gemm"] for x in g["per_s"][:first]],
                            "passes": PASSES[n0:]})
        ROWS.append(f"| isolation gemm@{lim} beside {nb} ({policy}; gemm's side {'later' if late_g else 'first'} "
                    f"by {abs(off):g} s; read from its second {first}) | {lim} | "
                    f"{fmt(UNL.get('gemm'))} | {fmt(g['nvml_share'])} | {fmt(g['shim_share'])} | "
                    f"{fmt(g['dev_share'])} | {fmt(mean)}, GPU time {fmt(gpu_t)} (max s "
                    f"{fmt(max(shares) if shares else None)}; neighbours "
                    f"{' / '.join(fmt(r['shim_share']) for r in res[1:])}) | {'pass' if ok else 'FAIL'} |")
        log(ROWS[-1])
        save_now()
    means = [r["mean"] for r in out["runs"]]
    gts = [r["gpu_time"] for r in out["runs"]]
    out["pass"] = all(r["pass"] for r in out["runs"])
    ROWS.append(f"| isolation gemm@{lim} beside {nb} ({policy}): {len(means)} runs | {lim} | - | - | - | - | "
                f"tput {' '.join(fmt(m) for m in means)}; GPU time {' '.join(fmt(m) for m in gts)} | "
                f"{'pass' if out['pass'] else 'FAIL'} |")
    log(ROWS[-1])


def iso_reference(lim, secs):
    """The GEMM tenant alone at ``lim`` %, policy force, the daemon's file, once per limit and call: alone, NVML's
    per-process share is its GPU time, so this checks the clock-normalised reading the isolation runs are judged
    by (throughput, clock-normalised and NVML side by side)."""
    refs = R.setdefault("iso_reference", {})
    if str(lim) in refs:
        return
    (r,) = together([("gemm", filed(limit=lim, policy="force"))], secs)
    last = int(r["t1"] - r["t0"])
    tp = 100 * statistics.mean(r["per_s"][1:last]) / UNL_STEADY["gemm"] if last > 1 else None
    refs[str(lim)] = {"run": r, "tput": tp, "nvml": r["nvml_share"], "shim": r["shim_share"],
                      "clock": mean_clock(r, 1, last), "clock_unlimited": UNL_CLOCK.get("gemm")}
    ROWS.append(f"| reference: gemm@{lim} alone (force, file) | {lim} | {fmt(UNL.get('gemm'))} | "
                f"{fmt(r['nvml_share'])} | {fmt(r['shim_share'])} | {fmt(r['dev_share'])} | tput {fmt(tp)} "
                f"(SM {fmt(mean_clock(r, 1, last), 0)} MHz, unlimited {fmt(UNL_CLOCK.get('gemm'), 0)}) | - |")
    log(ROWS[-1])


# The bypass case: seconds from the start that it is judged from (the live pass counts a region uncharged after
# DISAGREE_PASSES passes, then the guard's account must first go over), and each run's length: the guard holds
# the mean in bursts (a pass's run and the GPU queue after it, then idle), a cycle of about 8 s at 30 %, so a
# run covers several
BYPASS_FROM_S = 6
BYPASS_SECS = 40


@step
def bypass(runs, policy):
    """Issue 37: a tenant that takes no limits from inside (saturating GEMMs, a limits file at 30 % and no shim
    in its process: a static binary, a cleared preload; or the shim mapped with a limiter that does not hold
    it), held from outside by the daemon's bypass guard (hamid/shimlimits/bypass.py: its processes stopped
    while NVML's account of them is over the limit). Alone under force, NVML's per-process share is its GPU
    time: pass at most the limit + 5 from BYPASS_FROM_S on (OVER_LIMIT_PASSES later for the limiter case).
    Beside small kernels at 70 % (the shim, policy ``policy``): its throughput share, calibrated as the
    isolation case's (gpu_time_share), and the neighbour's."""
    lim = 30
    ensure_unl(("gemm", "small"), 8)
    iso_reference(lim, 5)
    out = R.setdefault("bypass", {"runs": [], "limit": lim})
    from hamid.shimlimits.live import OVER_LIMIT_PASSES
    # (how, neighbours, policy, judged from): no shim in its process, alone and beside small kernels; the shim
    # mapped but its limiter not holding it (its file says 99 %, the most a file says: it runs all but free and
    # charges what it runs), alone, held once its own charges say over OVER_LIMIT_PASSES passes that it ran past
    # its limit
    variants = (("no-shim", (), "force", BYPASS_FROM_S), ("no-shim", ("small",), policy, BYPASS_FROM_S),
                ("over-limit", (), "force", BYPASS_FROM_S + OVER_LIMIT_PASSES))
    for _ in range(runs):
        for how, names, pol, from_s in variants:
            if how == "no-shim":
                g_env = {k: v for k, v in filed(limit=lim, policy=pol).items() if k != "LD_PRELOAD"}
            else:
                g_env = filed(limit=lim, policy=pol, file_limit=99)
            beside = tuple((c, filed(limit=70, policy=policy)) for c in names)
            res = together([("gemm", g_env), *beside], BYPASS_SECS)
            g = res[0]
            last = int(g["t1"] - g["t0"])
            shares = [100 * x / UNL_STEADY["gemm"] for x in g["per_s"][from_s:last]]
            tput = statistics.mean(shares) if shares else None
            nv = NV.proc_share(g["pid"], g["t0"] + from_s, g["t1"])
            judged = nv if not beside else gpu_time_share(tput, lim)
            ok = judged is not None and judged <= lim + 5
            out["runs"].append({"how": how, "beside": [c for c, _ in beside], "policy": pol, "from_s": from_s,
                                "gemm": g, "neighbours": res[1:],
                                "shares": shares, "tput": tput, "nvml_from": nv, "judged": judged, "pass": ok})
            what = "with no shim" if how == "no-shim" else "its limiter not holding"
            ROWS.append(f"| bypass: gemm@{lim} {what} ({pol}{', beside small@70' if beside else ', alone'}; "
                        f"from its second {from_s}) | {lim} | {fmt(UNL.get('gemm'))} | {fmt(nv)} | - | "
                        f"{fmt(g['dev_share'])} | tput {fmt(tput)}, judged {fmt(judged)} (neighbour "
                        f"{' / '.join(fmt(r['shim_share']) for r in res[1:]) or '-'}) | {'pass' if ok else 'FAIL'} |")
            log(ROWS[-1])
            save_now()
    out["pass"] = all(r["pass"] for r in out["runs"])


@step
def metrics(classes, lim, secs):
    """Point 5: the daemon's /metrics (Scraper) against NVML, each class alone in file mode at lim %:
    hami_container_device_utilization_ratio against the process's NVML share (smUtil; alone, NVML can tell),
    hami_host_gpu_utilization_ratio against NVML's device-wide share, both within 5 points."""
    out = R.setdefault("metrics", {})
    for c in classes:
        (r,) = together([(c, filed(limit=lim, policy="force"))], secs)
        m, h, n, d = r.get("metrics_share"), r.get("metrics_host"), r["nvml_share"], r["dev_share"]
        ok = None not in (m, h, n, d) and abs(m - n) <= 5 and abs(h - d) <= 5
        out[f"{c}@{lim}"] = {"run": r, "pass": ok}
        ROWS.append(f"| metrics {c} (container ratio / host ratio) | {lim} | - | {fmt(n)} | {fmt(r['shim_share'])} | "
                    f"{fmt(d)} | /metrics {fmt(m)} / {fmt(h)} | {'pass' if ok else 'FAIL'} |")
        log(ROWS[-1])


@step
def repeat(classes, limits, secs, rounds, variants):
    """Each class at each limit, ``rounds`` times interleaved (unlimited, limited, then each variant: a dict of
    extra env), so that drift of the machine falls on all alike; reports each round's throughput ratio and
    the median. What the one-pair singles row cannot tell: whether a ratio under 0.9 is the limiter's cost or
    the run's luck."""
    out = R.setdefault("repeat", {})
    for c in classes:
        for lim in limits:
            rows = {"limited": [], **{k: [] for k in variants}}
            shares = {k: [] for k in rows}
            for _ in range(rounds):
                (unl,) = together([(c, env())], secs)
                for name, extra in [("limited", {}), *variants.items()]:
                    (lr,) = together([(c, env(limit=lim, extra=extra))], secs)
                    rows[name].append(tput(lr, unl))
                    shares[name].append((unl["nvml_share"], lr["nvml_share"], lr["shim_share"], lr.get("held_s")))
                out[f"{c}@{lim}"] = {"ratios": rows, "shares": shares}
                save_now()
            for name, rs in rows.items():
                ROWS.append(f"| repeat {c} ({name}) | {lim} | {' '.join(fmt(x[0]) for x in shares[name])} | "
                            f"{' '.join(fmt(x[1]) for x in shares[name])} | {' '.join(fmt(x[2]) for x in shares[name])} | - | "
                            f"{' '.join(f'{x:.2f}' for x in rs)} (median {statistics.median(rs):.2f}) | - |")
                log(ROWS[-1])


@step
def policy_alone(secs):
    out = R.setdefault("policy", {})
    for c in ("gemm", "small"):
        ensure_unl((c,), secs)
        (d,) = together([(c, env(limit=30, policy="default"))], secs)
        (x,) = together([(c, env(limit=30, policy="disable"))], secs)
        rd, rx = d["rate"][c] / UNL_RATE[c], x["rate"][c] / UNL_RATE[c]
        ok = rd >= 0.95 and rx >= 0.95
        out[c] = {"default": d, "disable": x, "ratio_default": rd, "ratio_disable": rx, "pass": ok}
        ROWS.append(f"| {c} alone, policy default / disable | 30 | {fmt(UNL.get(c))} | {fmt(d['nvml_share'])} / "
                    f"{fmt(x['nvml_share'])} | {fmt(d['shim_share'])} / {fmt(x['shim_share'])} | - | "
                    f"{rd:.2f} / {rx:.2f} | {'pass' if ok else 'FAIL'} |")
        log(ROWS[-1])


@step
def priority(secs, policy):
    """HAMi's task priority: a high-priority inference tenant (dyn, priority 0) beside a saturating
    low-priority training tenant (train, priority 1), both the daemon's (limits files, no compute limit): the
    daemon's live pass lists the high one's pid in the low one's file, whose shim holds its launches while
    the high one runs kernels. Pass: the high one keeps >= 90 % of its alone throughput. The same pair in env
    mode (no daemon, nothing to hold behind) is the baseline."""
    (alone,) = together([("dyn", filed(priority=0, policy=policy))], secs)
    n0 = len(PASSES)
    hi, lo = together([("dyn", filed(priority=0, policy=policy)), ("train", filed(priority=1, policy=policy))],
                      secs)
    holds = [p for p in PASSES[n0:]]
    ensure_unl(("train",), secs)
    lo_rate = UNL_RATE["train"]
    ehi, elo = together([("dyn", env(priority=0, policy=policy)), ("train", env(priority=1, policy=policy))], secs)
    ratio, eratio = tput(hi, alone), tput(ehi, alone)
    R["priority"] = {"alone": alone, "high": hi, "low": lo, "ratio": ratio, "pass": ratio >= 0.9,
                     "low_ratio": lo["rate"]["train"] / lo_rate, "passes": holds,
                     "env_high": ehi, "env_low": elo, "env_ratio": eratio}
    ROWS.append(f"| priority: dyn (high) beside train (low), policy {policy}, daemon's files | - | "
                f"{fmt(alone['nvml_share'])} | {fmt(hi['nvml_share'])} / {fmt(lo['nvml_share'])} | - | "
                f"{fmt(hi['dev_share'])} | {ratio:.2f} (low {lo['rate']['train'] / lo_rate:.2f}) | "
                f"{'pass' if ratio >= 0.9 else 'FAIL'} |")
    ROWS.append(f"| priority baseline: the same pair, env (no hold) | - | - | {fmt(ehi['nvml_share'])} / "
                f"{fmt(elo['nvml_share'])} | - | {fmt(ehi['dev_share'])} | {eratio:.2f} "
                f"(low {elo['rate']['train'] / lo_rate:.2f}) | - |")
    log(ROWS[-2])
    log(ROWS[-1])


@step
def priority_rounds(secs, policy, rounds):
    """The priority case over ``rounds`` interleaved rounds (the high tenant alone, then beside the low one):
    the inference tenant's own alone rate moves 1.02-1.21 M tokens/s between seconds on the H200, so one
    pair read 0.87 and the next call 1.00 (2026-11-26). Pass: the median ratio >= 0.9."""
    ratios, runs = [], []
    for _ in range(rounds):
        (alone,) = together([("dyn", filed(priority=0, policy=policy))], secs)
        n0 = len(PASSES)
        hi, lo = together([("dyn", filed(priority=0, policy=policy)), ("train", filed(priority=1, policy=policy))],
                          secs)
        ratios.append(tput(hi, alone))
        runs.append({"alone": alone, "high": hi, "low": lo, "passes": PASSES[n0:]})
        R["priority_rounds"] = {"ratios": ratios, "runs": runs}
        save_now()
    med = statistics.median(ratios)
    R["priority_rounds"] = {"ratios": ratios, "median": med, "pass": med >= 0.9, "runs": runs}
    ROWS.append(f"| priority, {rounds} interleaved rounds: dyn (high) beside train (low), policy {policy} | - | - | "
                f"- | - | - | {' '.join(f'{r:.2f}' for r in ratios)} (median {med:.2f}) | "
                f"{'pass' if med >= 0.9 else 'FAIL'} |")
    log(ROWS[-1])


@step
def priority_diag(secs, policy, rounds):
    """What slows a high-priority tenant beside a held low-priority one: over ``rounds`` interleaved rounds,
    dyn (the daemon's, priority 0) alone, beside an idle CUDA context (no shim), beside an idle context that
    polls NVML as the shim's monitor does, and beside saturating training held as priority 1 (the priority
    case). Each row: the high tenant's throughput against its alone run of the same round, and its per-second
    rates (a decline within the run shows there)."""
    out = R.setdefault("priority_diag", {})
    nb = {"idle": lambda: ("idle", env(preload=False)),
          "idle+nvml": lambda: ("idle", env(preload=False, extra={"HAMID_BENCH_IDLE_NVML": "1"})),
          "train-low": lambda: ("train", filed(priority=1, policy=policy))}
    for _ in range(rounds):
        (alone,) = together([("dyn", filed(priority=0, policy=policy))], secs)
        out.setdefault("alone", []).append(alone["per_s"])
        for name, mk in nb.items():
            hi, _lo = together([("dyn", filed(priority=0, policy=policy)), mk()], secs)
            out.setdefault(name, []).append({"ratio": tput(hi, alone), "per_s": hi["per_s"],
                                             "nvml": hi["nvml_share"], "dev": hi["dev_share"]})
            save_now()
    for name in nb:
        rs = [x["ratio"] for x in out[name]]
        ROWS.append(f"| priority diag: dyn (high) beside {name} | - | - | "
                    f"{' '.join(fmt(x['nvml']) for x in out[name])} | - | {' '.join(fmt(x['dev']) for x in out[name])} | "
                    f"{' '.join(f'{r:.2f}' for r in rs)} (median {statistics.median(rs):.2f}) | - |")
        log(ROWS[-1])


@step
def overhead(work):
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    import shim_bench as sb
    sb.WORK = Path(work)
    sb.matmul_ratio()
    sb.launch_cost()
    sb.alloc_rate()
    R["overhead"] = {k: sb.R.get(k) for k in ("matmul", "launch_ns", "alloc_rate")}
    R["overhead_rows"] = sb.ROWS


def table(tag):
    lines = [f"compute-limit bench ({tag}), {R['date']} on {R['gpu']}, torch {R.get('torch')}", "",
             "busy share in % of GPU time: NVML per process (nvmlDeviceGetProcessUtilization smUtil), the shim's "
             "own accounting, NVML device-wide; tput = limited / unlimited throughput", "",
             "| workload | limit | unlimited NVML | limited NVML | shim | device | tput | check |",
             "|---|---|---|---|---|---|---|---|", *ROWS]
    for a, b, c, _d in R.get("overhead_rows", []):
        lines.append(f"| {a} | - | - | {b} | - | - | - | target {c} |")
    if NV and NV.proc_err:
        lines.append(f"\nnvmlDeviceGetProcessUtilization error {NV.proc_err}")
    if R.get("errors"):
        lines += ["", "errors: " + json.dumps(R["errors"])[:3000]]
    return "\n".join(lines)


def main():
    global NV
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=str(TMP))
    ap.add_argument("--cases", default="singles,pairs,priority,overhead")
    ap.add_argument("--classes", default=",".join(CLASSES))
    ap.add_argument("--limits", default="30,60")
    ap.add_argument("--secs", type=float, default=5)
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--policy", default="default")
    ap.add_argument("--tag", default="run")
    ap.add_argument("--share-modes", default="env,file")
    ap.add_argument("--pin", action="store_true", help="pin each tenant to its own CPUs (see PIN)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the repeat and priority-rounds cases")
    ap.add_argument("--variant", action="append", default=[],
                    help="repeat case: NAME:K=V[,K=V] a limited run with extra env beside the plain one")
    # tenants sharing the GPU run longer: the daemon's correction learns once a second from the second pass
    # on, and the first seconds of a new mix are what it learns from
    ap.add_argument("--share-secs", type=float, default=10)
    ap.add_argument("--free-pairs", action="store_true",
                    help="sharing: also run each mix with every tenant unlimited (what time slicing costs the sum)")
    ap.add_argument("--mixes", default="", help="pairs case: only these mixes (comma-separated names)")
    ap.add_argument("--iso", default="dyn,small,hfgen,trio",
                    help="the isolation case's neighbours, NAME[:RUNS] (NAME of ISO_NEIGHBOURS)")
    ap.add_argument("--iso-offsets", default="", help="the isolation case's offsets (s, comma-separated)")
    ap.add_argument("--iso-runs", type=int, default=8, help="the isolation case's runs per neighbour")
    ap.add_argument("--bypass-runs", type=int, default=2, help="the bypass case's runs (each alone and beside)")
    ap.add_argument("--metrics-classes", default="gemm,dyn,train", help="the metrics case's classes")
    a = ap.parse_args()
    for kv in a.env:
        k, v = kv.split("=", 1)
        EXTRA[k] = v
    out = Path(a.out)
    if a.pin:
        PIN.append(True)
        # the bench's own threads (NVML pollers, the live pass, the scraper, pipe readers) off the tenants'
        # CPUs (up to three tenants): launch-bound tenants lost a third of their rate for seconds with nothing
        # beside them (round 7, 2026-11-26), and nothing kept these threads off their CPUs. Not yet measured
        # with this on.
        own = CPUS - set(range(PIN0, PIN0 + 3 * PIN_N))
        if own:
            os.sched_setaffinity(0, own)
    ISO_OFF.extend(float(x) for x in a.iso_offsets.split(",") if x)
    if a.free_pairs:
        FREE_PAIRS.append(True)
    variants = {}
    for v in a.variant:
        name, _, kvs = v.partition(":")
        variants[name] = dict(kv.split("=", 1) for kv in kvs.split(",") if kv)
    NV = Nvml()
    global LIVE, BUSY
    from hamid.devices.nvml import NvmlBackend
    from hamid.shimlimits.live import LivePass
    from hamid.shimlimits.bypass import BypassGuard, Signals
    from hamid.shimlimits.hostpids import owned_by
    # the daemon's bypass guard (computeBypass stop, its default), its record in the bench's own directory
    LIVE = LivePass(guard=BypassGuard(Signals(
        TMP / "stopped.json", lambda key, pid: owned_by(pid, key[0], f"{LIMITS_DIR}/hamid.limits"))))
    BUSY = NvmlBackend()
    if os.environ.get("HAMID_BENCH_LIVE_RATE"):  # a variant of the daemon's learning rate (hamid.shimlimits.live)
        import hamid.shimlimits.live as live_mod
        live_mod.LEARN_RATE = float(os.environ["HAMID_BENCH_LIVE_RATE"])
        R["live_rate"] = live_mod.LEARN_RATE
    import limits_work  # noqa: F401 - imported now (it imports torch): a live pass must not wait for it
    if os.path.exists(os.path.join(LIMITS_DIR, "hamid.limits")):
        raise SystemExit(f"{LIMITS_DIR}/hamid.limits exists: every shim on this machine would read it")
    os.makedirs(LIMITS_DIR, exist_ok=True)
    R.update(date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), gpu=NV.name, tag=a.tag,
             shim=str(SHIM), pinned=bool(PIN),
             env=EXTRA, torch=subprocess.run([sys.executable, "-c", "import torch;print(torch.__version__)"],
                                             capture_output=True, text=True).stdout.strip())
    cases = a.cases.split(",")

    def save():
        (out / f"{a.tag}.json").write_text(json.dumps(R, indent=1, default=str))
        (out / f"{a.tag}.md").write_text(table(a.tag) + "\n")
    SAVE.append(save)

    def pairs(modes=None):
        ensure_unl(("gemm", "dyn", "train"), a.secs)
        mixes = {"gemm+gemm": [("gemm", 30), ("gemm", 70)], "gemm+dyn": [("gemm", 30), ("dyn", 70)],
                 "dyn+dyn": [("dyn", 30), ("dyn", 70)],
                 "gemm+dyn+train": [("gemm", 20), ("dyn", 30), ("train", 50)]}
        pick = [m for m in a.mixes.split(",") if m] or list(mixes)
        if set(pick) - set(mixes):
            raise SystemExit(f"--mixes: unknown {sorted(set(pick) - set(mixes))}; expected some of {', '.join(mixes)}")
        for mode in modes or a.share_modes.split(","):
            for m in pick:
                sharing(m, mixes[m], a.share_secs, "force", mode)
            save()

    def policy():  # default: a lone container is not limited (two sharing are: the case "policy-shared")
        ensure_unl(("gemm", "small"), a.secs)
        policy_alone(a.secs)

    def policy_shared():
        ensure_unl(("gemm", "dyn"), a.secs)
        sharing("gemm+gemm", [("gemm", 30), ("gemm", 70)], a.share_secs, "default", "file")
        sharing("gemm+dyn", [("gemm", 30), ("dyn", 70)], a.share_secs, "default", "file")

    run = {"singles": lambda: singles(a.classes.split(","), [int(x) for x in a.limits.split(",")], a.secs),
           "pairs": pairs, "pairs-env": lambda: pairs(["env"]), "policy": policy, "policy-shared": policy_shared,
           "priority": lambda: priority(a.secs, a.policy),
           "overhead": lambda: overhead(a.work),
           "priority-rounds": lambda: priority_rounds(a.secs, a.policy, a.rounds),
           "priority-diag": lambda: priority_diag(a.secs, a.policy, a.rounds),
           "staggered": lambda: [staggered(n, sp, a.share_secs, 5) for n, sp in
                                 (("gemm+dyn", [("gemm", 30), ("dyn", 70)]), ("dyn+gemm", [("dyn", 30), ("gemm", 70)]),
                                  ("dyn+dyn", [("dyn", 30), ("dyn", 70)]))],
           # --iso NAME[:RUNS],...: a neighbour's own run count, else --iso-runs
           "isolation": lambda: [isolation(n.split(":")[0], int(n.split(":")[1]) if ":" in n else a.iso_runs,
                                           a.secs, a.policy) for n in a.iso.split(",")],
           "bypass": lambda: bypass(a.bypass_runs, a.policy),
           "metrics": lambda: metrics(a.metrics_classes.split(","), int(a.limits.split(",")[0]), a.secs),
           "repeat": lambda: repeat(a.classes.split(","), [int(x) for x in a.limits.split(",")], a.secs, a.rounds,
                                    variants)}
    for c in cases:  # in the order given
        if c not in run:
            raise SystemExit(f"--cases: unknown case {c!r}; expected some of {', '.join(run)}")
        run[c]()
        save()
    NV.stop.set()
    print("\n" + table(a.tag))


if __name__ == "__main__":
    main()
