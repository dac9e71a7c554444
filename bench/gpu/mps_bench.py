"""MPS mode on a real GPU (issue 27): partitions, limits, start latency and faults, in one run.

Owns orchestration only. The GPU's control daemon is started and stopped through hamid's own
code (hamid.node.mps.MpsControl: ``nvidia-cuda-mps-control -d`` with a private pipe and log
directory and the GPU alone in CUDA_VISIBLE_DEVICES; ``quit``), never by hand, and always
stopped before this program ends (also on failure). Nothing here changes the GPU's compute
mode or any other setting. Each tenant is one process (bench/gpu/torch_work.py) run as a hamid
container would be: in a mount namespace of its own where the tenant's limits file (written
by hamid.shimlimits, marked MPS) is bound at /usr/local/vgpu/hamid.limits and the GPU's pipe
directory at /run/hamid-mps, with the shim preloaded; the shim hands the driver the file's
thread percentage and pinned limit. Measures:

- partitions: each tenant of a 30/70 pair (GEMM+GEMM, GEMM hog+inference, inference+inference)
  against itself alone at the same thread percentage, paired runs (alone, together, alone again);
- limits: a 30 % tenant that sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 itself; the memory limit
  past the limit under MPS (shim, and the driver's own pinned limit without the shim);
- start latency: a tiny CUDA program as the first MPS tenant (daemon start included), as a later
  one, and in hami-core mode (shim, no MPS), wall ms;
- faults: a GEMM tenant while another client is SIGKILLed mid-kernel, and while another takes an
  illegal-address fault; whether the daemon stays healthy and a new client starts after;
- what a containerised client needs: a client with a private /dev/shm, and one in a private IPC
  namespace.

Writes $OUT/mps-results.json after every step. Needs root (mount namespaces), torch, cupy, and
cffi + structlog on PYTHONPATH for hamid's modules.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hamid.node.mps import MpsControl, find_program, pipe_dir  # noqa: E402
from hamid.shimlimits import ContainerLimits, DeviceLimits, write_limits_file  # noqa: E402

TORCH = [sys.executable, str(ROOT / "bench" / "gpu" / "torch_work.py")]
SHIM = ROOT / "shim" / "build" / "libvgpu.so"
STATE = Path("/tmp/mpsb")  # short: the control socket's path must fit a unix socket
LIMITS_IN = "/usr/local/vgpu/hamid.limits"
PIPE_IN = "/run/hamid-mps"
R: dict = {"steps": {}}
T0 = time.monotonic()
BUDGET_S = float(os.environ.get("MPS_BENCH_BUDGET_S", "320"))  # the call allows 7 min: room to stop and copy


def log(*a):
    print(f"[{time.monotonic() - T0:6.1f}s]", *a, flush=True)


def left() -> float:
    return BUDGET_S - (time.monotonic() - T0)


class Bench:
    def __init__(self, out: Path):
        self.out = out
        program = find_program("nvidia-cuda-mps-control")
        if program is None:
            raise SystemExit("nvidia-cuda-mps-control not found")
        self.ctl = MpsControl(program, str(STATE))
        import pynvml  # nvidia-ml-py, in the image

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.uuid = pynvml.nvmlDeviceGetUUID(h)
        self.uuid = self.uuid.decode() if isinstance(self.uuid, bytes) else self.uuid
        name = pynvml.nvmlDeviceGetName(h)
        R["card"] = name.decode() if isinstance(name, bytes) else name
        R["driver"] = pynvml.nvmlSystemGetDriverVersion()
        R["compute_mode"] = pynvml.nvmlDeviceGetComputeMode(h)  # read only; 0 = Default
        R["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        pynvml.nvmlShutdown()
        self.n = 0
        # mount namespaces, as a container has them: the limits file and pipe directory are bound in
        self.ns = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind /tmp {PIPE_IN}"],
                                 capture_output=True).returncode == 0
        R["mount_namespaces"] = self.ns

    def save(self):
        (self.out / "mps-results.json").write_text(json.dumps(R, indent=1, default=str))

    # --- a tenant, as hamid would run it ---------------------------------------------------------

    def limits(self, pct: int, mem_mib: int) -> Path:
        self.n += 1
        d = STATE / "t" / str(self.n)
        d.mkdir(parents=True, exist_ok=True)
        lim = d / "hamid.limits"
        write_limits_file(lim, ContainerLimits(
            devices=(DeviceLimits(self.uuid, memory_bytes=mem_mib << 20, sm_percent=pct if pct < 100 else 0),),
            region_path=str(d / "vgpu.cache"), mps=True))
        return lim

    def cmd(self, args: list[str], *, pct: int = 100, mem_mib: int = 40960, shim: bool = True,
            shm_private: bool = False, ipc_private: bool = False) -> list[str]:
        """``args`` as a container would run: its own mounts (nothing shows on the host).
        Without mount namespaces (``self.ns`` False) the tenant runs plainly and gets its
        share through the environment (recorded in the results: no shim, no limits file)."""
        if not self.ns:
            return list(args)
        binds = f"mount --bind {pipe_dir(STATE, self.uuid)} {PIPE_IN}"
        if shim:
            binds += (f" && mount -t tmpfs -o size=1m tmpfs {Path(LIMITS_IN).parent} && touch {LIMITS_IN} && "
                      f"mount --bind {self.limits(pct, mem_mib)} {LIMITS_IN}")
        if shm_private:
            binds += " && mount -t tmpfs -o size=64m tmpfs /dev/shm"
        flags = ["-m"] + (["-i"] if ipc_private else [])
        return ["unshare", *flags, "sh", "-c", binds + ' && exec "$@"', "sh", *args]

    def env(self, *, shim: bool = True, pct: int = 100, mem_mib: int = 40960, **kv) -> dict:
        e = {k: v for k, v in os.environ.items()
             if not k.startswith(("CUDA_MPS_", "CUDA_DEVICE_", "HAMID_", "LD_PRELOAD"))}
        e["PYTHONUNBUFFERED"] = "1"
        if self.ns:
            e["CUDA_MPS_PIPE_DIRECTORY"] = PIPE_IN  # what realize gives; the shim forces it too
            if shim:
                e["LD_PRELOAD"] = str(SHIM)
        else:
            e["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir(STATE, self.uuid)
            if shim:  # what the shim would have set
                e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pct)
                e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mem_mib}M"
        e.update({k: str(v) for k, v in kv.items()})
        return e

    def spawn(self, args, *, env=None, pct: int = 100, mem_mib: int = 40960, shim: bool = True,
              **kw) -> subprocess.Popen:
        return subprocess.Popen(self.cmd(args, pct=pct, mem_mib=mem_mib, shim=shim, **kw),
                                env=env or self.env(shim=shim, pct=pct, mem_mib=mem_mib),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(self, args, *, pct: int = 50, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(self.cmd(args, pct=pct, **kw), env=self.env(pct=pct, shim=kw.get("shim", True)),
                              capture_output=True, text=True, timeout=timeout)


def last_json(out: str) -> dict:
    for ln in reversed(out.splitlines()):
        if ln.startswith("{"):
            return json.loads(ln)
    raise RuntimeError(f"no JSON in output: {out[-500:]}")


def finish(p: subprocess.Popen, timeout: float = 90) -> dict:
    out, err = p.communicate(timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"exit {p.returncode}: {err[-800:]}")
    return last_json(out)


def step(name):
    def deco(fn):
        def run(b: Bench):
            if left() < 20:
                R["steps"][name] = {"skipped": "out of time"}
                return
            log("step", name)
            t = time.monotonic()
            try:
                R["steps"][name] = fn(b)
            except Exception as e:  # keep going: every step is reported
                R["steps"][name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}
                log("  failed:", e)
            R["steps"][name + "_s"] = round(time.monotonic() - t, 1)
            b.save()
        run.__name__ = name
        return run
    return deco


def together(b: Bench, specs: list[tuple[str, int]], seconds: float) -> list[float]:
    """Run the (workload, thread %) tenants at once, measuring the same window; their rates."""
    # together: every tenant has initialised by then (torch import, MPS connect); alone: at once
    start = time.time_ns() + int(9e9) if len(specs) > 1 else 0
    procs = [b.spawn([*TORCH, "one", w, str(seconds), str(start)], pct=p) for w, p in specs]
    outs = [finish(p) for p in procs]
    return [o[w] for o, (w, _) in zip(outs, specs)]


@step("unlimited_reference")
def unlimited(b: Bench):
    """Each workload alone under MPS at 100 % (no partition), through the shim."""
    return {w: together(b, [(w, 100)], 3)[0] for w in ("matmul", "shapes")}


@step("partitions")
def partitions(b: Bench):
    out = {}
    for name, hi, lo in (("gemm+gemm", "matmul", "matmul"), ("gemm_hog+inference", "matmul", "shapes"),
                         ("inference+inference", "shapes", "shapes")):
        if left() < 60:
            out[name] = "skipped: out of time"
            continue
        a30 = together(b, [(hi, 30)], 3)[0]
        b70 = together(b, [(lo, 70)], 3)[0]
        pair = together(b, [(hi, 30), (lo, 70)], 3)
        a30b = together(b, [(hi, 30)], 3)[0]
        b70b = together(b, [(lo, 70)], 3)[0]
        alone30, alone70 = statistics.mean([a30, a30b]), statistics.mean([b70, b70b])
        out[name] = {"tenant30": hi, "tenant70": lo, "alone30": [a30, a30b], "alone70": [b70, b70b],
                     "together": pair, "ratio30": pair[0] / alone30, "ratio70": pair[1] / alone70}
        log(" ", name, {k: round(v, 3) for k, v in out[name].items() if k.startswith("ratio")})
    return out


@step("lift_thread_percentage")
def lift(b: Bench):
    """A 30 % tenant that sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 itself, with the shim (hamid) and
    without it (env only, as plain MPS): the shim's tenant must stay at its 30 %."""
    start = time.time_ns() + int(9e9)
    if not b.ns:
        return {"not run": "no mount namespaces here: the limits file cannot be bound"}
    p = b.spawn([*TORCH, "one", "matmul", "3", str(start)], pct=30,
                env=b.env(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100))
    held = finish(p)["matmul"]
    start = time.time_ns() + int(9e9)
    p = b.spawn([*TORCH, "one", "matmul", "3", str(start)], shim=False,
                env=b.env(shim=False, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100))
    free = finish(p)["matmul"]
    return {"with_shim_limit30_env100": held, "no_shim_env100": free, "ratio": held / free}


@step("memory_limit")
def memory(b: Bench):
    """4 GiB share: 3 GiB then 5 GiB, with the shim (limits file) and with only the driver's pinned
    limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT as the shim sets it, no shim)."""
    p = b.spawn([*TORCH, "tryalloc", "3072", "5120"], pct=50, mem_mib=4096)
    shimmed = finish(p)
    out = {"shim": shimmed}
    for form in ("0=4096M", "0=4G"):
        p = b.spawn([*TORCH, "tryalloc", "3072", "5120"], shim=False,
                    env=b.env(shim=False, CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=form))
        out[f"driver_only_{form}"] = finish(p)
    return out


TINY = [sys.executable, "-c", "import time,torch; t=time.time(); x=torch.ones(1,device='cuda'); "
        "torch.cuda.synchronize(); print('{\"cuda_ms\": %.1f}' % ((time.time()-t)*1000))"]


@step("start_latency")
def latency(b: Bench):
    """Wall ms of a tiny CUDA program: hami-core (shim, no MPS daemon for it), the first MPS tenant
    (control daemon start included), a later MPS tenant. Two each, alternating."""
    res = {"hami_core": [], "mps_first_with_daemon_start": [], "mps_later": []}
    for _ in range(2):
        b.ctl.stop(b.uuid)
        t = time.monotonic()
        p = subprocess.run(TINY, env={k: v for k, v in b.env(shim=True).items() if not k.startswith("CUDA_MPS")},
                           capture_output=True, text=True, timeout=60)
        res["hami_core"].append((time.monotonic() - t) * 1000)
        assert p.returncode == 0, p.stderr[-500:]
        t = time.monotonic()
        with b.ctl.locked(b.uuid):
            b.ctl.start(b.uuid)
        p = b.run(TINY)
        res["mps_first_with_daemon_start"].append((time.monotonic() - t) * 1000)
        assert p.returncode == 0, p.stderr[-500:]
        t = time.monotonic()
        p = b.run(TINY)
        res["mps_later"].append((time.monotonic() - t) * 1000)
        assert p.returncode == 0, p.stderr[-500:]
    res["median_ms"] = {k: statistics.median(v) for k, v in res.items() if isinstance(v, list)}
    res["over_hami_core_ms"] = {k: res["median_ms"][k] - res["median_ms"]["hami_core"]
                                for k in ("mps_first_with_daemon_start", "mps_later")}
    return res


FAULT = [sys.executable, "-c", """
import json, sys, time
import cupy as cp
bad = cp.RawKernel(r'extern "C" __global__ void bad(int *p) { p[threadIdx.x * 1000003 + 77777777] = 1; }', 'bad')
spin = cp.RawKernel(r'extern "C" __global__ void spin(long long n) { long long t = clock64(); while (clock64() - t < n) {} }',
                    'spin')
if sys.argv[1] == 'illegal':
    x = cp.zeros(1, dtype=cp.int32)
    cp.cuda.Device().synchronize()
    time.sleep(float(sys.argv[2]))
    try:
        bad((1,), (256,), (x,))
        cp.cuda.Device().synchronize()
        print(json.dumps({'fault': 'none'}))
    except Exception as e:
        print(json.dumps({'fault': str(e)[:200]}))
else:
    while True:
        spin((132,), (1024,), (cp.int64(2_000_000_000),))
        cp.cuda.Device().synchronize()
"""]


@step("faults")
def faults(b: Bench):
    """A GEMM tenant (30 %) for 8 s while another client (70 %) is SIGKILLed mid-kernel / takes an
    illegal-address fault; the victim's rate against its alone rate, the daemon's health after, and
    whether a new client starts after."""
    out = {}
    alone = together(b, [("matmul", 30)], 4)[0]
    out["alone_30"] = alone
    for kind in ("sigkill", "illegal"):
        if left() < 45:
            out[kind] = "skipped: out of time"
            continue
        start = time.time_ns() + int(9e9)
        victim = b.spawn([*TORCH, "one", "matmul", "8", str(start)], pct=30)
        if kind == "sigkill":
            other = b.spawn([*FAULT, "spin"], pct=70)
            time.sleep(12)  # inside the victim's window, the spinner's kernel running
            other.send_signal(signal.SIGKILL)
            other.wait(timeout=30)
            other_said = f"killed, exit {other.returncode}"
        else:
            other = b.spawn([*FAULT, "illegal", "11"], pct=70)
            o, e = other.communicate(timeout=60)
            other_said = (o.strip() or e.strip())[-300:]
        try:
            v = finish(victim, timeout=120)
            victim_said = {"rate": v["matmul"], "ratio_to_alone": v["matmul"] / alone}
        except Exception as e:
            victim_said = {"error": str(e)[-600:]}
        health = b.ctl.health(b.uuid)
        p = b.run(TINY)
        out[kind] = {"other": other_said, "victim": victim_said, "daemon_health_after": health or "ok",
                     "new_client_after": "ok" if p.returncode == 0 else p.stderr[-300:]}
        if health:  # what hamid does: restart it (its tenants are marked failed by the node)
            b.ctl.stop(b.uuid)
            with b.ctl.locked(b.uuid):
                b.ctl.start(b.uuid)
        log(" ", kind, out[kind])
    return out


@step("container_needs")
def container_needs(b: Bench):
    """Does a client in a private /dev/shm, or in a private IPC namespace, still reach the server?"""
    out = {}
    for name, kw in (("private_dev_shm", {"shm_private": True}), ("private_ipc_ns", {"ipc_private": True})):
        if not b.ns:
            out[name] = "not run: no mount namespaces here"
            continue
        p = b.run(TINY, **kw)
        out[name] = "ok" if p.returncode == 0 else f"failed: {p.stderr.strip()[-300:]}"
    # A client of another UID (nobody): its server runs as that UID and needs the pipe directory's path.
    # As hamid lays it out (the state directory's mps/ is 0700), then with mps/ opened to 0711.
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", "HOME=/tmp", *TINY]
    base = STATE / "mps"
    for name, mode in (("non_root_client_state_0700", 0o700), ("non_root_client_mps_dir_0711", 0o711)):
        if not b.ns:
            out[name] = "not run: no mount namespaces here"
            continue
        os.chmod(base, mode)
        try:
            p = b.run(nobody, shim=False, timeout=90)
            out[name] = "ok" if p.returncode == 0 else f"failed: {(p.stderr.strip() or p.stdout.strip())[-300:]}"
        finally:
            os.chmod(base, 0o700)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/mps-out"))
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(STATE, ignore_errors=True)
    made = [d for d in (Path(LIMITS_IN).parent, Path(PIPE_IN)) if not d.exists()]  # mount points, empty
    for d in made:
        d.mkdir(parents=True)
    b = Bench(out)
    log("card", R["card"], "driver", R["driver"], "compute mode", R["compute_mode"], "gpu", b.uuid)
    try:
        with b.ctl.locked(b.uuid):
            b.ctl.start(b.uuid)
        R["daemon_pids"] = b.ctl.daemon_pids(b.uuid)
        # the measurements first; the unlimited reference only with --only
        for fn in (memory, lift, partitions, latency, faults, container_needs):
            if not a.only or fn.__name__ in a.only:
                fn(b)
        if a.only and "unlimited_reference" in a.only:
            unlimited(b)
    finally:
        b.ctl.stop(b.uuid)
        R["daemon_left_after_stop"] = b.ctl.daemon_pids(b.uuid)
        R["daemon_answers_after_stop"] = b.ctl.running(b.uuid)
        try:  # read only: the bench never sets it
            import pynvml

            pynvml.nvmlInit()
            R["compute_mode_after"] = pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByIndex(0))
            pynvml.nvmlShutdown()
        except Exception as e:
            R["compute_mode_after"] = f"unread: {e}"
        logs = Path(STATE, "mps", b.uuid, "log")
        for f in sorted(logs.glob("*.log")) if logs.is_dir() else ():
            R.setdefault("mps_logs", {})[f.name] = f.read_text(errors="replace")[-4000:]
        R["total_s"] = round(time.monotonic() - T0, 1)
        b.save()
        for d in reversed(made):
            d.rmdir()
        log("done; daemon left:", R["daemon_left_after_stop"])


if __name__ == "__main__":
    main()
