"""Gossip at 10, 50 and 100 members on loopback, spread over worker processes.

The members are in-process ``GossipService`` instances with the shipped
defaults (``GossipParams()``, AES-GCM on), hosted by worker processes of at
most ``--per-worker`` members each (one Python process per ~25 members, as one
process per member would not fit a small machine, and 100 in one process
starve on its one core: the GIL runs them one at a time). The coordinator
talks to the workers over pipes and every timestamp is CLOCK_MONOTONIC,
which is the same clock in every process. For each size:

- join: all members started (3 seeds first, the rest as fast as they
  start), time until every member sees every other alive with its capacity
  document; with suspicions and refutations during the join.
- convergence: a member's capacity document changes; time until 99% of the
  members hold the new version (median of several changes). Baseline in the
  same run: the origin sends the document straight to every member over the
  same links (the transport's floor, no epidemic).
- bytes/s per member: frames sent, idle and with one document change per
  second somewhere in the cluster; and the workers' CPU per member, idle.
- failure detection: a member crashes (sockets closed, no leave notice); time
  until the first member declares it dead, and until 99% see it dead.
- false deaths: alive members that any member ever declared dead.
- at the largest size, one real ``hamid run`` daemon joins as the last
  member: time until it sees everyone, its RSS and CPU over an idle window
  (from the kernel's per-thread run time), against the same daemon without
  gossip in this run.

Targets at 100: 99% convergence <= 2 s, <= 20 KB/s per member, detection
median <= 8 s, <= 80 MB RSS, <= 1% of a core, no false deaths. Usage::

    .venv/bin/python bench/gossip.py [--sizes 10,50,100] [--trials 3] [--quick] [--per-worker 25]
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

TARGETS = {"converge_s": 2.0, "bytes_per_s": 20_000, "detect_s": 8.0, "rss_mb": 80.0, "cpu_pct": 1.0,
           "false_deaths": 0}
DEAD = 2


# --- worker process ---------------------------------------------------------

def _view(name: str, used: int):
    from hamid.placement.view import GpuView, NodeView

    gpus = tuple(GpuView(uuid=f"GPU-{name}-{i}", index=i, name="NVIDIA H100 80GB HBM3", mode="hami-core",
                         mem_total=81559, cores_total=100, shares_total=10, mem_used=used if i == 0 else 0)
                 for i in range(8))
    return NodeView(name, gpus)


class Host:
    """The members one worker process runs, and the commands it answers."""

    def __init__(self, nursery: trio.Nursery, key: bytes) -> None:
        from hamid.keyring import Keyring
        from hamid.gossip.params import GossipParams

        self.nursery = nursery
        self.keyring = Keyring([key])
        self.params = GossipParams()
        self.nodes: dict = {}
        self.scopes: dict[str, trio.CancelScope] = {}
        self.used: dict[str, int] = {}
        self.doc_seen: dict[str, dict[str, tuple[int, float]]] = {}  # member -> origin -> (version, first seen)

    def _live(self):
        return [s for n, s in self.nodes.items() if not self.scopes[n].cancel_called]

    def _hook_docs(self, svc) -> None:
        m = svc.membership
        seen = self.doc_seen[svc.name] = {}
        inner = m._apply_doc

        def apply_doc(name, doc, *a, **kw):
            r = inner(name, doc, *a, **kw)
            have = m.docs.get(name)
            if have is not None and seen.get(name, (0, 0.0))[0] < have["version"]:
                seen[name] = (have["version"], time.monotonic())
            return r
        m._apply_doc = apply_doc

    async def _run(self, svc, scope, task_status=trio.TASK_STATUS_IGNORED):
        with scope:
            await svc.run(task_status=task_status)

    async def cmd_start(self, names, seeds):
        from hamid.gossip.service import GossipService

        addrs = {}
        for name in names:
            self.used[name] = 0
            svc = GossipService(name, "127.0.0.1:0", params=self.params, seeds=tuple(seeds), keyring=self.keyring,
                                view_in_thread=False, read_view=lambda name=name: _view(name, self.used[name]))
            self._hook_docs(svc)
            self.nodes[name] = svc
            self.scopes[name] = trio.CancelScope()
            addrs[name] = await self.nursery.start(self._run, svc, self.scopes[name])
        return {"addrs": addrs}

    async def cmd_converged(self, names):
        want = set(names)
        ok = 0
        for s in self._live():
            m = s.membership
            if {k for k, v in m.members.items() if v.state == 0} == want and set(m.live_docs()) == want:
                ok += 1
        return {"ok": ok, "of": len(self._live())}

    async def cmd_publish(self, name):
        s = self.nodes[name]
        self.used[name] += 1024
        t0 = time.monotonic()
        await s.publish()
        return {"version": s.membership.docs[name]["version"], "t0": t0}

    async def cmd_direct(self, name, addrs):
        s = self.nodes[name]
        doc = dict(s.membership.docs[name])
        doc["version"] += 1
        s._doc = doc
        s.membership.docs[name] = doc
        t0 = time.monotonic()
        for a in addrs:
            s.transport.send(a, {"t": "caps", "docs": [doc]})
        return {"version": doc["version"], "t0": t0}

    async def cmd_doc_seen(self, origin, version):
        out = []
        for s in self._live():
            if s.name == origin:
                continue
            v, t = self.doc_seen[s.name].get(origin, (0, 0.0))
            out.append(t if v >= version else None)
        return {"times": out}

    async def cmd_usage(self):
        live = self._live()
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return {"bytes": sum(s.stats.bytes_sent for s in live), "members": len(live),
                "cpu": ru.ru_utime + ru.ru_stime, "rss_mb": ru.ru_maxrss / 1024}

    async def cmd_crash(self, name):
        self.nodes[name].leave_on_exit = False
        t0 = time.monotonic()
        self.scopes[name].cancel()
        return {"t0": t0}

    async def cmd_dead_seen(self, victim):
        out = []
        for s in self._live():
            ts = [t for t, n, st in s.membership.changes if n == victim and st == "dead"]
            out.append(ts[0] if ts else None)
        return {"times": out}

    async def cmd_health(self, crashed):
        crashed = set(crashed)
        deaths = [(s.name, n, t) for s in self.nodes.values() for t, n, st in s.membership.changes
                  if st == "dead" and n not in crashed]
        return {"false_deaths": deaths,
                "suspicions": sum(s.stats.suspicions for s in self.nodes.values()),
                "refutations": sum(s.stats.refutations for s in self.nodes.values())}


async def worker_main(key_b64: str) -> None:
    from hamid import logs

    logs.configure("console", "error")
    async with trio.open_nursery() as nursery:
        host = Host(nursery, base64.b64decode(key_b64))
        while True:
            line = await trio.to_thread.run_sync(sys.stdin.readline)
            if not line:
                break
            req = json.loads(line)
            op = req.pop("op")
            if op == "quit":
                break
            try:
                reply = await getattr(host, f"cmd_{op}")(**req)
            except Exception as e:  # report, keep serving
                reply = {"error": f"{type(e).__name__}: {e}"}
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
        nursery.cancel_scope.cancel()


# --- coordinator -----------------------------------------------------------

class Worker:
    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.buf = b""
        self.lock = trio.Lock()
        self.names: list[str] = []

    async def call(self, op: str, **kw):
        async with self.lock:
            await self.proc.stdin.send_all((json.dumps({"op": op, **kw}) + "\n").encode())
            while b"\n" not in self.buf:
                chunk = await self.proc.stdout.receive_some(1 << 20)
                if not chunk:
                    raise RuntimeError(f"worker exited during {op}")
                self.buf += chunk
            line, _, self.buf = self.buf.partition(b"\n")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"worker {op}: {reply['error']}")
        return reply


class Cluster:
    def __init__(self, n: int, key_b64: str, per_worker: int) -> None:
        self.n, self.key_b64, self.per_worker = n, key_b64, per_worker
        self.workers: list[Worker] = []
        self.where: dict[str, Worker] = {}
        self.addrs: dict[str, str] = {}
        self.crashed: list[str] = []
        self.extra: set[str] = set()  # members that are not in-process (the real daemon)

    async def spawn(self) -> None:
        for _ in range(max(1, math.ceil(self.n / self.per_worker))):
            p = await trio.lowlevel.open_process([sys.executable, __file__, "--worker", self.key_b64],
                                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            self.workers.append(Worker(p))

    async def close(self) -> None:
        for w in self.workers:
            try:
                with trio.move_on_after(2):
                    await w.proc.stdin.send_all(b'{"op": "quit"}\n')
                    await w.proc.wait()
            except Exception:
                pass
            if w.proc.returncode is None:
                w.proc.kill()

    async def start(self, rate: float) -> None:
        names = [f"m{i:03d}" for i in range(self.n)]
        for i, name in enumerate(names):  # the seeds on different workers, like the rest
            w = self.workers[i % len(self.workers)]
            w.names.append(name)
            self.where[name] = w
        seeds = []
        for name in names[:3]:  # the seeds, one after the other
            r = await self.where[name].call("start", names=[name], seeds=seeds)
            self.addrs.update(r["addrs"])
            seeds.append(r["addrs"][name])
        self.seeds = seeds

        async def one(name: str) -> None:
            r = await self.where[name].call("start", names=[name], seeds=seeds)
            self.addrs.update(r["addrs"])

        async def rest(w: Worker) -> None:
            r = await w.call("start", names=[n for n in w.names if n not in self.addrs], seeds=seeds)
            self.addrs.update(r["addrs"])
        async with trio.open_nursery() as nursery:
            if rate <= 0:  # all at once, each worker starting its members one after the other
                for w in self.workers:
                    nursery.start_soon(rest, w)
            else:
                at = trio.current_time()
                for name in names[3:]:
                    at += 1 / rate
                    await trio.sleep_until(at)
                    nursery.start_soon(one, name)

    def live(self) -> list[str]:
        return [n for n in self.addrs if n not in self.crashed]

    async def gather(self, op: str, **kw) -> list[dict]:
        out: list[dict] = []

        async def one(w: Worker) -> None:
            out.append(await w.call(op, **kw))
        async with trio.open_nursery() as nursery:
            for w in self.workers:
                nursery.start_soon(one, w)
        return out

    async def converged(self) -> bool:
        names = self.live() + sorted(self.extra)
        rs = await self.gather("converged", names=names)
        return sum(r["ok"] for r in rs) == sum(r["of"] for r in rs)

    async def times(self, op: str, **kw) -> list[float | None]:
        return [t for r in await self.gather(op, **kw) for t in r["times"]]

    async def usage(self) -> tuple[int, int, float]:
        rs = await self.gather("usage")
        return sum(r["bytes"] for r in rs), sum(r["members"] for r in rs), sum(r["cpu"] for r in rs)


async def _wait(pred, timeout: float, every: float = 0.05) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if await pred():
            return time.monotonic() - t0
        await trio.sleep(every)
    return None


def _quantile_time(times: list[float | None], q: float, t0: float) -> float | None:
    """When a fraction ``q`` of ``times`` had happened (after t0), or None."""
    need = max(1, math.ceil(q * len(times) - 1e-9))
    got = sorted(t for t in times if t is not None)
    return got[need - 1] - t0 if len(got) >= need else None


async def _until_quantile(c: Cluster, op: str, q: float, t0: float, timeout: float, **kw) -> float | None:
    deadline = time.monotonic() + timeout
    while True:
        r = _quantile_time(await c.times(op, **kw), q, t0)
        if r is not None or time.monotonic() > deadline:
            return r
        await trio.sleep(0.05)


async def converge_trial(c: Cluster, idx: int) -> float | None:
    origin = c.live()[idx % len(c.live())]
    r = await c.where[origin].call("publish", name=origin)
    return await _until_quantile(c, "doc_seen", 0.99, r["t0"], 30, origin=origin, version=r["version"])


async def direct_baseline(c: Cluster, idx: int) -> float | None:
    origin = c.live()[idx % len(c.live())]
    r = await c.where[origin].call("direct", name=origin, addrs=[c.addrs[n] for n in c.live() if n != origin])
    return await _until_quantile(c, "doc_seen", 0.99, r["t0"], 30, origin=origin, version=r["version"])


async def bandwidth(c: Cluster, seconds: float, churn: bool) -> tuple[float, float]:
    """(bytes/s per member, CPU % of a core per in-process member)."""
    b0, _, cpu0 = await c.usage()
    t0 = time.monotonic()
    end = t0 + seconds
    i = 0
    while time.monotonic() < end:
        if churn:
            name = c.live()[i % len(c.live())]
            await c.where[name].call("publish", name=name)
            i += 1
        await trio.sleep(min(1.0, max(0.0, end - time.monotonic())) if churn else seconds)
    b1, members, cpu1 = await c.usage()
    dt = time.monotonic() - t0
    return (b1 - b0) / dt / members, 100 * (cpu1 - cpu0) / dt / members


async def detect_trial(c: Cluster, victim: str) -> tuple[float | None, float | None]:
    r = await c.where[victim].call("crash", name=victim)
    c.crashed.append(victim)
    first = await _until_quantile(c, "dead_seen", 1e-9, r["t0"], 120, victim=victim)
    most = await _until_quantile(c, "dead_seen", 0.99, r["t0"], 120, victim=victim)
    return first, most


def _thread_cpu(pid: int) -> dict[str, int]:
    """Run time in nanoseconds of each live thread of a process, from the
    kernel's schedstat (``/proc/PID/stat`` counts in 10 ms ticks, too coarse
    for a fraction of a percent over half a minute)."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{t}/schedstat") as f:
                out[t] = int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


def _cpu_between(a: dict[str, int], b: dict[str, int]) -> float:
    """CPU seconds between two samples; a thread that ended in between is left
    out (trio's idle worker threads exit after 10 s: what they ran in the
    window, a ledger read or two, is lost, and what they ran before is not
    taken off)."""
    return sum(v - a.get(t, 0) for t, v in b.items()) / 1e9


def _proc_rss(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def daemon_usage(tmp: Path, key_b64: str, c: Cluster | None, window: float, settle: float) -> dict:
    name = "daemon-gossip" if c is not None else "daemon-plain"
    state = tmp / name
    kf = tmp / "key"
    kf.write_text(key_b64 + "\n")
    cmd = [sys.executable, "-m", "hamid.cli.main", "run", "--state-dir", str(state), "--metrics-port", "0",
           "--node-name", name, "--simulate", "H100:8", "--log-format", "json", "--log-level", "warning"]
    if c is not None:
        cmd += ["--gossip-listen", f"127.0.0.1:{_free_port()}", "--join", ",".join(c.seeds),
                "--gossip-key-file", str(kf)]
    out: dict = {}
    t_start = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if c is not None:
            from hamid.localapi.client import LocalClient

            c.extra.add(name)
            want = set(c.live()) | {name}

            async def sees_all() -> bool:
                def look():
                    try:
                        with LocalClient(state, timeout=5) as cl:
                            doc = cl.cluster()
                    except Exception:
                        return False
                    alive = {m["name"] for m in doc["members"] if m["state"] == "alive" and m["capacity"]}
                    return alive == want
                return await trio.to_thread.run_sync(look) and await c.converged()
            got = await _wait(sees_all, 120, every=0.2)
            out["join_s"] = None if got is None else time.monotonic() - t_start
        await trio.sleep(settle)
        c0, t0 = _thread_cpu(p.pid), time.monotonic()
        await trio.sleep(window)
        c1, t1 = _thread_cpu(p.pid), time.monotonic()
        out.update(cpu_pct=100 * _cpu_between(c0, c1) / (t1 - t0), rss_mb=_proc_rss(p.pid))
        if c is not None:
            with LocalClient(state, timeout=5) as cl:
                doc = cl.cluster()
            out["false_deaths"] = sorted(m["name"] for m in doc["members"]
                                         if m["state"] == "dead" and m["name"] not in c.crashed)
        return out
    finally:
        p.terminate()
        await trio.to_thread.run_sync(p.wait)
        if c is not None:
            c.extra.discard(name)
            c.crashed.append(name)  # it left: not a false death when members mark it gone


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


async def bench_size(n: int, trials: int, quick: bool, key_b64: str, tmp: Path, with_daemon: bool,
                     per_worker: int, join_rate: float) -> dict:
    out: dict = {"n": n, "join_rate": join_rate}
    c = Cluster(n - (1 if with_daemon else 0), key_b64, per_worker)
    try:
        await c.spawn()
        out["workers"] = len(c.workers)
        cpu0 = (await c.usage())[2]
        t0 = time.monotonic()
        await c.start(join_rate)
        out["started_s"] = time.monotonic() - t0
        joined = await _wait(c.converged, 180, every=0.1)
        out["join_all_s"] = None if joined is None else time.monotonic() - t0
        out["join_cpu_cores"] = ((await c.usage())[2] - cpu0) / (time.monotonic() - t0)
        h = (await c.gather("health", crashed=[]))
        out["join_suspicions"] = sum(r["suspicions"] for r in h)
        out["join_refutations"] = sum(r["refutations"] for r in h)
        await trio.sleep(2)
        out["converge_s"] = _med([await converge_trial(c, i * 7) for i in range(trials)])
        await trio.sleep(1)
        out["direct_s"] = _med([await direct_baseline(c, i * 5) for i in range(trials)])
        await trio.sleep(1)
        out["idle_bytes_per_s"], out["idle_cpu_pct"] = await bandwidth(c, 5 if quick else 15, churn=False)
        out["churn_bytes_per_s"], out["churn_cpu_pct"] = await bandwidth(c, 5 if quick else 15, churn=True)
        if with_daemon:
            out["daemon"] = await daemon_usage(tmp, key_b64, c, window=15 if quick else 30, settle=5)
            out["daemon_plain"] = await daemon_usage(tmp, key_b64, None, window=15 if quick else 30, settle=3)
        dets = []
        victims = c.live()[-trials:]
        for v in victims:
            dets.append(await detect_trial(c, v))
        out["detect_first_s"] = _med([d[0] for d in dets])
        out["detect_99_s"] = _med([d[1] for d in dets])
        h = await c.gather("health", crashed=c.crashed)
        deaths = [d for r in h for d in r["false_deaths"]]
        out["false_deaths"] = len({d[1] for d in deaths})
        out["false_death_events"] = len(deaths)
        out["suspicions"] = sum(r["suspicions"] for r in h)
        out["refutations"] = sum(r["refutations"] for r in h)
    finally:
        await c.close()
    return out


def _f(x, fmt=".2f"):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def report(r: dict, trials: int) -> None:
    n = r["n"]
    rate = f"{r['join_rate']:g}/s" if r["join_rate"] > 0 else "all at once"
    print(f"\nn={n}: {r['workers']} worker processes; started {rate}, all started in {_f(r['started_s'])} s, all joined "
          f"(everyone sees everyone alive with its document) in {_f(r['join_all_s'])} s, using "
          f"{r['join_cpu_cores']:.2f} cores; "
          f"suspicions during the join {r['join_suspicions']}, refutations {r['join_refutations']}")
    cv, dr = r["converge_s"], r["direct_s"]
    ratio = cv / dr if dr and not math.isnan(dr) and dr > 0 else float("nan")
    print(f"  99% convergence  {_f(cv, '.3f')} s  (direct send to all, same run: {_f(dr, '.3f')} s;"
          f" ratio {_f(ratio, '.1f')}x)  target {TARGETS['converge_s']} s: {_f(cv / TARGETS['converge_s'])} of target")
    print(f"  bytes/s/member   idle {r['idle_bytes_per_s']:.0f}  with 1 change/s {r['churn_bytes_per_s']:.0f}"
          f"  target {TARGETS['bytes_per_s']}: {r['churn_bytes_per_s'] / TARGETS['bytes_per_s']:.3f} of target")
    print(f"  CPU per in-process member  idle {r['idle_cpu_pct']:.3f}%  with 1 change/s {r['churn_cpu_pct']:.3f}%"
          " of a core (workers' CPU / members)")
    print(f"  detection        first {_f(r['detect_first_s'])} s, 99% {_f(r['detect_99_s'])} s (median of "
          f"{trials})  target {TARGETS['detect_s']} s: {_f(r['detect_first_s'] / TARGETS['detect_s'])} of target")
    print(f"  false deaths     {r['false_deaths']} alive members declared dead ({r['false_death_events']} "
          f"declarations; {r['suspicions']} suspicions, {r['refutations']} refutations in the whole run)  "
          f"target {TARGETS['false_deaths']}")
    if "daemon" in r:
        d, b = r["daemon"], r["daemon_plain"]
        print(f"  hamid run as member {n}: saw everyone after {_f(d.get('join_s'))} s; RSS {d['rss_mb']:.1f} MB "
              f"(without gossip {b['rss_mb']:.1f} MB; {d['rss_mb'] / TARGETS['rss_mb']:.2f} of target), "
              f"CPU {d['cpu_pct']:.2f}% of a core (without gossip {b['cpu_pct']:.2f}%; "
              f"{d['cpu_pct'] / TARGETS['cpu_pct']:.2f} of target); members it holds dead: "
              f"{len(d['false_deaths'])}")


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        trio.run(worker_main, sys.argv[2])
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10,50,100")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="shorter windows")
    ap.add_argument("--per-worker", type=int, default=25, help="members per worker process (default 25)")
    ap.add_argument("--join-rate", type=float, default=5.0,
                    help="members started per second after the 3 seeds (default 5; 0: all at once). Each "
                         "member has a machine of its own in a real group; here 100 share this one, and a "
                         "join's gossip costs every member CPU, so starting them all at once measures the "
                         "machine's cores, not the protocol")
    ap.add_argument("--burn", type=int, default=0,
                    help="keep this many other processes spinning on the CPU for the whole run (issue 25: 0 "
                         "false deaths with the machine's cores kept busy by other work, load 2x cores: "
                         "--burn twice the CPU count); the load average is reported")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.burn)]
    try:
        return _run(args)
    finally:
        for b in burners:
            b.kill()
        print(f"load average at the end: {os.getloadavg()} ({args.burn} spinning processes, {os.cpu_count()} CPUs)")


def _run(args) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited by the workers
    from hamid.gossip.params import GossipParams

    key_b64 = base64.b64encode(os.urandom(32)).decode()
    sizes = [int(x) for x in args.sizes.split(",")]
    print(f"gossip bench: defaults {GossipParams().as_dict()}; {os.cpu_count()} CPUs")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            r = trio.run(bench_size, n, args.trials, args.quick, key_b64, Path(tmp), n == max(sizes),
                         args.per_worker, args.join_rate)
            results.append(r)
            report(r, args.trials)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
