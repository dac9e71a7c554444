"""MPS partitions, round 2 (issue 27 point 4 and 5): what each mechanism gives a 30/70 pair, and
what the control daemon says when a client faults. One run, on one GPU, as root.

Owns orchestration only; tenants are bench/gpu/mps_tenant.py processes run as hamid containers
are (bench/gpu/mps_bench.py's Bench: a mount namespace each, the limits file and pipe directory
bound in, the shim preloaded). All tenants of a group start at once, warm up, say ready, and are
then given one schedule of windows (each tenant alone, each pair together, the whole schedule
run forwards then backwards, so drift cancels); between its windows a tenant idles with its
context open. NVML's SM clock and power are sampled (read only) through every window.

Mechanisms measured:
- ``thread_pct``: hamid's own, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE from the limits file through the
  shim; pairs GEMM+GEMM, GEMM hog+inference, inference+inference, each tenant at 100 % alone
  (the device's unpartitioned rate), each real tenant beside a ``spin`` partner (arithmetic only,
  no memory traffic: what an occupied partition costs without the memory system), and the hog
  at CUDA_MPS_CLIENT_PRIORITY=1 (below normal) beside the inference tenant;
- ``static``: the control daemon started with ``-S`` (static SM partitioning), two partitions
  made with ``sm_partition add`` (30 % and 70 % of the chunks), each client bound with
  CUDA_MPS_SM_PARTITION; where the daemon refuses ``-S`` the refusal is recorded.
- ``faults``: a 30 % GEMM tenant while another client takes an illegal-address fault, then while
  another is SIGKILLed mid-kernel, then while the MPS server itself is stopped (SIGSTOP, 4 s, then
  SIGCONT: a wedged server): what ``get_server_list``, ``get_server_status`` and the server's and
  control daemon's logs say before, during and after (what hamid can detect).

Every control daemon is started and stopped through hamid's MpsControl (the static one is
started by hand with ``-d -S`` in the same pipe directory and stopped by ``quit`` through
MpsControl); bench/gpu/mps_run.sh's trap stops any left. Nothing changes the compute mode or any
GPU setting. Writes $OUT/mps-round2.json after every step.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import mps_bench as mb  # noqa: E402
from hamid.node.mps import gpu_dir  # noqa: E402

TENANT = [sys.executable, str(HERE / "mps_tenant.py")]
R: dict = {"steps": {}}
mb.R = R  # Bench.save writes this module's results
T0 = time.monotonic()
BUDGET_S = float(os.environ.get("MPS_BENCH_BUDGET_S", "320"))
WINDOW_S = float(os.environ.get("MPS_WINDOW_S", "2.5"))
GAP_S = 0.4


def log(*a):
    print(f"[{time.monotonic() - T0:6.1f}s]", *a, flush=True)


def left() -> float:
    return BUDGET_S - (time.monotonic() - T0)


class Sampler:
    """SM clock (MHz) and power (W) every 100 ms, read through NVML (never set)."""

    def __init__(self):
        import pynvml

        self.nv = pynvml
        pynvml.nvmlInit()
        self.h = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.samples: list[tuple[int, int, float]] = []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop.is_set():
            try:
                clk = self.nv.nvmlDeviceGetClockInfo(self.h, self.nv.NVML_CLOCK_SM)
                pw = self.nv.nvmlDeviceGetPowerUsage(self.h) / 1000
                self.samples.append((time.time_ns(), clk, pw))
            except Exception:
                pass
            time.sleep(0.1)

    def between(self, a: int, b: int) -> dict:
        s = [(c, p) for t, c, p in self.samples if a <= t <= b]
        if not s:
            return {}
        return {"sm_mhz": round(statistics.mean(c for c, _ in s)), "power_w": round(statistics.mean(p for _, p in s), 1)}


def save(b):
    (b.out / "mps-round2.json").write_text(json.dumps(R, indent=1, default=str))


def step(name):
    def deco(fn):
        def run(b, *a):
            if left() < 25:
                R["steps"][name] = {"skipped": "out of time"}
                return None
            log("step", name)
            t = time.monotonic()
            out = None
            try:
                out = R["steps"][name] = fn(b, *a)
            except Exception as e:  # keep going: every step is reported
                R["steps"][name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-1500:]}
                log("  failed:", e)
            R["steps"][name + "_s"] = round(time.monotonic() - t, 1)
            save(b)
            return out
        run.__name__ = name
        return run
    return deco


# --- a group of tenants and its schedule ---------------------------------------------------------

def spawn(b, name: str, spec: dict) -> subprocess.Popen:
    """A tenant as a container: spec = {workload, pct, shim (True), env {...}}."""
    shim = spec.get("shim", True)
    env = b.env(shim=shim, pct=spec.get("pct", 100), **spec.get("env", {}))
    errs = mb.STATE / "err"
    errs.mkdir(parents=True, exist_ok=True)
    err = open(errs / f"{name}.err", "w")
    return subprocess.Popen(b.cmd([*TENANT, spec["workload"]], pct=spec.get("pct", 100), shim=shim), env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)


def err_tail(name: str) -> str:
    try:
        return (mb.STATE / "err" / f"{name}.err").read_text(errors="replace")[-600:]
    except OSError:
        return ""


class Lines:
    """Every stdout line of a tenant, read by a thread (a tenant's first line says ready)."""

    def __init__(self, p: subprocess.Popen):
        self.lines: list[str] = []
        self.t = threading.Thread(target=self.read, args=(p,), daemon=True)
        self.t.start()

    def read(self, p):
        for ln in p.stdout:
            self.lines.append(ln)

    def ready(self) -> bool:
        return any(ln.startswith('{"ready"') for ln in self.lines)


def wait_ready(procs: dict[str, subprocess.Popen], lines: dict[str, Lines], timeout: float = 90) -> None:
    end = time.monotonic() + timeout
    while True:
        pending = [n for n in procs if not lines[n].ready()]
        if not pending:
            return
        if time.monotonic() > end:
            raise RuntimeError(f"tenants not ready in {timeout:g} s: {pending}; "
                               + "; ".join(f"{n}: {err_tail(n)}" for n in pending))
        for n in pending:
            if procs[n].poll() is not None:
                raise RuntimeError(f"tenant {n} exited {procs[n].returncode} before ready: {err_tail(n)}")
        time.sleep(0.2)


def run_group(b, tenants: dict[str, dict], windows: list[tuple[str, list[str]]]) -> dict:
    procs = {n: spawn(b, n, s) for n, s in tenants.items()}
    lines = {n: Lines(p) for n, p in procs.items()}
    try:
        wait_ready(procs, lines)
        order = windows + windows[::-1]  # forwards, then backwards: drift cancels in the means
        t = time.time_ns() + int(1e9)
        slots = []
        for wname, who in order:
            slots.append((wname, who, t, t + int(WINDOW_S * 1e9)))
            t += int((WINDOW_S + GAP_S) * 1e9)
        for n, p in procs.items():
            mine = [[a, z] for _, who, a, z in slots if n in who]
            p.stdin.write(json.dumps(mine) + "\n")
            p.stdin.flush()
        sampler = Sampler()
        time.sleep(max(0.0, (t - time.time_ns()) / 1e9))
        outs = {}
        for n, p in procs.items():
            p.stdin.close()
            p.wait(timeout=60)
            lines[n].t.join(timeout=10)
            if p.returncode != 0:
                raise RuntimeError(f"tenant {n} exit {p.returncode}: {err_tail(n)}")
            outs[n] = mb.last_json("".join(lines[n].lines))["rates"]
        sampler.stop.set()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    idx = {n: 0 for n in procs}
    rows = []
    for wname, who, a, z in slots:
        rates = {}
        for n in who:
            rates[n] = outs[n][idx[n]]
            idx[n] += 1
        rows.append({"window": wname, "rates": rates, **sampler.between(a, z)})
    return {"tenants": tenants, "windows": rows, "window_s": WINDOW_S}


def summarize(res: dict, pairs: dict[str, tuple[str, str]], unlimited: dict[str, str] | None = None) -> dict:
    """Per pair: each tenant's rate together over its mean rate alone; and the alone rates against the
    unpartitioned device (the tenant's workload at 100 % alone)."""
    alone: dict[str, list[float]] = {}
    clocks: dict[str, list[int]] = {}
    together: dict[str, list[dict]] = {}
    for w in res["windows"]:
        if len(w["rates"]) == 1:
            (n, r), = w["rates"].items()
            alone.setdefault(n, []).append(r)
            if "sm_mhz" in w:
                clocks.setdefault(n, []).append(w["sm_mhz"])
        else:
            together.setdefault(w["window"], []).append(w)
    mean_alone = {n: statistics.mean(v) for n, v in alone.items()}
    out = {"alone": {n: {"rates": v, "mean": mean_alone[n], "sm_mhz": clocks.get(n)} for n, v in alone.items()}}
    for pname, (x, y) in pairs.items():
        ws = together.get(pname, [])
        if not ws:
            continue
        row = {"tenants": [x, y]}
        for n in (x, y):
            got = statistics.mean(w["rates"][n] for w in ws)
            row[n] = {"together": got, "alone": mean_alone.get(n), "ratio": got / mean_alone[n] if n in mean_alone else None}
            if unlimited and unlimited.get(n) in mean_alone:
                row[n]["alone_share_of_device"] = mean_alone[n] / mean_alone[unlimited[n]]
                row[n]["together_share_of_device"] = got / mean_alone[unlimited[n]]
        row["sm_mhz_together"] = [w.get("sm_mhz") for w in ws]
        row["power_w_together"] = [w.get("power_w") for w in ws]
        if unlimited and all(unlimited.get(n) in mean_alone for n in (x, y)):
            row["alone_sum_of_device"] = sum(row[n]["alone_share_of_device"] for n in (x, y))
            row["together_sum_of_device"] = sum(row[n]["together_share_of_device"] for n in (x, y))
        out[pname] = row
    return out


# --- mechanisms -----------------------------------------------------------------------------------

@step("thread_pct")
def thread_pct(b):
    tenants = {
        "gemm30": {"workload": "matmul", "pct": 30}, "gemm70": {"workload": "matmul", "pct": 70},
        "inf30": {"workload": "shapes", "pct": 30}, "inf70": {"workload": "shapes", "pct": 70},
        "gemm100": {"workload": "matmul", "pct": 100}, "inf100": {"workload": "shapes", "pct": 100},
        "spin30": {"workload": "spin", "pct": 30}, "spin70": {"workload": "spin", "pct": 70},
        "gemm30_lowprio": {"workload": "matmul", "pct": 30, "env": {"CUDA_MPS_CLIENT_PRIORITY": 1}},
    }
    pairs = {
        "gemm+gemm": ("gemm30", "gemm70"), "gemm_hog+inference": ("gemm30", "inf70"),
        "inference+inference": ("inf30", "inf70"),
        "gemm30+spin70": ("gemm30", "spin70"), "spin30+gemm70": ("spin30", "gemm70"),
        "spin30+inf70": ("spin30", "inf70"), "inf30+spin70": ("inf30", "spin70"),
        "gemm_hog_lowprio+inference": ("gemm30_lowprio", "inf70"),
    }
    windows = [(n, [n]) for n in tenants] + [(p, list(xy)) for p, xy in pairs.items()]
    res = run_group(b, tenants, windows)
    unl = {"gemm30": "gemm100", "gemm70": "gemm100", "gemm30_lowprio": "gemm100", "inf30": "inf100",
           "inf70": "inf100"}
    res["summary"] = summarize(res, pairs, unl)
    for p in ("gemm+gemm", "gemm_hog+inference", "inference+inference", "gemm30+spin70", "spin30+inf70",
              "gemm_hog_lowprio+inference"):
        s = res["summary"].get(p, {})
        log(" ", p, {n: round(s[n]["ratio"], 3) for n in s.get("tenants", []) if s[n].get("ratio")})
    return res


def parse_free_chunks(text: str) -> int | None:
    """The GPU row of ``lspart`` (partition column '-'): its free chunks."""
    for ln in text.splitlines():
        f = ln.split()
        if len(f) >= 3 and f[0].startswith("GPU-") and f[1] == "-" and f[2].isdigit():
            return int(f[2])
    return None


def parse_partition(text: str) -> str | None:
    m = re.search(r"Partition\s+(\S+)\s+created", text)
    if m:
        return m.group(1)
    for tok in text.split():
        if tok.startswith("GPU-") and "/" in tok:
            return tok
    return None


@step("static")
def static(b):
    out: dict = {}
    ctl, uuid = b.ctl, b.uuid
    ctl.stop(uuid)  # one daemon per GPU: hamid's goes while the static one runs
    env = ctl._env(uuid)
    env["CUDA_VISIBLE_DEVICES"] = uuid
    p = subprocess.run([ctl.program, "-d", "-S"], env=env, capture_output=True, text=True, timeout=15,
                       cwd=gpu_dir(str(mb.STATE), uuid))
    out["start_-d_-S"] = {"rc": p.returncode, "stdout": p.stdout[-500:], "stderr": p.stderr[-500:]}
    try:
        if p.returncode != 0:
            out["verdict"] = "the control daemon refused -S (static SM partitioning) on this driver"
            return out
        deadline = time.monotonic() + 10
        while True:
            try:
                ctl.server_list(uuid)
                break
            except Exception as e:
                if time.monotonic() > deadline:
                    out["answers"] = f"no: {e}"
                    return out
                time.sleep(0.1)
        def cmd(c):
            try:
                return ctl.command(uuid, c, timeout=20)
            except Exception as e:
                return f"ERROR {e}"
        out["lspart_before"] = cmd("lspart")
        free = parse_free_chunks(out["lspart_before"])
        if free is None:
            out["start_server"] = cmd("start_server -uid 0")
            out["lspart_after_start_server"] = cmd("lspart")
            free = parse_free_chunks(out["lspart_after_start_server"])
        out["free_chunks"] = free
        if not free:
            out["verdict"] = "static partitioning not available on this driver (see lspart/start answers)"
            return out
        c30 = max(1, round(free * 0.3))
        parts = {}
        for name, n in (("p30", c30), ("p70", free - c30)):
            a = cmd(f"sm_partition add {uuid} {n}")
            out[f"add_{name}"] = a
            parts[name] = parse_partition(a)
        out["chunks"] = {"p30": c30, "p70": free - c30}
        out["lspart_parts"] = cmd("lspart")
        if not all(parts.values()):
            out["verdict"] = "sm_partition add gave no partition id"
            return out
        pe = lambda k: {"env": {"CUDA_MPS_SM_PARTITION": parts[k]}, "shim": False}  # noqa: E731
        tenants = {"gemm30": {"workload": "matmul", **pe("p30")}, "gemm70": {"workload": "matmul", **pe("p70")},
                   "inf30": {"workload": "shapes", **pe("p30")}, "inf70": {"workload": "shapes", **pe("p70")}}
        pairs = {"gemm+gemm": ("gemm30", "gemm70"), "gemm_hog+inference": ("gemm30", "inf70"),
                 "inference+inference": ("inf30", "inf70")}
        windows = [(n, [n]) for n in tenants] + [(p, list(xy)) for p, xy in pairs.items()]
        res = run_group(b, tenants, windows)
        res["summary"] = summarize(res, pairs)
        out["group"] = res
        for pn in pairs:
            s = res["summary"].get(pn, {})
            log(" static", pn, {n: round(s[n]["ratio"], 3) for n in s.get("tenants", []) if s[n].get("ratio")})
    finally:
        ctl.stop(uuid)
        out["left_after_stop"] = ctl.daemon_pids(uuid)
        with ctl.locked(uuid):
            ctl.start(uuid)  # hamid's own again, for what follows
    return out


def log_size(uuid_dir: Path, name: str) -> int:
    try:
        return (uuid_dir / name).stat().st_size
    except OSError:
        return 0


def log_since(uuid_dir: Path, name: str, off: int) -> str:
    try:
        with open(uuid_dir / name, "rb") as f:
            f.seek(off)
            return f.read(16000).decode(errors="replace")
    except OSError as e:
        return f"unread: {e}"


@step("faults")
def faults(b):
    """What the control daemon, its server and their logs say when one client faults / is killed."""
    ctl, uuid = b.ctl, b.uuid
    logs = Path(ctl.logs(uuid))

    def snap():
        s = {"t": round(time.monotonic() - T0, 2)}
        try:
            servers = ctl.server_list(uuid)
        except Exception as e:
            return {**s, "server_list": f"ERROR {e}"}
        s["server_list"] = servers
        for pid in servers:
            for c in (f"get_server_status {pid}", f"get_client_list {pid}"):
                try:
                    s[c.split()[0]] = ctl.command(uuid, c, timeout=5)
                except Exception as e:
                    s[c.split()[0]] = f"ERROR {e}"
        return s

    out = {}
    for kind in ("illegal", "sigkill", "server_stopped"):
        if left() < 40:
            out[kind] = "skipped: out of time"
            continue
        offs = {n: log_size(logs, n) for n in ("server.log", "control.log")}
        start = time.time_ns() + int(9e9)
        victim = b.spawn([*mb.TORCH, "one", "matmul", "8", str(start)], pct=30)
        time.sleep(8)
        snaps = [snap()]
        other = None
        if kind == "illegal":
            other = b.spawn([*mb.FAULT, "illegal", "3"], pct=70)
        elif kind == "sigkill":
            other = b.spawn([*mb.FAULT, "spin"], pct=70)
        t_end = time.monotonic() + 12
        acted = False
        stopped: list[int] = []
        try:
            while time.monotonic() < t_end:
                if not acted and time.monotonic() > t_end - 7:
                    acted = True
                    if kind == "sigkill":
                        other.send_signal(signal.SIGKILL)
                    elif kind == "server_stopped":  # the MPS server wedged (SIGSTOP); hamid's checks, then its kill
                        stopped = [p for p in ctl.server_list(uuid)]
                        for pid in stopped:
                            os.kill(pid, signal.SIGSTOP)
                        snaps.append({"stopped_servers": stopped, "t": round(time.monotonic() - T0, 2)})
                if stopped and time.monotonic() > t_end - 4:
                    first = ctl.wedged_servers(uuid, ctl.server_list(uuid))
                    second = ctl.wedged_servers(uuid, ctl.server_list(uuid))
                    killed = [pid for pid in sorted(set(first) & set(second)) if ctl.kill_server(uuid, pid)]
                    snaps.append({"hamid_wedged_first": first, "hamid_wedged_second": second,
                                  "hamid_killed": killed, "t": round(time.monotonic() - T0, 2)})
                    for pid in stopped:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGCONT)
                    stopped = []
                snaps.append(snap())
                time.sleep(0.5)
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        other_said = "-"
        if other is not None:
            try:
                o, e = other.communicate(timeout=30)
                other_said = (o.strip() or e.strip())[-300:] if kind == "illegal" else f"killed, exit {other.returncode}"
            except subprocess.TimeoutExpired:
                other.kill()
                other_said = "did not exit"
        try:
            v = mb.finish(victim, timeout=60)
            victim_said = {"rate": v["matmul"]}
        except Exception as ex:
            victim_said = {"error": str(ex)[-300:]}
        snaps.append(snap())
        p = b.run(mb.TINY)
        snaps.append(snap())
        out[kind] = {"other": other_said, "victim": victim_said, "hamid_health_after": ctl.health(uuid) or "ok",
                     "hamid_client_faults": ctl.client_faults(uuid),
                     "new_client_after": "ok" if p.returncode == 0 else p.stderr[-300:],
                     "snapshots": snaps, "server_log": log_since(logs, "server.log", offs["server.log"]),
                     "control_log": log_since(logs, "control.log", offs["control.log"])}
        log(" ", kind, {k: v for k, v in out[kind].items()
                        if k in ("other", "victim", "hamid_health_after", "hamid_client_faults")})
        save(b)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/mps-out"))
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(mb.STATE, ignore_errors=True)
    made = [d for d in (Path(mb.LIMITS_IN).parent, Path(mb.PIPE_IN)) if not d.exists()]
    for d in made:
        d.mkdir(parents=True)
    b = mb.Bench(out)
    R["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with contextlib.suppress(Exception):
        R["mps_control_version"] = subprocess.run([b.ctl.program, "-v"], capture_output=True, text=True,
                                                  timeout=10).stdout.strip()[:200]
    log("card", R["card"], "driver", R["driver"], "compute mode", R["compute_mode"], "gpu", b.uuid)
    try:
        with b.ctl.locked(b.uuid):
            b.ctl.start(b.uuid)
        for fn in (thread_pct, static, faults):
            if not a.only or fn.__name__ in a.only:
                fn(b)
    finally:
        b.ctl.stop(b.uuid)
        R["daemon_left_after_stop"] = b.ctl.daemon_pids(b.uuid)
        try:
            import pynvml

            pynvml.nvmlInit()
            R["compute_mode_after"] = pynvml.nvmlDeviceGetComputeMode(pynvml.nvmlDeviceGetHandleByIndex(0))
        except Exception as e:
            R["compute_mode_after"] = f"unread: {e}"
        R["total_s"] = round(time.monotonic() - T0, 1)
        save(b)
        for d in reversed(made):
            d.rmdir()
        log("done; daemon left:", R["daemon_left_after_stop"])


if __name__ == "__main__":
    main()
