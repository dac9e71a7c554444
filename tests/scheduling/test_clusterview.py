"""The leader's cluster view and the extender's filter stay right while doing only the work that changed.

A real gossip ``Membership`` (no sockets: nothing is sent) holds the members
and their capacity documents, as on the leader. What a user relies on: a node
whose document changed, that died or that this leader just committed on is
seen by the very next filter; and at thousands of nodes a call pays only for
the nodes that changed (a node whose document did not change costs no view
and no engine verdict), which is what keeps kube-scheduler's filter call fast.
"""

from __future__ import annotations

import gc
from dataclasses import fields


from hamid.cluster.capacity import doc_from_view, view_from_doc
from hamid.cluster.changes import ChangeLog
from hamid.scheduling.extender import Extender
from hamid.scheduling.gcfreeze import Freezer
from hamid.scheduling.placer import ClusterView
from hamid.devices.catalog import A100_80, H100_80
from hamid.devices.simulated import SimulatedBackend
from hamid.gossip.membership import Membership
from hamid.gossip.params import GossipParams
from hamid.gossip.stats import Stats
from hamid.placement import Decision, place
from hamid.placement.view import GpuView, gpu_view_from_info
from hamid.request import parse_pod
from hamid.request.model import Defaults

N = 40


def _pod(mem: str = "8000", uid: str = "u1") -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "uid": uid},
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {
                "nvidia.com/gpu": "1", "nvidia.com/gpumem": mem, "nvidia.com/gpucores": "20"}}}]}}


def _caps(i: int):
    b = SimulatedBackend([H100_80 if i % 3 else A100_80] * 8, f"node-{i}", mig_enabled=(i % 10 == 0))
    return [gpu_view_from_info(g) for g in b.gpus()]


def _doc(i: int, version: int, used_mib: int = 0) -> dict:
    from hamid.placement.view import NodeView

    gpus = tuple(g.with_use(used_mib, 0, 1 if used_mib else 0, False, ()) if g.mode != "mig" else g for g in _caps(i))
    doc = doc_from_view(NodeView(f"node-{i}", gpus), version)
    doc["peer"] = f"10.0.0.{i}:7947"
    return doc


def _gossip(n: int = N) -> Membership:
    m = Membership("leader", "127.0.0.1:1", GossipParams(), Stats(), send=lambda addr, msg: None)
    for i in range(n):
        m._on_alive(f"node-{i}", f"10.0.0.{i}:7946", 1, 0, "", spread=False)
        m._apply_doc(f"node-{i}", _doc(i, 1))
    return m


class _Counting:
    def __init__(self) -> None:
        self.built: list[str] = []

    def __call__(self, doc: dict):
        self.built.append(doc["node"])
        return view_from_doc(doc)


def _extender(cluster: ClusterView) -> Extender:
    return Extender(None, None, cluster, defaults=Defaults(), node_policy="binpack",
                    is_leader=lambda: True, leader_url=lambda: None)


async def test_a_changed_document_is_seen_at_once_and_an_unchanged_node_costs_nothing():
    g = _gossip()
    to_view = _Counting()
    cv = ClusterView(g, to_view)
    first = cv.members()
    assert sorted(first) == sorted(f"node-{i}" for i in range(N)) and len(to_view.built) == N
    assert first["node-1"].peer == "10.0.0.1:7947"

    again = cv.members()
    assert again is first and len(to_view.built) == N  # nothing changed: no view built, no member rebuilt

    g._apply_doc("node-1", _doc(1, 2, used_mib=80000))  # node-1 is full now
    now = cv.members()
    assert to_view.built[N:] == ["node-1"]
    assert [x.mem_used for x in now["node-1"].view.gpus] == [80000] * 8 and now["node-1"].version == 2
    assert all(now[n] is first[n] for n in first if n != "node-1")  # the others untouched, not copied

    g._apply_doc("node-1", _doc(1, 2, used_mib=0))  # an older or equal version changes nothing
    assert cv.members() is now and to_view.built[N:] == ["node-1"]


async def test_a_dead_member_leaves_the_view_at_once_and_comes_back_with_its_document():
    from hamid.gossip.codec import DEAD

    g = _gossip()
    cv = ClusterView(g, view_from_doc)
    assert "node-5" in cv.members()
    g._set_state(g.members["node-5"], DEAD)
    assert "node-5" not in cv.members()
    g._on_alive("node-5", "10.0.0.5:7946", 2, 0, "", spread=False)
    assert "node-5" in cv.members()


async def test_a_reader_that_fell_behind_the_journal_reads_everything_again_and_is_right():
    g = _gossip()
    g.live_log = ChangeLog(keep=2)  # a journal that remembers almost nothing
    to_view = _Counting()
    cv = ClusterView(g, to_view)
    cv.members()
    for v in range(2, 8):  # more changes than the journal keeps
        for i in (3, 4, 6):
            g._apply_doc(f"node-{i}", _doc(i, v, used_mib=1000 * v))
    got = cv.members()
    assert {n: got[n].version for n in ("node-3", "node-4", "node-6", "node-7")} == {
        "node-3": 7, "node-4": 7, "node-6": 7, "node-7": 1}
    assert sorted(to_view.built[N:]) == ["node-3", "node-4", "node-6"]  # only those, though all were looked at


async def test_a_commit_is_in_the_view_at_once_and_leaves_it_when_forgotten():
    g = _gossip()
    cv = ClusterView(g, view_from_doc)
    before = cv.members()["node-2"]
    req = parse_pod(_pod("70000"), Defaults())
    dec = place(req, [before.view])
    assert isinstance(dec, Decision)
    cv.committed(dec)
    booked = cv.members()["node-2"]
    assert sum(x.mem_used for x in booked.view.gpus) == 70000
    cv.forget(dec)
    assert sum(x.mem_used for x in cv.members()["node-2"].view.gpus) == 0


async def test_a_commit_in_flight_stays_in_the_view_until_a_document_read_after_its_answer(monkeypatch):
    """The gate leader queues a node's commits behind its batch in flight, and a starved node takes
    a while to answer: a document the node publishes meanwhile (versioned well after the decision,
    but read before the commit was applied) must not drop the booking, or the next pods are sent
    to GPUs that are already taken and refused."""
    import types

    import hamid.scheduling.placer as placer

    clock = [1_000_000.0]
    monkeypatch.setattr(placer, "time", types.SimpleNamespace(time=lambda: clock[0]))
    ms = lambda: int(clock[0] * 1000)  # noqa: E731
    g = _gossip()
    cv = ClusterView(g, view_from_doc)
    dec = place(parse_pod(_pod("70000"), Defaults()), [cv.members()["node-2"].view])
    cv.committed(dec)
    clock[0] += 2.0
    g._apply_doc("node-2", _doc(2, ms()))  # published 2 s after the decision, the commit still queued
    assert sum(x.mem_used for x in cv.members()["node-2"].view.gpus) == 70000
    clock[0] += 1.0
    cv.applied(dec)  # the node answered: its ledger holds it
    clock[0] += 0.1
    g._apply_doc("node-2", _doc(2, ms()))  # read 100 ms after the answer: may predate the commit
    assert sum(x.mem_used for x in cv.members()["node-2"].view.gpus) == 70000
    clock[0] += 1.0
    g._apply_doc("node-2", _doc(2, ms(), used_mib=9000))  # read well after: the document is the truth
    assert sum(x.mem_used for x in cv.members()["node-2"].view.gpus) == 8 * 9000
    assert "node-2" not in cv.pending


async def test_filter_sees_changes_at_once_and_recomputes_only_changed_nodes():
    g = _gossip()
    ext = _extender(ClusterView(g, view_from_doc))
    names = [f"node-{i}" for i in range(N)] + ["not-a-member"]
    out = ext.filter({"Pod": _pod(), "NodeNames": names})
    assert out["NodeNames"] == [n for n in names if n != "not-a-member"]
    assert "no hamid daemon" in out["FailedNodes"]["not-a-member"]
    computed = ext.verdicts.computed
    assert computed == N

    # a replica (same request, another pod): no verdict computed again
    assert ext.filter({"Pod": _pod(uid="u2"), "NodeNames": names})["NodeNames"] == out["NodeNames"]
    assert ext.verdicts.computed == computed

    # node-7 fills up (its document says so): the next filter turns it away, and only it was looked at
    g._apply_doc("node-7", _doc(7, 2, used_mib=80000))
    out = ext.filter({"Pod": _pod(uid="u3"), "NodeNames": names})
    assert "node-7" not in out["NodeNames"] and "MiB" in out["FailedNodes"]["node-7"]
    assert ext.verdicts.computed == computed + 1

    # a commit of this leader's on node-8, not yet gossiped back, counts at once too
    cv = ext.cluster
    dec = place(parse_pod(_pod("75000"), Defaults()), [cv.members()["node-8"].view])
    assert isinstance(dec, Decision) and dec.node == "node-8"
    for _ in range(8):  # every GPU of node-8
        d = place(parse_pod(_pod("75000"), Defaults()), [cv.members()["node-8"].view])
        cv.committed(d)
    out = ext.filter({"Pod": _pod(uid="u4"), "NodeNames": names})
    assert "node-8" not in out["NodeNames"]
    assert ext.verdicts.computed == computed + 2

    # another request shape has its own verdicts (a full pass once), and sees the same changes
    big = ext.filter({"Pod": _pod("79000", uid="u5"), "NodeNames": names})
    assert "node-7" not in big["NodeNames"] and "node-8" not in big["NodeNames"]


async def test_prioritize_scores_feasible_nodes_by_their_use():
    g = _gossip(3)
    g._apply_doc("node-1", _doc(1, 2, used_mib=40000))
    ext = _extender(ClusterView(g, view_from_doc))
    got = {r["Host"]: r["Score"] for r in ext.prioritize({"Pod": _pod(), "NodeNames": ["node-0", "node-1", "node-2"]})}
    assert got["node-1"] == 5 and got["node-2"] == 0  # binpack: the half-full node first
    assert got["node-0"] == 0  # nothing booked on it


def test_views_from_documents_carry_every_field_of_the_engine_s_view():
    """view_from_doc builds GpuViews without the dataclass constructor (speed): a field added to
    GpuView and forgotten there would be missing from every gossiped view."""
    names = {f.name for f in fields(GpuView)}
    for i in (0, 1, 3):  # MIG, H100, A100
        doc = _doc(i, 1, used_mib=0 if i == 0 else 1234)
        view = view_from_doc(doc)
        for g in view.gpus:
            assert names <= set(vars(g)), names - set(vars(g))
        assert doc_from_view(view, 1) == {k: v for k, v in doc.items() if k != "peer"}
        assert view.gpus == tuple(GpuView(**{n: getattr(g, n) for n in names}) for g in view.gpus)


def test_the_freezer_freezes_once_enough_views_were_built():
    f = Freezer(min_built=10, full_every_s=3600)
    try:
        before = gc.get_freeze_count()
        f.built(5, 20)
        assert f.freezes == 0
        keep = [object() for _ in range(10)]  # noqa: F841  (something alive to freeze)
        f.built(5, 20)
        assert f.freezes == 1 and gc.get_freeze_count() > before
    finally:
        gc.unfreeze()


def test_the_change_log_gives_each_reader_what_changed_since_its_cursor():
    log = ChangeLog(keep=3)
    assert log.since(None) is None
    c0 = log.cursor
    log.mark("a")
    log.mark("b")
    view = log.frozen()
    assert log.since(c0) == {"a", "b"}
    for x in "cdefgh":
        log.mark(x)
    assert log.since(c0) is None  # fell behind: read everything
    assert view.since(c0) == {"a", "b"}  # a view taken earlier (a worker's) is still whole
    assert log.since(log.cursor - 2) == {"g", "h"}


async def test_filter_holds_a_namespace_quota_with_cached_decisions_and_sees_the_quota_change():
    """With a quota, each fitting node's decision is checked against it; what a node's decision gives
    is kept like its verdict (decided once per node until the node changes), but the quota itself is
    asked afresh on every call: a namespace that used more since is refused on the next filter."""
    from hamid.scheduling.quota import Limit, NamespaceQuota, Usage
    from hamid.request.model import ResourceNames

    g = _gossip(6)
    used = [Usage(0, 0)]
    names = ResourceNames()

    def book():
        class Book:
            def of(self, ns, uid):
                return NamespaceQuota(ns, {names.memory: Limit(names.memory, 20000, "q", 20000)}, used[0], names)
        return Book()

    ext = Extender(None, None, ClusterView(g, view_from_doc), defaults=Defaults(), node_policy="binpack",
                   is_leader=lambda: True, leader_url=lambda: None, quotas=book)
    nodes = [f"node-{i}" for i in range(6)]
    out = ext.filter({"Pod": _pod("8000"), "NodeNames": nodes})
    fit = out["NodeNames"]
    assert fit and not any("quota" in v for v in out["FailedNodes"].values())
    decided = ext.verdicts.decided
    assert decided == len(fit)

    used[0] = Usage(15000, 0)  # the namespace now holds 15000 MiB: 8000 more would pass 20000
    out = ext.filter({"Pod": _pod("8000", uid="u2"), "NodeNames": nodes})
    assert out["NodeNames"] == []
    assert all("ResourceQuota q" in out["FailedNodes"][n] and "15000" in out["FailedNodes"][n] for n in fit)
    assert ext.verdicts.decided == decided  # no node changed: no decision computed again

    g._apply_doc("node-3", _doc(3, 2, used_mib=1000))  # one node changes: only its decision is recomputed
    used[0] = Usage(0, 0)
    out = ext.filter({"Pod": _pod("8000", uid="u3"), "NodeNames": nodes})
    assert "node-3" in out["NodeNames"] and ext.verdicts.decided == decided + 1


async def test_a_cluster_view_over_a_plain_read_function_reads_everything_and_is_right():
    docs = {"node-1": _doc(1, 1)}
    cv = ClusterView(read=lambda: docs, to_view=view_from_doc)
    assert list(cv.members()) == ["node-1"]
    docs["node-2"] = _doc(2, 1)
    docs["node-1"] = _doc(1, 2, used_mib=5000)
    got = cv.members()
    assert sorted(got) == ["node-1", "node-2"] and got["node-1"].version == 2
    del docs["node-2"]
    assert list(cv.members()) == ["node-1"]


async def test_what_filter_remembers_for_bind_is_bounded_by_node_names_and_keeps_the_latest(monkeypatch):
    """The extender remembers, per filtered pod, the nodes it passed, so that bind goes only where filter
    (and kube-scheduler's own filters, which chose the candidates) said. A backlog of pending pods at 15,000
    nodes held one list per pod: 7.5 GiB at the 65,536-pod bound. The names held across pods are bounded
    too; the most recent pods keep theirs (kube-scheduler binds within seconds of filtering), the oldest
    are forgotten and their bind refused (the pod is filtered again)."""
    import hamid.scheduling.extender as ext_mod

    ext = _extender(ClusterView(_gossip(), view_from_doc))
    nodes = [f"node-{i}" for i in range(N)]
    passed = ext.filter({"Pod": _pod("8000", uid="u0"), "NodeNames": nodes})["NodeNames"]
    assert len(passed) > 10
    monkeypatch.setattr(ext_mod, "FILTERED_NAMES_MAX", 3 * len(passed))
    for i in range(1, 6):
        ext.filter({"Pod": _pod("8000", uid=f"u{i}"), "NodeNames": nodes})
    ext.filter({"Pod": _pod("8000", uid="u5"), "NodeNames": nodes})  # filtered again: counted once
    node = passed[0]
    assert [ext._filtered_onto(f"u{i}", node) for i in range(6)] == [False, False, False, True, True, True]
    assert ext._filtered_names == 3 * len(passed) == sum(len(v[1]) for v in ext._filtered.values())
