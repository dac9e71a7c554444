"""Membership loops in isolation: a fake send, trio's mock clock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from hamid.gossip.codec import SUSPECT
from hamid.gossip.membership import NO_ACCUSER, Member, Membership
from hamid.gossip.params import GossipParams
from hamid.gossip.stats import Stats


class _Steps(trio.abc.Instrument):
    def __init__(self, name: str) -> None:
        self.name, self.steps = name, 0

    def before_task_step(self, task) -> None:
        if self.name in task.name:
            self.steps += 1


async def test_idle_gossip_loop_sleeps_and_a_queued_update_goes_out_on_the_next_tick(autojump_clock):
    p = GossipParams()
    sent: list[tuple[float, str, dict]] = []
    m = Membership("a", "a:1", p, Stats(), lambda addr, msg: sent.append((trio.current_time(), addr, msg)))
    m.members["b"] = Member("b", "b:1", 1)
    steps = _Steps("_gossip_loop")
    trio.lowlevel.add_instrument(steps)
    try:
        async with trio.open_nursery() as n:
            n.start_soon(m._gossip_loop)
            await trio.sleep(10)  # nothing queued: no frame, and the loop does not even wake
            assert sent == [] and steps.steps <= 2
            t0 = trio.current_time()
            m.broadcasts.add(("b", "m"), {"t": "alive", "n": "b", "a": "b:1", "i": 2, "cv": 0})
            await trio.sleep(p.gossip_interval * 1.01)
            # out within one tick (a retransmit may follow a tick later: the update is sent a bounded number of times)
            assert sent and {(addr, msg["t"]) for _, addr, msg in sent} == {("b:1", "gossip")}
            assert sent[0][0] - t0 <= p.gossip_interval
            n.cancel_scope.cancel()
    finally:
        trio.lowlevel.remove_instrument(steps)



def test_a_capacity_document_keeps_the_share_count_key_earlier_nodes_read_and_reads_the_new_one():
    """A GPU's share count (deviceSplitCount) goes out under ``slots_total``, the one key nodes of
    earlier versions read (a document without it is malformed to them), and a document from a later
    node that writes ``shares_total`` instead is read the same; one with neither is refused."""
    from hamid.cluster.capacity import doc_from_view, doc_problem, view_from_doc
    from hamid.placement.view import GpuView, NodeView

    view = NodeView("a", (GpuView(uuid="G0", index=0, name="T4", mode="hami-core", mem_total=15360,
                                  cores_total=100, shares_total=4, shares_used=3, mem_used=1024),))
    doc = doc_from_view(view, 1)
    g = doc["gpus"][0]
    assert g["slots_total"] == 4 and "shares_total" not in g and g["use"][2] == 3
    assert view_from_doc(doc).gpus == view.gpus
    later = dict(doc, gpus=[{**{k: v for k, v in g.items() if k != "slots_total"}, "shares_total": 4}])
    assert doc_problem(later) is None and view_from_doc(later).gpus == view.gpus
    neither = dict(doc, gpus=[{k: v for k, v in g.items() if k != "slots_total"}])
    assert doc_problem(neither) == "malformed GPU entry (KeyError)"

async def test_capacity_is_read_only_when_the_ledger_stamp_moved():
    from hamid.gossip.service import GossipService
    from hamid.placement.view import GpuView, NodeView

    reads, stamp, used = [], [7], [0]

    def view():
        reads.append(1)
        return NodeView("a", (GpuView(uuid="G0", index=0, name="T4", mode="hami-core", mem_total=15360,
                                      cores_total=100, shares_total=10, mem_used=used[0]),))

    svc = GossipService("a", "127.0.0.1:0", params=GossipParams(), read_view=view, view_in_thread=False,
                        read_stamp=lambda: stamp[0])
    await svc.publish()
    v1 = svc.membership.docs["a"]["version"]
    for _ in range(5):
        await svc.publish()
    assert len(reads) == 1  # stamp unchanged: no read
    used[0], stamp[0] = 4096, 8
    await svc.publish()
    assert len(reads) == 2 and svc.membership.docs["a"]["version"] > v1
    assert svc.membership.docs["a"]["gpus"][0]["use"][0] == 4096
    stamp[0] = None  # the stamp could not be read: read the ledger to be safe
    await svc.publish()
    await svc.publish()
    assert len(reads) == 4


async def test_documents_are_pulled_from_whoever_announced_them_and_announced_only_once_held():
    sent: list[tuple[str, dict]] = []
    m = Membership("a", "a:1", GossipParams(), Stats(), lambda addr, msg: sent.append((addr, msg)))
    m.members["b"] = Member("b", "b:1", 1)
    notice = {"t": "cap", "n": "b", "v": 5}
    m.on_message({"t": "gossip", "f": "c", "a": "c:1", "g": [notice]})
    assert sent == [("c:1", {"t": "capreq", "names": ["b"]})]  # asked the sender, who holds it
    assert len(m.broadcasts) == 0  # not spread before we hold it
    m.on_message({"t": "gossip", "f": "d", "a": "d:1", "g": [notice]})
    assert len(sent) == 1  # the same version is not asked for twice at once
    doc = {"node": "b", "version": 5, "policy": "spread", "gpus": [], "profiles": {}}
    m.on_message({"t": "caps", "f": "c", "a": "c:1", "docs": [doc]})
    assert m.docs["b"] == doc
    assert m.broadcasts.take(10, 1 << 16) == [notice]  # now we announce it: we can serve it
    m.on_message({"t": "capreq", "f": "e", "a": "e:1", "names": ["b"]})
    assert sent[-1] == ("e:1", {"t": "caps", "docs": [doc]})


def _pp(sender: str, entries: list[list]) -> dict:
    """A push/pull reply from ``sender`` holding ``entries`` (name, addr, inc, state, doc version)."""
    return {"t": "pp", "seq": 1, "join": False, "reply": True, "m": entries, "f": sender, "a": f"{sender}:1"}


async def test_a_push_pull_holding_a_suspicion_is_not_an_independent_confirmation():
    # Lifeguard shrinks the suspicion timeout per independent accuser. Peers
    # that only heard the same rumour and hand it back by push/pull are not
    # accusers: counting them shrank timeouts to the minimum before the
    # suspect's refutation had spread, and killed live members under loss.
    from hamid.gossip.membership import NO_ACCUSER

    p = GossipParams()
    sent: list[tuple[str, dict]] = []
    m = Membership("a", "a:1", p, Stats(), lambda addr, msg: sent.append((addr, msg)))
    for name in "bcdef":
        m.members[name] = Member(name, f"{name}:1", 7)
    lo, hi = p.suspicion_bounds(m.n())
    assert p.confirmations_needed(m.n()) == 2 and hi > lo

    m.on_message({"t": "gossip", "f": "c", "a": "c:1", "g": [{"t": "suspect", "n": "b", "i": 7, "by": "c"}]})
    s = m.members["b"].suspicion
    assert m.members["b"].state == SUSPECT and s.deadline == s.start + hi
    for peer in "def":  # three peers that hold the same suspicion
        m.on_message(_pp(peer, [["b", "b:1", 7, SUSPECT, 0]]))
    assert s.confirmers == set() and s.deadline == s.start + hi
    m.on_message({"t": "gossip", "f": "d", "a": "d:1", "g": [{"t": "suspect", "n": "b", "i": 7, "by": "d"}]})
    assert s.confirmers == {"d"} and s.start + lo < s.deadline < s.start + hi  # a second accuser does count

    # First heard by push/pull: spread without an accuser; the accuser heard
    # later is adopted, not counted; only a further accuser confirms.
    m.on_message(_pp("d", [["c", "c:1", 7, SUSPECT, 0]]))
    s = m.members["c"].suspicion
    queued = m.broadcasts.take(p.retransmit_limit(m.n()), p.piggyback_bytes)
    assert {"t": "suspect", "n": "c", "i": 7, "by": NO_ACCUSER} in queued
    m.on_message({"t": "gossip", "f": "e", "a": "e:1", "g": [{"t": "suspect", "n": "c", "i": 7, "by": "e"}]})
    assert s.by == "e" and s.confirmers == set() and s.deadline == s.start + hi
    m.on_message({"t": "gossip", "f": "f", "a": "f:1", "g": [{"t": "suspect", "n": "c", "i": 7, "by": "f"}]})
    assert s.confirmers == {"f"}
    m.on_message({"t": "gossip", "f": "f", "a": "f:1", "g": [{"t": "suspect", "n": "c", "i": 7, "by": NO_ACCUSER}]})
    assert s.confirmers == {"f"}  # a rumour spread without an accuser confirms nothing


def test_the_no_accuser_mark_is_not_a_node_name():
    with pytest.raises(ValueError, match="reserved"):
        Membership(NO_ACCUSER, "a:1", GossipParams(), Stats(), lambda addr, msg: None)
