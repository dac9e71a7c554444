"""Admission's cost on the disk and what makes that safe (issue 25, PreStartContainer p99).

An admission commits its reservation, its containers' files and ``allocated`` in ONE ledger
transaction, and the limits file is no longer fsynced; in exchange the daemon, before any face
serves, rewrites every live reservation's limits file that is not what the ledger says
(deleted, emptied, torn, replaced by a link), and touches nothing else: not a region
directory, not a file that is already right (a running container's mount holds its inode).
"""

from __future__ import annotations

import os

import pytest

from hamid.node.identity import Owner
from hamid.node.layout import limits_file, region_dir
from hamid.request import parse_docker_env
from hamid.shimlimits import decode, limits_size
from nodeharness import make_node
from test_daemon import start, stop


def _req(cid: str, spec: str):
    return parse_docker_env({"HAMI_VGPU_SPEC": spec}, cid)


class Spy:
    """Counts the ledger's write transactions (its connection's statements) and os.fsync calls."""

    def __init__(self, ledger, monkeypatch) -> None:
        self.statements: list[str] = []
        self.fsyncs = 0
        ledger._db.set_trace_callback(self.statements.append)
        real = os.fsync

        def fsync(fd):
            self.fsyncs += 1
            return real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    @property
    def writes(self) -> int:
        return sum(1 for s in self.statements if s.strip().upper() == "BEGIN IMMEDIATE")


@pytest.fixture
def node(tmp_path):
    d = make_node(tmp_path / "s", simulate="T4:2", regionTmpfs=False)
    yield d
    d.close()


def test_an_admission_is_one_ledger_transaction_and_no_file_fsync(node, monkeypatch):
    spy = Spy(node.ledger, monkeypatch)
    got = node.core.admit(Owner("docker", "c1"), _req("c1", "mem=4g,cores=30"))
    assert got.reservation.state == "allocated"
    assert spy.writes == 1 and spy.fsyncs == 0, spy.statements
    with open(limits_file(node.core.state_dir, "c1"), "rb") as f:
        lim = decode(f.read())
    assert lim.devices[0].memory_bytes == 4096 << 20 and lim.devices[0].sm_percent == 30
    assert node.ledger.get("docker:c1").state == "allocated"


def test_a_placed_pods_first_start_records_kubelets_slots_in_the_same_transaction(node, monkeypatch):
    """The gate path: the leader committed the pod; at PreStartContainer the node learns kubelet's
    slot and prepares it: one transaction; a restart with the same slot writes none."""
    from hamid.placement import place

    owner = Owner("pod", "u1", name="default/p")
    decision = place(_req("main", "mem=2g"), [node.ledger.view()])
    node.ledger.commit(owner, decision)
    door = node.service.door()
    spy = Spy(node.ledger, monkeypatch)
    res = door.prepare(owner.key, user=None, slots={"main": "slot-7"})
    assert res.state == "allocated" and res.details.container_slots == {"main": "slot-7"}
    assert spy.writes == 1 and spy.fsyncs == 0
    assert os.path.getsize(limits_file(node.core.state_dir, "slot-7")) == limits_size()
    again = door.prepare(owner.key, user=None, slots={"main": "slot-7"})
    assert again.details.container_slots == {"main": "slot-7"} and spy.writes == 1
    moved = door.prepare(owner.key, user=None, slots={"main": "slot-8"})  # a new slot is recorded
    assert moved.details.container_slots == {"main": "slot-8"} and spy.writes == 2


def test_a_failed_preparation_leaves_no_reservation_and_no_files(node, monkeypatch):
    import hamid.shimlimits as shimlimits

    def broken(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shimlimits, "write_limits_file", broken)
    with pytest.raises(OSError):
        node.core.admit(Owner("docker", "c9"), _req("c9", "mem=2g"))
    assert node.ledger.list() == []
    assert not os.path.lexists(region_dir(node.core.state_dir, "c9"))


def test_start_up_restores_damaged_limits_files_and_leaves_the_rest_alone(node, tmp_path):
    st = node.core.state_dir
    for cid in ("gone", "torn", "linked", "fine"):
        node.core.admit(Owner("docker", cid), _req(cid, "mem=2g,cores=20"))
    want = {cid: decode(open(limits_file(st, cid), "rb").read()) for cid in ("gone", "torn", "linked", "fine")}
    os.unlink(limits_file(st, "gone"))
    with open(limits_file(st, "torn"), "r+b") as f:
        f.truncate(100)
    outside = tmp_path / "outside"
    outside.write_bytes(b"not ours")
    os.unlink(limits_file(st, "linked"))
    os.symlink(outside, limits_file(st, "linked"))
    fine_inode = os.stat(limits_file(st, "fine")).st_ino
    # a tenant's region file (the shim's), and one a tenant named like a limits file: never touched
    region = os.path.join(region_dir(st, "torn"), "vgpu.cache")
    with open(region, "wb") as f:
        f.write(b"tenant bytes")
    decoy = os.path.join(region_dir(st, "gone"), os.path.basename(limits_file(st, "gone")))
    with open(decoy, "wb") as f:
        f.write(b"decoy")
    region_stat = os.stat(region)

    restored = node.core.restore_limits_files()

    assert sorted(restored) == sorted(limits_file(st, c) for c in ("gone", "torn", "linked"))
    for cid, lim in want.items():
        path = limits_file(st, cid)
        assert not os.path.islink(path)
        assert decode(open(path, "rb").read()) == lim
    assert outside.read_bytes() == b"not ours"
    assert os.stat(limits_file(st, "fine")).st_ino == fine_inode  # right already: the same inode
    assert open(region, "rb").read() == b"tenant bytes" and os.stat(region).st_mtime_ns == region_stat.st_mtime_ns
    assert open(decoy, "rb").read() == b"decoy"
    assert node.core.restore_limits_files() == []  # nothing left to do


def test_a_restart_that_reuses_its_reservation_finds_its_limits_file_whole(node):
    """A Docker restart admits the container again and finds its reservation (perhaps with no daemon,
    after an OS crash lost the unsynced file): its limits file is made whole before it is reused."""
    st = node.core.state_dir
    node.core.admit(Owner("docker", "r1"), _req("r1", "mem=3g,cores=40"))
    want = decode(open(limits_file(st, "r1"), "rb").read())
    with open(limits_file(st, "r1"), "r+b") as f:
        f.truncate(0)
    got = node.core.admit(Owner("docker", "r1"), _req("r1", "mem=3g,cores=40"))
    assert got.reservation.state == "allocated"
    assert decode(open(limits_file(st, "r1"), "rb").read()) == want


@pytest.mark.slow  # a daemon start: a few seconds
def test_the_daemon_restores_limits_files_before_it_serves(tmp_path, free_port):
    state = tmp_path / "s"
    d = make_node(state, simulate="T4", node="node-a", regionTmpfs=False)
    try:
        d.core.admit(Owner("docker", "c1"), _req("c1", "mem=2g"))
        want = open(limits_file(state, "c1"), "rb").read()
    finally:
        d.close()
    os.unlink(limits_file(state, "c1"))
    daemon = start(state, free_port, "--simulate", "T4")
    try:
        assert open(limits_file(state, "c1"), "rb").read()[:64] == want[:64]
        assert decode(open(limits_file(state, "c1"), "rb").read()) == decode(want)
    finally:
        stop(daemon)
