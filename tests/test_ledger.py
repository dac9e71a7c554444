"""The ledger: durable, re-checked, idempotent, and safe across processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import sqlite3

import pytest

from simnodes import node_view

from hamid.ledger import Abandoned, Details, IllegalTransition, Ledger, LedgerConflict, LedgerError, claimant_id
from hamid.node.identity import Owner, OwnerError
from hamid.placement import place
from hamid.request import parse_docker_env


def new_ledger(path, spec="T4:2", **settings):
    led = Ledger(path)
    view = node_view("node-a", spec, **settings)
    led.set_inventory("node-a", view.gpus)
    return led


def req(cid, spec="mem=4g", devices=None):
    env = {"HAMI_VGPU_SPEC": spec}
    if devices is not None:
        env["HAMI_VISIBLE_DEVICES"] = devices
    return parse_docker_env(env, cid)


def test_reserve_release_and_idempotence(tmp_path):
    led = new_ledger(tmp_path / "l.db")
    r1 = led.reserve(req("a"), kind="docker", details=Details(runc_root="/x"))
    assert r1.state == "reserved" and r1.details.runc_root == "/x"
    assert led.reserve(req("a"), kind="docker") == r1  # same owner: same reservation
    assert [r.owner for r in led.list()] == ["docker:a"]
    assert led.view().gpus[0].mem_used + led.view().gpus[1].mem_used == 4096
    assert led.release("docker:a") == r1
    assert led.release("docker:a") is None  # idempotent
    assert all(g.mem_used == 0 for g in led.view().gpus)


def test_conflict_names_the_gpu(tmp_path):
    led = new_ledger(tmp_path / "l.db", "T4")
    led.reserve(req("a", "mem=12g"), kind="docker")
    with pytest.raises(LedgerConflict) as e:
        led.reserve(req("b", "mem=4g"), kind="docker")
    assert "GPU 0 has 3072 MiB free, 4096 requested" in str(e.value)
    assert len(led.list()) == 1


def test_commit_rechecks_a_stale_proposal(tmp_path):
    led = new_ledger(tmp_path / "l.db", "T4")
    view = led.view()
    d1 = place(req("a", "mem=10g"), [view])
    d2 = place(req("b", "mem=10g"), [view])  # both proposed on the same view
    led.commit("docker:a", d1, kind="docker")
    with pytest.raises(LedgerConflict, match="5120 MiB free, 10240 requested"):
        led.commit("docker:b", d2, kind="docker")
    other = place(req("c", "mem=2g"), [view])
    with pytest.raises(LedgerConflict, match="already holds a different"):
        led.commit("docker:a", other, kind="docker")
    assert led.commit("docker:a", d1, kind="docker").owner == "docker:a"  # replay is fine


def test_filtered_gpu_is_refused_even_if_proposed(tmp_path):
    led = new_ledger(tmp_path / "l.db", "T4:2", filterDevices={"index": [1]})
    forged = place(req("a", "mem=1g", "1"), [node_view("node-a", "T4:2")])  # a view without the filter
    with pytest.raises(LedgerConflict, match="excluded by this node's filterDevices"):
        led.commit("docker:a", forged, kind="docker")


def test_durable_wal_and_private(tmp_path):
    path = tmp_path / "state" / "l.db"
    led = new_ledger(path)
    led.reserve(req("a"), kind="docker")
    led.transition("docker:a", "allocated", mig={"GPU-x": {"gi": 1, "ci": 0, "uuid": "MIG-y"}})
    led.close()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()
    again = Ledger(path)
    r = again.get("docker:a")
    assert r.state == "allocated" and r.mig["GPU-x"]["gi"] == 1


def test_no_inventory_is_a_clear_error(tmp_path):
    led = Ledger(tmp_path / "l.db")
    with pytest.raises(LedgerError, match="no inventory yet"):
        led.reserve(req("a"), kind="docker")


def test_reconcile_releases_only_the_dead(tmp_path):
    led = new_ledger(tmp_path / "l.db")
    for c in ("a", "b", "c"):
        led.reserve(req(c, "mem=1g"), kind="docker")
    gone = led.stale(lambda r: r.owner != "docker:b", claimant_id())
    assert [r.owner for r in gone] == ["docker:b"]


def test_states_move_only_forward_and_illegal_moves_are_errors(tmp_path):
    led = new_ledger(tmp_path / "l.db")
    assert led.reserve(req("a", "mem=1g"), kind="docker").state == "reserved"
    with pytest.raises(IllegalTransition, match="reserved -> running is not allowed"):
        led.transition("docker:a", "running")
    assert led.transition("docker:a", "allocated").state == "allocated"
    assert led.transition("docker:a", "running").state == "running"
    with pytest.raises(IllegalTransition, match="running -> allocated"):
        led.transition("docker:a", "allocated")
    me = claimant_id()
    res, mine = led.begin_release("docker:a", me)
    assert mine and res.state == "releasing"
    with pytest.raises(IllegalTransition, match="releasing -> running"):
        led.transition("docker:a", "running")
    # the row still books its GPU while releasing: nothing else can take it
    assert led.view().gpus[0].mem_used + led.view().gpus[1].mem_used == 1024
    assert led.finish_release("docker:a", me) and led.get("docker:a") is None


def test_a_release_claim_belongs_to_one_live_process(tmp_path):
    led = new_ledger(tmp_path / "l.db")
    led.reserve(req("a", "mem=1g"), kind="docker")
    other = claimant_id(os.getppid())  # a live process that is not us
    assert led.begin_release("docker:a", other)[1] is True
    res, mine = led.begin_release("docker:a", claimant_id())
    assert res is not None and not mine  # someone alive is tearing it down
    assert not led.finish_release("docker:a", claimant_id())
    dead = "999999999@1"  # no such process: its claim is taken over
    led2 = new_ledger(tmp_path / "m.db")
    led2.reserve(req("b", "mem=1g"), kind="docker")
    assert led2.begin_release("docker:b", dead)[1]
    assert [r.owner for r in led2.stale(lambda r: True, claimant_id())] == ["docker:b"]
    assert led2.begin_release("docker:b", claimant_id())[1]


def test_owner_is_the_uid_so_a_recreated_pod_with_the_same_name_is_new(tmp_path):
    led = new_ledger(tmp_path / "l.db")
    old = Owner("pod", "0d6f0a9e-1111-4c6b-9b0e-000000000001", name="default/web")
    new = Owner("pod", "0d6f0a9e-2222-4c6b-9b0e-000000000002", name="default/web")
    r1 = led.reserve(req("x", "mem=1g"), owner=old)
    r2 = led.reserve(req("x", "mem=2g"), owner=new)
    assert r1.owner != r2.owner and r1.name == r2.name == "default/web"
    assert r2.decision.containers[0].devices[0].mem_mib == 2048  # not the stale one's
    assert {r.owner for r in led.list()} == {old.key, new.key}
    with pytest.raises(OwnerError, match="owner uid: bad value"):
        Owner("pod", "../etc")


def test_an_abandoned_request_commits_nothing(tmp_path):
    import time

    led = new_ledger(tmp_path / "l.db")
    with pytest.raises(Abandoned, match="deadline passed"):
        led.reserve(req("a", "mem=1g"), kind="docker", deadline=time.time() - 1)
    assert led.list() == []
    assert led.reserve(req("a", "mem=1g"), kind="docker", deadline=time.time() + 5).state == "reserved"


def test_a_schema_1_ledger_is_upgraded_in_place(tmp_path):
    import json

    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE gpus (uuid TEXT PRIMARY KEY, idx INTEGER NOT NULL, capacity TEXT NOT NULL);
        CREATE TABLE reservations (owner TEXT PRIMARY KEY, kind TEXT NOT NULL, state TEXT NOT NULL,
            created REAL NOT NULL, request TEXT NOT NULL, decision TEXT NOT NULL,
            mig TEXT NOT NULL DEFAULT '{}', details TEXT NOT NULL DEFAULT '{}');
        INSERT INTO meta VALUES ('schema', '1');
    """)
    dec = {"node": "node-a", "containers": [{"name": "main", "init": False, "devices": []}]}
    db.execute("INSERT INTO reservations VALUES ('docker:z', 'docker', 'active', 1.0, '{}', ?, '{}', '{}')",
               (json.dumps(dec),))
    db.commit()
    db.close()
    led = Ledger(path)
    r = led.get("docker:z")
    assert r.state == "running" and r.name == ""
    assert led._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0] == "2"


def _hammer(path: str, worker: int, rounds: int, seed: int, out) -> None:
    rnd = random.Random(seed)
    led = Ledger(path)
    mine: list[str] = []
    ok = conflicts = 0
    for i in range(rounds):
        if mine and rnd.random() < 0.45:
            led.release(mine.pop(rnd.randrange(len(mine))))
            continue
        owner = f"w{worker}-{i}"
        spec = rnd.choice(["mem=1g", "mem=3g,cores=20", "mem=5g,cores=35", "mem=25%", "mem=2g,cores=50"])
        try:
            led.reserve(req(owner, spec), kind="docker")
            mine.append(f"docker:{owner}")
            ok += 1
        except LedgerConflict:
            conflicts += 1
        if i % 7 == 0:  # observe the node while the other process writes
            for g in led.view().gpus:
                if g.mem_used > g.mem_total or g.cores_used > g.cores_total or g.shares_used > g.shares_total:
                    out.put(("overbooked", worker, i, g.index, g.mem_used, g.cores_used, g.shares_used))
                    return
    out.put(("done", worker, ok, conflicts))


@pytest.mark.slow
def test_two_processes_never_overbook(tmp_path):
    path = tmp_path / "l.db"
    new_ledger(path, "T4:2", deviceSplitCount=4).close()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    rounds = int(os.environ.get("HAMID_LEDGER_ROUNDS", "2500"))
    procs = [ctx.Process(target=_hammer, args=(str(path), w, rounds, w + 11, q)) for w in range(2)]
    for p in procs:
        p.start()
    results = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(r[0] == "done" for r in results), results
    assert sum(r[2] for r in results) > 500 and sum(r[3] for r in results) > 50, results  # both paths exercised
    led = Ledger(path)
    for g in led.view().gpus:
        assert g.mem_used <= g.mem_total and g.cores_used <= g.cores_total and g.shares_used <= g.shares_total


def test_change_stamp_moves_on_every_commit_from_anyone_and_only_then(tmp_path):
    led = new_ledger(tmp_path / "l.db")
    s0 = led.change_stamp()
    assert s0 is not None
    led.view()
    led.list()
    assert led.change_stamp() == s0  # reads do not move it
    led.reserve(req("a"), kind="docker")
    s1 = led.change_stamp()
    assert s1 != s0  # a commit on this object's own connection
    other = Ledger(tmp_path / "l.db")  # another writer (the runtime with no daemon)
    assert led.change_stamp() == s1
    other.release("docker:a")
    assert led.change_stamp() not in (s0, s1)
    other.close()
    led.close()


def test_a_state_query_reads_exactly_the_rows_in_that_state_and_decodes_no_other(tmp_path, monkeypatch):
    """The kubelet face asks, per GetPreferredAllocation, for the pods still waiting on their devices:
    on a node holding many reservations it gets exactly those, oldest first, and pays for decoding
    those alone (it decoded every row of the ledger per call)."""
    import hamid.ledger.store as store

    led = new_ledger(tmp_path / "l.db", deviceSplitCount=40)
    for i in range(30):  # running pods and containers: the bulk of a busy node
        owner = Owner("pod", f"run{i}", name=f"ns/run{i}") if i % 2 else Owner("docker", f"c{i}")
        led.reserve(req(f"r{i}", "mem=100m"), owner=owner, prepare=lambda r: True)
    waiting = [led.reserve(req(f"w{i}", "mem=100m"), owner=Owner("pod", f"wait{i}", name=f"ns/wait{i}")).owner
               for i in range(3)]
    led.reserve(req("d", "mem=100m"), owner=Owner("docker", "dwait"))  # reserved, but not a pod
    assert sum(r.state == "allocated" for r in led.list()) == 30
    decoded = []
    real_row = store._row
    monkeypatch.setattr(store, "_row", lambda r: decoded.append(r["owner"]) or real_row(r))
    got = led.in_state("reserved", kind="pod")
    assert [r.owner for r in got] == waiting
    assert decoded == waiting  # no other row decoded
    assert [r.owner for r in led.in_state("reserved")] == [*waiting, "docker:dwait"]
    assert len(led.in_state("allocated", kind="docker")) == 15
    with pytest.raises(LedgerError, match="'gone'.*reserved, allocated, running, releasing"):
        led.in_state("gone")
    plan = " ".join(str(tuple(r)) for r in led._db.execute(
        "EXPLAIN QUERY PLAN SELECT * FROM reservations WHERE state=? AND kind=? ORDER BY created", ("reserved", "pod")))
    assert "INDEX" in plan.upper(), plan  # found through an index, not a scan of every row
    led.close()


def test_listing_again_decodes_only_the_rows_that_changed_whoever_changed_them(tmp_path, monkeypatch):
    """The daemon lists every reservation once a second (the priority pass) and on other loops; a row
    that did not change since the last list is not decoded again (1.6 ms a list at 100 rows), and a
    change by this object or by another connection (the runtime with no daemon) is always seen."""
    import hamid.ledger.store as store

    led = new_ledger(tmp_path / "l.db", deviceSplitCount=40)
    for i in range(20):
        led.reserve(req(f"c{i}", "mem=100m"), kind="docker")
    first = led.list()
    decoded = []
    real_row = store._row
    monkeypatch.setattr(store, "_row", lambda r: decoded.append(r["owner"]) or real_row(r))
    assert led.list() == first and decoded == []
    led.transition("docker:c3", "allocated")
    other = Ledger(tmp_path / "l.db")
    other.release("docker:c5")
    other.transition("docker:c7", "allocated", details=Details(display_name="seven"))
    decoded.clear()
    got = led.list()
    assert sorted(decoded) == ["docker:c3", "docker:c7"]
    assert [r.owner for r in got] == [r.owner for r in first if r.owner != "docker:c5"]
    by = {r.owner: r for r in got}
    assert by["docker:c3"].state == "allocated" and by["docker:c7"].details.display_name == "seven"
    assert got == other.list()  # what a fresh reader decodes from the rows
    other.close()
    led.close()


def test_time_slots_an_earlier_version_stored_are_removed_on_open_and_nothing_else_is(tmp_path):
    """Earlier versions stored each reservation's time slots in its details; the limiter stopped
    using them and the ledger no longer gives them. A ledger written then opens with every
    reservation and every other detail as it was, the dead key gone from the file, and books as before."""
    import json

    path = tmp_path / "ledger.db"
    led = new_ledger(path)
    a = led.reserve(req("a", "mem=4g,cores=30"), kind="docker", details=Details(container_id="a", display_name="web"))
    b = led.reserve(req("b", "mem=1g"), kind="docker")
    view_before = led.view()
    led.close()
    uuid = a.decision.containers[0].devices[0].uuid
    db = sqlite3.connect(path)  # as an earlier version wrote it
    old = json.loads(db.execute("SELECT details FROM reservations WHERE owner=?", (a.owner,)).fetchone()[0])
    db.execute("UPDATE reservations SET details=? WHERE owner=?",
               (json.dumps({**old, "slots": {"main": {uuid: [[0, 30]]}}}), a.owner))
    db.commit()
    db.close()

    led = Ledger(path)
    got = led.get(a.owner)
    assert got.details == a.details and got.details.container_id == "a" and got.details.display_name == "web"
    assert got.decision == a.decision and got.state == a.state and got.request == a.request
    assert sorted(r.owner for r in led.list()) == sorted([a.owner, b.owner])
    assert led.view() == view_before
    stored = {o: json.loads(d) for o, d in led._db.execute("SELECT owner, details FROM reservations")}
    assert all("slots" not in d for d in stored.values())
    assert stored[a.owner] == old  # everything else kept: the same keys and values
    # the schema number stays, so an earlier hamid still opens it (and reads no slots as none)
    assert led._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0] == "2"
    led.reserve(req("c", "mem=2g,cores=20"), kind="docker")  # books as before
