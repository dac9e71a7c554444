"""Commits to one node gathered into one peer request: what the gate leader sends a node.

A gate pass decides a burst of pods at once and binpack sends them to one node after
another, so the commits of a pass arrive for a node together. :class:`NodeBatches` keeps,
per node, the commits waiting to be sent; the first commit for a node that finds none in
flight sends, after letting the pass's other commits for that node join it, everything
waiting (up to the client's ``max_batch``) as one ``commit_many`` request, which the
node applies in one ledger transaction. Commits that arrive while a batch is in flight wait
and go in the next one, sent by the first of them, so a node has at most one batch in flight
and its ledger never sees more than one writer from this leader.

Each commit still gets its own verdict (the reservation, or its own refusal raised to its own
caller). A commit whose caller is cancelled leaves the queue; if it was the one sending, the
others of its batch get :class:`NotSent` (the leader is stopping: every caller is cancelled
then), and the next waiting commit sends the next batch. A node that does not know the verb (an older
hamid in a rolling upgrade) is sent the commits one per request from then on, and the leader says so once in its log.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import trio

from ..errors import HamidError
from ..logs import get_logger

log = get_logger("control")

# How long a node that did not know the batch verb is sent single commits before it is asked again:
# 300 s, a rolling upgrade's pace (the node may be upgraded meanwhile), while a node still old costs
# only one refused request (nothing applied) per 5 minutes.
RECHECK_S = 300.0


@dataclass
class _Pending:
    item: dict  # {"owner", "decision", "request", "details"}
    done: trio.Event = field(default_factory=trio.Event)  # set with a verdict, or (unanswered) for its turn
    result: Any = None  # the reservation dict, or the error to raise
    answered: bool = False


class NotSent(HamidError):
    """The commit was never answered: the leader stopped while its batch was in flight (it may
    have been applied; the node's ledger is idempotent per owner, so retrying is safe)."""


@dataclass
class _Node:
    queue: list[_Pending] = field(default_factory=list)
    sending: bool = False


class NodeBatches:
    def __init__(self, peer: Any, *, in_flight: trio.CapacityLimiter | None = None, singles: int = 8) -> None:
        """``peer``: the peer API's client as the daemon hands it in (this face does not import that
        one): ``commit`` and ``commit_many`` as :class:`hamid.peer.PeerClient` has them, ``max_batch``
        (the most commits one request may carry), errors that are :class:`HamidError` with a
        ``kind`` (``unknown-method``: the node is too old for the verb and applied nothing;
        ``too-large``: over the node's body limit). ``in_flight``: requests in flight at once to all
        nodes together (the caller's bound). ``singles``: commits in flight at once to one node that
        lacks the batch verb (8, as the leader's old per-node bound: its ledger serialises them
        itself)."""
        self.peer = peer
        self.in_flight = in_flight
        self.singles = singles
        self.max_items = max(1, int(getattr(peer, "max_batch", 1)))
        self._nodes: dict[str, _Node] = {}
        self._old: dict[str, float] = {}  # node -> when it answered "unknown method" (singles until RECHECK_S)
        self._said: set[str] = set()  # nodes the log has named as old (once each)
        self.requests = 0  # peer requests sent (tests, bench)

    async def commit(self, address: str, owner: Any, decision: Any, *, request: dict | None = None,
                     details: dict | None = None) -> dict:
        """As :meth:`hamid.peer.PeerClient.commit` (the same signature, the same answer and errors),
        sent together with the other commits waiting for the same node."""
        node = decision.node
        st = self._nodes.get(node)
        if st is None:
            st = self._nodes[node] = _Node()
        me = _Pending({"owner": owner, "decision": decision, "request": request, "details": details})
        st.queue.append(me)
        try:
            if not st.sending:
                st.sending = True
                await self._send_turn(address, node, st, gather=True)
            while not me.answered:
                await me.done.wait()
                if not me.answered:  # woken as the head of the queue: send the next batch (this one in it)
                    me.done = trio.Event()
                    await self._send_turn(address, node, st)
        except BaseException:  # cancelled (the leader stops): never leave the others without a sender
            if not me.answered:
                if me in st.queue:
                    st.queue.remove(me)
                if me.done.is_set():  # the turn was handed to this commit: hand it on
                    self._hand_on(st)
            raise
        if isinstance(me.result, BaseException):
            raise me.result
        return me.result

    async def _send_turn(self, address: str, node: str, st: _Node, *, gather: bool = False) -> None:
        """Send the head of ``st``'s queue as one batch, then hand the turn to the next waiting commit."""
        try:
            if gather:
                await trio.lowlevel.checkpoint()  # the other commits of this pass for the node join the batch
            batch = st.queue[:self.max_items]
            del st.queue[:self.max_items]
            await self._send(address, node, batch)
        finally:
            self._hand_on(st)

    @staticmethod
    def _hand_on(st: _Node) -> None:
        if st.queue:
            st.queue[0].done.set()  # not answered: its turn
        else:
            st.sending = False

    async def _send(self, address: str, node: str, batch: list[_Pending]) -> None:
        """Send ``batch`` and give each its verdict (whatever happens: a waiter never waits forever)."""
        try:
            if self.in_flight is None:
                await self._send_now(address, node, batch)
            else:
                async with self.in_flight:
                    await self._send_now(address, node, batch)
        finally:
            for p in batch:
                if not p.answered:
                    _answer(p, NotSent(f"the commit to {node} at {address} was not answered (the leader "
                                       "stopped); retrying is safe"))

    async def _send_now(self, address: str, node: str, batch: list[_Pending]) -> None:
        old = self._old.get(node)
        if old is not None and time.monotonic() - old >= RECHECK_S:
            del self._old[node]
            old = None
        if len(batch) > 1 and old is None:
            self.requests += 1
            try:
                got = await self.peer.commit_many(address, node, [p.item for p in batch])
            except HamidError as e:
                kind = getattr(e, "kind", None)
                if kind == "unknown-method":
                    self._old[node] = time.monotonic()
                    if node not in self._said:
                        self._said.add(node)
                        log.warning("node does not know the batch commit (an older hamid): its placements are "
                                    "committed one per request", node=node, address=address)
                elif kind == "too-large":
                    log.warning("a batch of commits was over the node's body limit (peerMaxBodyBytes); sending "
                                "them one per request", node=node, commits=len(batch))
                else:  # the whole request failed: each commit's caller sees why
                    for p in batch:
                        _answer(p, e)
                    return
            else:
                for p, r in zip(batch, got):
                    _answer(p, r)
                return
        limiter = trio.CapacityLimiter(self.singles)

        async def one(p: _Pending) -> None:
            async with limiter:
                self.requests += 1
                try:
                    _answer(p, await self.peer.commit(address, p.item["owner"], p.item["decision"],
                                                      request=p.item["request"], details=p.item["details"]))
                except HamidError as e:
                    _answer(p, e)

        async with trio.open_nursery() as nursery:
            for p in batch:
                nursery.start_soon(one, p)


def _answer(p: _Pending, result: Any) -> None:
    p.result, p.answered = result, True
    p.done.set()
