"""An in-memory network for many gossip members in one trio run: a stand-in for ``transport``, for simulations.

What it owns: delivering frames between :class:`~hamid.gossip.membership.Membership`
instances of one process, with latency, jitter and loss, and members that
crash (their frames dropped both ways). It is a stand-in for
:class:`~hamid.gossip.transport.Transport` that keeps its contract and says
so: ``send(addr, msg)`` never blocks and may lose the frame (SWIM's datagram
service); every frame is encoded and decoded by the real
:class:`~hamid.gossip.codec.Codec` (so byte counts, the frame size limit and
the frame checks are the real ones) and counted in the member's
:class:`~hamid.gossip.stats.Stats` as the real transport counts it. What it
does not: sockets, connections, encryption (a keyring can be given to the
codec), or per-link queues (no queue overflow: a link never stalls here).

One task (:meth:`MemoryNetwork.run`) delivers every frame at its time, so
trio's virtual clock (``MockClock(autojump_threshold=0)``) can run thousands
of members through minutes of protocol time in seconds or minutes of real
time: ``bench/gossip_sim.py`` measures convergence, failure detection, bytes
and false deaths at 1,000 and 5,000 members this way.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable

import trio

from ..logs import get_logger
from .codec import VERSION, Codec, FrameRejected
from .stats import Stats

log = get_logger("gossip.memnet")


class Endpoint:
    """One member's side of the network: what ``Membership`` is given as ``send`` and ``forget``."""

    def __init__(self, net: "MemoryNetwork", name: str, addr: str, stats: Stats) -> None:
        self.net, self.name, self.addr, self.stats = net, name, addr, stats
        self.on_message: Callable[[dict], None] = lambda _m: None

    def send(self, addr: str, msg: dict) -> None:
        if addr == self.addr or self.addr in self.net.down:
            return
        msg["v"], msg["f"], msg["a"] = VERSION, self.name, self.addr
        frame = self.net.codec.encode(msg)
        self.stats.bytes_sent += len(frame)
        self.stats.frames_sent += 1
        self.net.sent_by_type[msg["t"]] = self.net.sent_by_type.get(msg["t"], 0) + len(frame)
        self.net.post(addr, frame)

    def forget(self, addr: str) -> None:
        """No connection to close here (the real transport closes its link to a dead member)."""


class MemoryNetwork:
    def __init__(self, *, loss: float = 0.0, latency: float = 0.001, jitter: float = 0.0,
                 codec: Codec | None = None, max_frame_bytes: int = 256 * 1024,
                 rng: random.Random | None = None) -> None:
        """``loss``: probability each frame is lost; ``latency`` + up to ``jitter`` seconds: its delay."""
        if not 0 <= loss < 1:
            raise ValueError(f"loss={loss}: expected a probability in [0, 1)")
        if latency < 0 or jitter < 0:
            raise ValueError(f"latency={latency}, jitter={jitter}: expected seconds >= 0")
        self.loss, self.latency, self.jitter = loss, latency, jitter
        self.codec = codec or Codec(None, max_frame_bytes)
        self.rng = rng or random.Random()
        self.endpoints: dict[str, Endpoint] = {}
        self.down: set[str] = set()  # addresses of crashed members
        self.lost = 0
        self.sent_by_type: dict[str, int] = {}  # frame type -> bytes sent by every member (simulations)
        self.rejected: dict[str, int] = {}
        self._heap: list[tuple[float, int, str, bytes]] = []
        self._seq = itertools.count()
        self._wake = trio.Event()
        self._due = float("inf")

    def endpoint(self, name: str, addr: str, stats: Stats) -> Endpoint:
        ep = self.endpoints[addr] = Endpoint(self, name, addr, stats)
        return ep

    def post(self, addr: str, frame: bytes) -> None:
        if self.loss and self.rng.random() < self.loss:
            self.lost += 1
            return
        at = trio.current_time() + self.latency + (self.rng.random() * self.jitter if self.jitter else 0.0)
        heapq.heappush(self._heap, (at, next(self._seq), addr, frame))
        if at < self._due:
            self._wake.set()

    def _deliver(self, addr: str, frame: bytes) -> None:
        ep = self.endpoints.get(addr)
        if ep is None or addr in self.down:
            return
        ep.stats.bytes_received += len(frame)
        ep.stats.frames_received += 1
        try:
            msg = self.codec.decode(frame)
        except FrameRejected as e:
            ep.stats.dropped[e.reason] += 1
            self.rejected[e.reason] = self.rejected.get(e.reason, 0) + 1
            return
        try:
            ep.on_message(msg)
        except Exception:  # as the real reader: a bug handling one frame must not stop delivery
            log.exception("gossip message handler failed", type=msg.get("t"))

    async def run(self) -> None:
        heap = self._heap
        while True:
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                _, _, addr, frame = heapq.heappop(heap)
                self._deliver(addr, frame)
            self._due = heap[0][0] if heap else float("inf")
            self._wake = trio.Event()
            with trio.move_on_at(self._due):
                await self._wake.wait()
