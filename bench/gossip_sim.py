#!/usr/bin/env python3
"""Gossip at 1,000 and 5,000 members, simulated: the real membership code on trio's virtual clock.

Every member is a real :class:`hamid.gossip.membership.Membership` (probes,
indirect probes, suspicion with Lifeguard's confirmations, piggybacked
updates, push/pull, capacity documents pulled by version) with the shipped
``GossipParams()``; they talk over :class:`hamid.gossip.memnet.MemoryNetwork`,
an in-memory stand-in for the websocket transport that encodes and decodes
every frame with the real codec (real byte counts, the real 256 KB frame
limit), with 1 ms latency plus up to 1 ms jitter and independent loss per frame. Trio's
``MockClock(autojump_threshold=0)`` makes the time virtual: CPU cost is not
simulated (no member is ever late), which is what the real-socket bench
(``bench/gossip.py``, up to 100 members) measures instead.

The members start as a group that has converged (each knows every other alive
with its 8-GPU capacity document), each starting its loops at a random
moment of the first second. After a warm-up, per size and loss rate:

- bytes/s per member, idle (only probes and push/pull);
- a capacity document changes somewhere, one change at a time (the next one
  second later, or once every member holds it, up to 20 s): time until 50 %,
  99 % and every live member hold the new version (median over the changes),
  the share holding it over time (a curve), the bytes/s per member meanwhile
  and the bytes per member each change costs above the idle traffic;
- a member crashes (its frames dropped both ways, no leave notice): time until
  the first member declares it dead, and until 99 % and all live members have;
- a new member joins through one seed: time until 99 % of the group know it
  alive, and until it holds every member's document;
- false deaths: live members that any member declared dead during the run.

Baseline in the same run: the suspicion timeout's floor and ceiling for that
group size (``GossipParams.suspicion_bounds``), against which detection time
is read, and the ideal epidemic's rounds (log base gossip_nodes+1 of n, times
the gossip interval) against which convergence is read.

Usage: .venv/bin/python bench/gossip_sim.py [--sizes 1000,5000] [--loss 0,0.01,0.1] [--changes 10]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import random
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trio  # noqa: E402
import trio.testing  # noqa: E402

from hamid.cluster.capacity import doc_from_view  # noqa: E402
from hamid.gossip.codec import ALIVE, DEAD, LEFT  # noqa: E402
from hamid.gossip.membership import Member, Membership  # noqa: E402
from hamid.gossip.memnet import MemoryNetwork  # noqa: E402
from hamid.gossip.params import GossipParams  # noqa: E402
from hamid.gossip.stats import Stats  # noqa: E402
from hamid.placement.view import GpuView, NodeView  # noqa: E402

WARMUP_S = 40.0  # the first alive broadcasts retire and every member has probed dozens of times
IDLE_S = 30.0
DETECT_MAX_S = 180.0
JOIN_MAX_S = 120.0
CURVE_AT = (0.1, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)  # seconds after a change: share holding it


def _doc(name: str, version: int, used: int = 0) -> dict:
    gpus = tuple(GpuView(uuid=f"GPU-{name}-{i}", index=i, name="NVIDIA H100 80GB HBM3", mode="hami-core",
                         mem_total=81559, cores_total=100, shares_total=10, mem_used=used if i == 0 else 0)
                 for i in range(8))
    doc = doc_from_view(NodeView(name, gpus), version)
    doc["peer"] = f"{name}.example:7947"
    return doc


def _name(i: int) -> str:
    return f"ip-10-{i // 65536}-{i // 256 % 256}-{i % 256}.eu-west-1.compute.internal"


def pct_time(times: list[float], n: int, q: float) -> float | None:
    """When the ceil(q x n)-th member got there, or None if that many never did."""
    k = max(1, math.ceil(q * n))
    return sorted(times)[k - 1] if len(times) >= k else None


class Sim:
    def __init__(self, n: int, loss: float, seed: int) -> None:
        self.n = n
        self.rng = random.Random(seed)
        random.seed(seed)  # the membership code's own choices (probe order, gossip targets)
        self.params = GossipParams()
        self.net = MemoryNetwork(loss=loss, latency=0.001, jitter=0.001, rng=self.rng,
                                 max_frame_bytes=self.params.max_frame_bytes)
        # cloud-style node names (as EC2 gives them): the member table's size depends on them
        self.names = [_name(i) for i in range(n)]
        self.addrs = {name: f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:7946" for i, name in enumerate(self.names)}
        self.members: dict[str, Membership] = {}
        self.scopes: dict[str, trio.CancelScope] = {}
        self.crashed: set[str] = set()
        self.deaths: list[tuple[float, str, str]] = []  # (time, observer, victim)
        self.tracked: tuple[str, int] | None = None
        self.got: dict[str, float] = {}

    def _new(self, name: str, seeds: tuple[str, ...] = ()) -> Membership:
        st = Stats()
        ep = self.net.endpoint(name, self.addrs[name], st)
        m = Membership(name, self.addrs[name], self.params, st, ep.send, seeds=seeds, forget=ep.forget)
        ep.on_message = m.on_message
        m.on_change = lambda victim, state, obs=name: self._changed(obs, victim, state)
        inner = m._apply_doc

        def apply_doc(who, doc, m=m, inner=inner):
            inner(who, doc)
            t = self.tracked
            if t is not None and who == t[0] and m.name not in self.got:
                have = m.docs.get(who)
                if have is not None and have["version"] >= t[1]:
                    self.got[m.name] = trio.current_time()
        m._apply_doc = apply_doc
        self.members[name] = m
        return m

    def _changed(self, observer: str, victim: str, state: str) -> None:
        if state in ("dead",):
            self.deaths.append((trio.current_time(), observer, victim))

    def build(self) -> None:
        docs = {name: _doc(name, 1) for name in self.names}
        inc = 1_700_000_000
        for name in self.names:
            self._new(name)
        for name, m in self.members.items():
            m.inc = m.me.inc = inc
            for other in self.names:
                if other != name:
                    m.members[other] = Member(other, self.addrs[other], inc, ALIVE, 0.0)
            m.docs = dict(docs)

    async def _run_member(self, m: Membership, delay: float) -> None:
        await trio.sleep(delay)
        with self.scopes[m.name]:
            await m.run()
            await trio.sleep_forever()

    def start(self, nursery: trio.Nursery, m: Membership, delay: float) -> None:
        self.scopes[m.name] = trio.CancelScope()
        nursery.start_soon(self._run_member, m, delay)

    def live(self) -> list[Membership]:
        return [m for name, m in self.members.items() if name not in self.crashed]

    def bytes_sent(self) -> int:
        return sum(m.stats.bytes_sent for m in self.members.values())

    async def window(self, seconds: float) -> tuple[float, dict[str, float]]:
        """Bytes per member per second over ``seconds`` of protocol time, in all and by frame type."""
        b0, t0, by0 = self.bytes_sent(), trio.current_time(), dict(self.net.sent_by_type)
        await trio.sleep(seconds)
        per = len(self.live()) * (trio.current_time() - t0)
        by = {t: round((v - by0.get(t, 0)) / per) for t, v in self.net.sent_by_type.items() if v > by0.get(t, 0)}
        return (self.bytes_sent() - b0) / per, by

    async def change(self, name: str) -> dict:
        m = self.members[name]
        old = m.docs[name]
        doc = _doc(name, old["version"] + 1, used=old["gpus"][0]["use"][0] + 1024)
        self.got = {name: trio.current_time()}
        self.tracked = (name, doc["version"])
        t0 = trio.current_time()
        m.set_local_doc(doc)
        return {"t0": t0}

    def spread(self, t0: float) -> dict:
        live = len(self.live())
        times = [t - t0 for t in self.got.values()]
        out = {q: pct_time(times, live, q) for q in (0.5, 0.99, 1.0)}
        out["curve"] = [sum(1 for t in times if t <= x) / live for x in CURVE_AT]
        return out

    def crash(self, name: str) -> None:
        self.crashed.add(name)
        self.net.down.add(self.addrs[name])
        self.scopes[name].cancel()


def _parts(m: Membership) -> list[list]:
    """The parts of ``m``'s push/pull, as it sends them."""
    out: list[list] = []
    orig = m._send_raw
    m._send_raw = lambda addr, msg: out.append(msg["m"])
    try:
        m._send_state("x", 1, False, reply=False)
    finally:
        m._send_raw = orig
    return out


def _progress(n: int, loss: float, phase: str, t0: float) -> None:
    print(f"  [{n} members, loss {loss}: {phase} done at protocol {trio.current_time():.0f} s, "
          f"real {time.perf_counter() - t0:.0f} s]", file=sys.stderr, flush=True)


async def scenario(n: int, loss: float, seed: int, changes: int) -> dict:
    sim = Sim(n, loss, seed)
    t_build = time.perf_counter()
    sim.build()
    gc.freeze()  # the simulation's own long-lived tables: keep the collector's pauses out of the run time
    build_s = time.perf_counter() - t_build
    res: dict = {"n": n, "loss": loss}
    lo, hi = sim.params.suspicion_bounds(n)
    res["suspicion_bounds_s"] = [round(lo, 1), round(hi, 1)]
    res["epidemic_floor_s"] = round(math.log(n, sim.params.gossip_nodes + 1) * sim.params.gossip_interval, 2)
    t_real = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sim.net.run)
        for m in list(sim.members.values()):
            sim.start(nursery, m, sim.rng.uniform(0, 1.0))
        await trio.sleep(WARMUP_S)
        _progress(n, loss, "warm", t_real)
        idle, by_type = await sim.window(IDLE_S)
        res["idle_bytes_per_member_s"] = round(idle)
        res["idle_bytes_by_type"] = by_type
        # push/pull in steady state: each member starts one per scaled interval and answers one as often
        # (the idle window may hold the first wave: every member's first push/pull comes 15-45 s after
        # its start, and here all started together); one exchange is the member table both ways
        pp = sum(len(sim.net.codec.encode({"t": "pp", "seq": 1, "join": False, "reply": False, "m": part,
                                            "v": 1, "f": "x", "a": "x"}))
                 for part in _parts(sim.members[sim.names[0]]))
        res["push_pull_bytes"] = pp
        res["push_pull_interval_s"] = sim.params.push_pull_scaled(n)
        res["steady_idle_bytes_per_member_s"] = round(
            sum(v for t, v in by_type.items() if t != "pp") + 2 * pp / sim.params.push_pull_scaled(n))

        # capacity documents changing once a second somewhere
        spreads = []
        b0, t0w = sim.bytes_sent(), trio.current_time()
        for _ in range(changes):
            origin = sim.rng.choice([m.name for m in sim.live()])
            t0 = (await sim.change(origin))["t0"]
            await trio.sleep(1.0)
            # a change not everywhere within its second is followed up to 20 s more
            waited = 0.0
            while len(sim.got) < len(sim.live()) and waited < 20.0:
                await trio.sleep(0.5)
                waited += 0.5
            spreads.append(sim.spread(t0))
        sim.tracked = None
        res["change_bytes_per_member_s"] = round((sim.bytes_sent() - b0) / len(sim.live()) /
                                                 (trio.current_time() - t0w))
        for q, key in ((0.5, "converge_50_s"), (0.99, "converge_99_s"), (1.0, "converge_all_s")):
            got = [s[q] for s in spreads if s[q] is not None]
            res[key] = round(statistics.median(got), 2) if got else None
            res[key + "_max"] = round(max(got), 2) if got else None
        res["changes_not_everywhere"] = sum(1 for s in spreads if s[1.0] is None)
        res["curve_at_s"] = list(CURVE_AT)
        res["curve_share"] = [round(statistics.median(s["curve"][i] for s in spreads), 4) for i in range(len(CURVE_AT))]

        _progress(n, loss, "changes", t_real)
        # a crash
        victim = sim.rng.choice([m.name for m in sim.live()])
        t0 = trio.current_time()
        sim.crash(victim)
        first = None
        while trio.current_time() - t0 < DETECT_MAX_S:
            await trio.sleep(0.25)
            seen = [m for m in sim.live() if m.members.get(victim) is None
                    or m.members[victim].state in (DEAD, LEFT)]
            if first is None and seen:
                first = trio.current_time() - t0
            if 99 not in res.get("_marks", ()) and len(seen) >= math.ceil(0.99 * len(sim.live())):
                res["detect_99_s"] = round(trio.current_time() - t0, 2)
                res.setdefault("_marks", set()).add(99)
            if len(seen) == len(sim.live()):
                res["detect_all_s"] = round(trio.current_time() - t0, 2)
                break
        res["detect_first_s"] = round(first, 2) if first is not None else None

        _progress(n, loss, "crash", t_real)
        # a join through one seed
        newcomer = _name(n + 1000)
        sim.addrs[newcomer] = f"10.255.255.{n % 250}:7946"
        seed_name = sim.rng.choice([m.name for m in sim.live()])
        m_new = sim._new(newcomer, seeds=(sim.addrs[seed_name],))
        m_new.set_local_doc(_doc(newcomer, 1))
        t0 = trio.current_time()
        sim.start(nursery, m_new, 0.0)
        knows99 = full = None
        while trio.current_time() - t0 < JOIN_MAX_S and (knows99 is None or full is None):
            await trio.sleep(0.25)
            if knows99 is None:
                k = sum(1 for m in sim.live() if newcomer in m.members and m.members[newcomer].state == ALIVE)
                if k >= math.ceil(0.99 * len(sim.live())):
                    knows99 = trio.current_time() - t0
            if full is None and len(m_new.live_docs()) >= len(sim.live()):
                full = trio.current_time() - t0
        res["join_known_99_s"] = round(knows99, 2) if knows99 is not None else None
        res["join_has_all_docs_s"] = round(full, 2) if full is not None else None
        res["protocol_s"] = round(trio.current_time())
        nursery.cancel_scope.cancel()
    false = {v for _, _, v in sim.deaths if v not in sim.crashed}
    res["false_deaths"] = len(false)
    res["false_death_declarations"] = sum(1 for _, _, v in sim.deaths if v not in sim.crashed)
    res["frames_rejected"] = dict(sim.net.rejected)
    res["real_s"] = round(time.perf_counter() - t_real, 1)
    res["build_s"] = round(build_s, 1)
    res["max_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    res.pop("_marks", None)
    return res


def _n(x) -> str:
    return "-" if x is None else f"{x:,}"


def markdown(rows: list[dict]) -> str:
    """The results table and the spread curve, as docs/gossip-scale.md shows them."""
    def f(x, unit=""):
        return "-" if x is None else f"{x:g}{unit}"
    out = ["| members | loss | converge 50 / 99 / all % (s) | not everywhere | detect first / 99 % / all (s) | "
           "suspicion bounds (s) | join: known by 99 % / has all docs (s) | bytes/s per member: idle window / "
           "steady idle / while changing | "
           "false deaths | seed |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['n']:,} | {r['loss']:.0%} | {f(r['converge_50_s'])} / {f(r['converge_99_s'])} / "
                   f"{f(r['converge_all_s'])} | {r['changes_not_everywhere']} | {f(r['detect_first_s'])} / "
                   f"{f(r.get('detect_99_s'))} / {f(r.get('detect_all_s'))} | {r['suspicion_bounds_s'][0]:g}-"
                   f"{r['suspicion_bounds_s'][1]:g} | {f(r['join_known_99_s'])} / {f(r['join_has_all_docs_s'])} | "
                   f"{r['idle_bytes_per_member_s']:,} / {_n(r.get('steady_idle_bytes_per_member_s'))} / "
                   f"{r['change_bytes_per_member_s']:,} | {r['false_deaths']} | "
                   f"{r.get('seed', '-')} |")
    at = rows[0]["curve_at_s"]
    out += ["", "| members | loss | seed | " + " | ".join(f"{t:g} s" for t in at) + " |",
            "|---|---|---|" + "---|" * len(at)]
    for r in rows:
        out.append(f"| {r['n']:,} | {r['loss']:.0%} | {r.get('seed', '-')} | "
                   + " | ".join(f"{x:.1%}" for x in r["curve_share"]) + " |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,5000")
    ap.add_argument("--loss", default="0,0.01,0.1")
    ap.add_argument("--changes", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--warmup", type=float, default=40.0, help="protocol seconds before measuring")
    ap.add_argument("--idle", type=float, default=30.0, help="protocol seconds of the idle window")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--markdown", nargs="+", metavar="JSON", help="print the tables of earlier --json files and exit")
    args = ap.parse_args()
    if args.markdown:
        print(markdown([r for p in args.markdown for r in json.loads(Path(p).read_text())]))
        return 0
    global WARMUP_S, IDLE_S
    WARMUP_S, IDLE_S = args.warmup, args.idle
    from hamid import logs

    logs.configure("console", "error")
    rows = []
    for n in (int(x) for x in args.sizes.split(",")):
        for loss in (float(x) for x in args.loss.split(",")):
            r = trio.run(scenario, n, loss, args.seed, args.changes, clock=trio.testing.MockClock(autojump_threshold=0))
            r["seed"] = args.seed
            rows.append(r)
            print(json.dumps(r), flush=True)
            gc.unfreeze()
            gc.collect()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
