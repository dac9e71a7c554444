"""Gossip at 10, 50 and 100 members on loopback (in-process instances).

For each size, with the shipped defaults (``GossipParams()``, AES-GCM on):

- convergence: a member's capacity document changes; time until 99% of the
  members hold the new version (median of several changes). Baseline in the
  same run: the time for the origin to send the document straight to every
  member over the same links (the transport's floor, no epidemic).
- bytes/s per member: frames sent, idle and with one document change per
  second somewhere in the cluster.
- failure detection: a member crashes (sockets closed, no leave notice); time
  until the first member declares it dead, and until 99% see it dead.
- one real ``hamid run`` daemon joined as the 100th member: its RSS and CPU
  over an idle window, against the same daemon without gossip in this run.

Targets at 100: 99% convergence <= 2 s, <= 20 KB/s per member, detection
median <= 8 s, <= 80 MB RSS, <= 1% of a core. Usage::

    .venv/bin/python bench/gossip.py [--sizes 10,50,100] [--trials 3] [--quick]
"""

from __future__ import annotations

import argparse
import base64
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

from hamid import logs
from hamid.gossip.keyring import Keyring
from hamid.gossip.params import GossipParams
from hamid.gossip.service import GossipService
from hamid.placement.view import GpuView, NodeView

TARGETS = {"converge_s": 2.0, "bytes_per_s": 20_000, "detect_s": 8.0, "rss_mb": 80.0, "cpu_pct": 1.0}


def _view(name: str, used: int) -> NodeView:
    gpus = tuple(GpuView(uuid=f"GPU-{name}-{i}", index=i, name="NVIDIA H100 80GB HBM3", mode="hami-core",
                         mem_total=81559, cores_total=100, slots_total=10, mem_used=used if i == 0 else 0)
                 for i in range(8))
    return NodeView(name, gpus)


class Cluster:
    def __init__(self, n: int, params: GossipParams, key: bytes) -> None:
        self.n, self.params, self.key = n, params, key
        self.nodes: list[GossipService] = []
        self.scopes: list[trio.CancelScope] = []
        self.used: dict[str, int] = {}

    async def start(self, nursery: trio.Nursery) -> None:
        seeds: tuple[str, ...] = ()
        for i in range(self.n):
            name = f"m{i:03d}"
            self.used[name] = 0
            svc = GossipService(name, "127.0.0.1:0", params=self.params, seeds=seeds,
                                keyring=Keyring([self.key]), view_in_thread=False,
                                read_view=lambda name=name: _view(name, self.used[name]))
            scope = trio.CancelScope()
            self.scopes.append(scope)
            addr = await nursery.start(self._run, svc, scope)
            if i < 3:
                seeds = seeds + (addr,)
            self.nodes.append(svc)

    @staticmethod
    async def _run(svc: GossipService, scope: trio.CancelScope, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with scope:
            await svc.run(task_status=task_status)

    def live(self) -> list[GossipService]:
        return [s for s, sc in zip(self.nodes, self.scopes) if not sc.cancel_called]

    def converged(self) -> bool:
        live = self.live()
        names = {s.name for s in live}
        for s in live:
            m = s.membership
            alive = {k for k, v in m.members.items() if v.state == 0}
            if alive != names or set(m.live_docs()) != names:
                return False
        return True


async def _wait(pred, timeout: float, every: float = 0.01) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        await trio.sleep(every)
    return None


async def converge_trial(c: Cluster, idx: int) -> float | None:
    origin = c.live()[idx]
    c.used[origin.name] += 1024
    await origin.publish()
    version = origin.membership.docs[origin.name]["version"]
    others = [s for s in c.live() if s is not origin]
    need = int(0.99 * len(others) + 0.999)

    def seen() -> bool:
        return sum(1 for s in others if (s.membership.docs.get(origin.name) or {}).get("version", 0) >= version) >= need
    return await _wait(seen, 30)


async def direct_baseline(c: Cluster, idx: int) -> float | None:
    """The origin sends its new document to every member directly, once."""
    origin = c.live()[idx]
    c.used[origin.name] += 1024
    doc = dict(origin.membership.docs[origin.name])
    doc["version"] += 1
    origin._doc = doc
    origin.membership.docs[origin.name] = doc
    others = [s for s in c.live() if s is not origin]
    t0 = time.monotonic()
    for s in others:
        origin.transport.send(s.addr, {"t": "caps", "docs": [doc]})
    need = int(0.99 * len(others) + 0.999)
    got = await _wait(lambda: sum(1 for s in others if (s.membership.docs.get(origin.name) or {}).get(
        "version", 0) >= doc["version"]) >= need, 30, every=0.002)
    return None if got is None else time.monotonic() - t0


def _bytes(c: Cluster) -> int:
    return sum(s.stats.bytes_sent for s in c.live())


async def bandwidth(c: Cluster, seconds: float, churn: bool) -> float:
    b0, t0 = _bytes(c), time.monotonic()
    end = t0 + seconds
    i = 0
    while time.monotonic() < end:
        if churn:
            s = c.live()[i % len(c.live())]
            c.used[s.name] += 1
            await s.publish()
            i += 1
        await trio.sleep(1.0 if churn else seconds)
    return (_bytes(c) - b0) / (time.monotonic() - t0) / len(c.live())


async def detect_trial(c: Cluster, idx: int) -> tuple[float | None, float | None]:
    victim = c.nodes[idx]
    victim.leave_on_exit = False
    t0 = time.monotonic()
    c.scopes[idx].cancel()
    others = c.live()
    need = int(0.99 * len(others) + 0.999)

    def first() -> bool:
        return any(s.membership.members.get(victim.name) is not None and
                   s.membership.members[victim.name].state == 2 for s in others)

    def most() -> bool:
        return sum(1 for s in others if s.membership.members[victim.name].state == 2) >= need
    t_first = await _wait(first, 120, every=0.02)
    t_most = await _wait(most, 120, every=0.02)
    return t_first, (None if t_most is None else t_first + t_most if t_first is not None else None)


def _proc_usage(pid: int) -> tuple[float, float]:
    """(cpu seconds, rss MB) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    cpu = (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    rss = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
    return cpu, rss


async def daemon_usage(tmp: Path, key_b64: str, join: str | None, window: float, settle: float) -> dict:
    name = "daemon-gossip" if join else "daemon-plain"
    state = tmp / name
    kf = tmp / "key"
    kf.write_text(key_b64 + "\n")
    cmd = [sys.executable, "-m", "hamid.cli.main", "run", "--state-dir", str(state), "--metrics-port", "0",
           "--node-name", name, "--simulate", "H100:8", "--log-format", "json", "--log-level", "warning"]
    if join:
        port = _free_port()
        cmd += ["--gossip-listen", f"127.0.0.1:{port}", "--join", join, "--gossip-key-file", str(kf)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await trio.sleep(settle)
        c0, _ = _proc_usage(p.pid)
        t0 = time.monotonic()
        await trio.sleep(window)
        c1, rss = _proc_usage(p.pid)
        return {"cpu_pct": 100 * (c1 - c0) / (time.monotonic() - t0), "rss_mb": rss}
    finally:
        p.terminate()
        await trio.to_thread.run_sync(p.wait)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else float("nan")


async def bench_size(n: int, trials: int, quick: bool, params: GossipParams, key: bytes, tmp: Path,
                     with_daemon: bool) -> dict:
    out: dict = {"n": n}
    async with trio.open_nursery() as nursery:
        c = Cluster(n - (1 if with_daemon else 0), params, key)
        t0 = time.monotonic()
        await c.start(nursery)
        joined = await _wait(c.converged, 120, every=0.1)
        out["join_all_s"] = None if joined is None else time.monotonic() - t0
        await trio.sleep(2)
        out["converge_s"] = _med([await converge_trial(c, i * 7 % c.n) for i in range(trials)])
        await trio.sleep(1)
        out["direct_s"] = _med([await direct_baseline(c, i * 5 % c.n) for i in range(trials)])
        await trio.sleep(1)
        out["idle_bytes_per_s"] = await bandwidth(c, 5 if quick else 10, churn=False)
        out["churn_bytes_per_s"] = await bandwidth(c, 5 if quick else 10, churn=True)
        if with_daemon:
            seed = c.nodes[0].addr
            out["daemon"] = await daemon_usage(tmp, base64.b64encode(key).decode(), seed,
                                               window=10 if quick else 20, settle=8)
            out["daemon_plain"] = await daemon_usage(tmp, base64.b64encode(key).decode(), None,
                                                     window=10 if quick else 20, settle=4)
        dets = []
        for i in range(trials):
            dets.append(await detect_trial(c, c.n - 1 - i))
        out["detect_first_s"] = _med([d[0] for d in dets])
        out["detect_99_s"] = _med([d[1] for d in dets])
        crashed = {c.nodes[c.n - 1 - i].name for i in range(trials)}
        out["false_deaths"] = len({name for s in c.live() for _, name, st in s.membership.changes
                                   if st == "dead" and name not in crashed})
        nursery.cancel_scope.cancel()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10,50,100")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    logs.configure("console", "error")
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    params = GossipParams()
    key = os.urandom(32)
    sizes = [int(x) for x in args.sizes.split(",")]
    print(f"gossip bench: defaults {params.as_dict()}")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            r = trio.run(bench_size, n, args.trials, args.quick, params, key, Path(tmp), n == max(sizes))
            results.append(r)
            print(f"\nn={n}: all joined in {r['join_all_s']:.2f} s")
            print(f"  99% convergence  {r['converge_s']:.3f} s  (direct send to all, same run: {r['direct_s']:.3f} s;"
                  f" ratio {r['converge_s'] / r['direct_s']:.1f}x)  target {TARGETS['converge_s']} s:"
                  f" {r['converge_s'] / TARGETS['converge_s']:.2f} of target")
            print(f"  bytes/s/member   idle {r['idle_bytes_per_s']:.0f}  with 1 change/s {r['churn_bytes_per_s']:.0f}"
                  f"  target {TARGETS['bytes_per_s']}: {r['churn_bytes_per_s'] / TARGETS['bytes_per_s']:.3f} of target")
            print(f"  detection        first {r['detect_first_s']:.2f} s, 99% {r['detect_99_s']:.2f} s (median of "
                  f"{args.trials})  target {TARGETS['detect_s']} s: {r['detect_first_s'] / TARGETS['detect_s']:.2f} of target")
            print(f"  healthy members ever declared dead: {r['false_deaths']}")
            if "daemon" in r:
                d, b = r["daemon"], r["daemon_plain"]
                print(f"  hamid run at {n} members: RSS {d['rss_mb']:.1f} MB (without gossip {b['rss_mb']:.1f} MB;"
                      f" {d['rss_mb'] / TARGETS['rss_mb']:.2f} of target), CPU {d['cpu_pct']:.2f}% of a core "
                      f"(without gossip {b['cpu_pct']:.2f}%; {d['cpu_pct'] / TARGETS['cpu_pct']:.2f} of target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
