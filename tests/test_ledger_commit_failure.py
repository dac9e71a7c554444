"""A failed COMMIT leaves no trace (issue 38 item 3).

When SQLite's COMMIT itself fails (disk full, I/O error, busy) the change is
not on disk: the ledger's in-memory state (its booked cache, its connection's
transaction) must go back to what is on disk, and the next change after the
cause is gone must commit. Each write the ledger offers is tried three ways:

- the COMMIT fails and SQLite left the transaction open (what SQLITE_BUSY does);
- the COMMIT fails and SQLite rolled the transaction back itself (what
  SQLITE_FULL and SQLITE_IOERR may do);
- a real full file system: a small tmpfs mounted by the test (root), filled up
  before the change, emptied after.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
from dataclasses import dataclass
from collections.abc import Callable

import pytest

from simnodes import node_view

from hamid.ledger import Details, Ledger, LedgerError, claimant_id
from hamid.placement import place
from hamid.request import parse_docker_env


def req(cid: str, spec: str = "mem=4g"):
    return parse_docker_env({"HAMI_VGPU_SPEC": spec}, cid)


def new_ledger(path) -> Ledger:
    led = Ledger(path)
    led.set_inventory("node-a", node_view("node-a", "T4:1").gpus)
    return led


class FailingCommit:
    """The ledger's own SQLite connection, except that the next ``arm``ed COMMIT
    fails as SQLite fails it: leaving the transaction open ("busy") or rolled
    back ("rolled back"). Everything else is the real connection's."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self.armed: str | None = None

    def execute(self, sql: str, *args):
        if sql == "COMMIT" and self.armed is not None and self._db.in_transaction:
            how, self.armed = self.armed, None
            if how == "busy":
                raise sqlite3.OperationalError("database is locked")
            self._db.execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._db, name)


@dataclass
class Site:
    """One write of the ledger: ``setup`` brings the ledger to the state before it, ``change`` makes it."""

    name: str
    setup: Callable[[Ledger], None]
    change: Callable[[Ledger], object]


def _full(led: Ledger) -> None:
    led.reserve(req("a", "mem=15g"), kind="docker", details=Details(runc_root="/x"))


def _releasing(led: Ledger) -> None:
    _full(led)
    led.begin_release("docker:a", claimant_id())


def _nothing(led: Ledger) -> None:
    pass


SITES = [
    Site("reserve", _nothing, lambda led: led.reserve(req("a", "mem=15g"), kind="docker")),
    Site("reserve-prepared", _nothing,
         lambda led: led.reserve(req("a", "mem=15g"), kind="docker", prepare=lambda r: True)),
    Site("commit", _nothing, lambda led: led.commit("docker:b", place(req("b", "mem=15g"), [led.view()]),
                                                    kind="docker")),
    Site("commit_many", _nothing, lambda led: led.commit_many(
        [("docker:b", place(req("b", "mem=7g"), [led.view()]), None, None),
         ("docker:c", place(req("c", "mem=7g"), [led.view()]), None, None)])),
    Site("allocate", _full, lambda led: led.allocate("docker:a", lambda r: True)),
    Site("transition", _full, lambda led: led.transition("docker:a", "allocated")),
    Site("update", _full, lambda led: led.update("docker:a", details=Details(runc_root="/y"))),
    Site("recommit", lambda led: led.reserve(req("a", "mem=4g"), kind="docker"),
         lambda led: led.recommit("docker:a", place(req("a", "mem=8g"), [led.view_without("docker:a")]))),
    Site("release", _full, lambda led: led.release("docker:a")),
    Site("begin_release", _full, lambda led: led.begin_release("docker:a", claimant_id())),
    Site("finish_release", _releasing, lambda led: led.finish_release("docker:a", claimant_id())),
    Site("set_inventory", _full,
         lambda led: led.set_inventory("node-a", node_view("node-a", "T4:2").gpus)),
]


def snapshot(led: Ledger) -> tuple:
    """What a caller sees: every reservation as stored, and every GPU's use and capacity."""
    view = led.view()
    return ([r.to_dict() for r in led.list()],
            [(g.uuid, g.mem_total, g.mem_used, g.cores_used, g.shares_used) for g in view.gpus])


def on_disk(path) -> tuple:
    other = Ledger(path)
    try:
        return snapshot(other)
    finally:
        other.close()


def _check_no_trace_and_next_commit(led: Ledger, path, site: Site, before: tuple) -> None:
    assert snapshot(led) == before == on_disk(path), f"{site.name}: the failed commit left a trace in memory"
    site.change(led)  # the cause is gone: the same change commits now
    after = snapshot(led)
    assert after != before and after == on_disk(path)


@pytest.mark.parametrize("how", ["busy", "rolled back"])
@pytest.mark.parametrize("site", SITES, ids=[s.name for s in SITES])
def test_a_commit_that_fails_leaves_no_trace_and_the_next_one_commits(tmp_path, site, how):
    path = tmp_path / "l.db"
    led = new_ledger(path)
    site.setup(led)
    before = snapshot(led)
    failing = FailingCommit(led._db)
    led._db = failing  # the ledger's own connection, its COMMIT made to fail once
    failing.armed = how
    with pytest.raises(LedgerError) as e:
        site.change(led)
    assert str(path) in str(e.value) and ("locked" in str(e.value) or "full" in str(e.value))
    assert failing.armed is None, f"{site.name}: no COMMIT was tried"
    _check_no_trace_and_next_commit(led, path, site, before)


@pytest.fixture
def small_fs(tmp_path):
    """A 1 MiB tmpfs of the test's own (the test runs as root), unmounted after."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if got.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(directory) -> str:
    """Fill the file system under ``directory`` to its last byte; the filler's path."""
    filler = os.path.join(directory, "filler")
    with open(filler, "wb", buffering=0) as f:
        for size in (1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC
    return filler


@pytest.mark.parametrize("site", SITES, ids=[s.name for s in SITES])
def test_a_full_file_system_fails_the_commit_without_a_trace_and_space_back_lets_it_commit(small_fs, site):
    path = small_fs / "l.db"
    led = new_ledger(path)
    site.setup(led)
    before = snapshot(led)
    filler = fill(small_fs)
    with pytest.raises(LedgerError) as e:
        site.change(led)
    assert str(path) in str(e.value)
    assert snapshot(led) == before, f"{site.name}: the failed commit left a trace in memory"
    os.unlink(filler)  # space is back
    _check_no_trace_and_next_commit(led, path, site, before)


def test_a_change_made_at_open_that_cannot_commit_refuses_the_open_and_the_next_open_makes_it(small_fs):
    """Opening rewrites what earlier versions stored (a details key nothing reads): on a full disk
    the open is refused naming the file, and the next open, with space back, does it."""
    from hamid.ledger.store import DROPPED_DETAILS

    path = small_fs / "l.db"
    led = new_ledger(path)
    _full(led)
    led.close()
    raw = sqlite3.connect(str(path))
    raw.execute("UPDATE reservations SET details=? WHERE owner='docker:a'",
                ('{"runc_root": "/x", "%s": {"0": 1}}' % DROPPED_DETAILS[0],))
    raw.commit()  # raw stays open: the WAL and its index stay, so the open gets as far as its COMMIT
    filler = fill(small_fs)
    with pytest.raises(LedgerError) as e:
        Ledger(path)
    assert str(path) in str(e.value) and "removal of keys" in str(e.value)
    os.unlink(filler)
    raw.close()
    led = Ledger(path)
    (res,) = led.list()
    assert res.details.runc_root == "/x"
    led.close()
    raw = sqlite3.connect(str(path))
    assert DROPPED_DETAILS[0] not in raw.execute("SELECT details FROM reservations").fetchone()[0]
    raw.close()


def test_a_ledger_that_cannot_be_opened_on_a_full_disk_is_a_ledger_error_naming_it(small_fs):
    filler = fill(small_fs)
    with pytest.raises(LedgerError) as e:
        Ledger(small_fs / "new.db")
    assert f"cannot open ledger {small_fs / 'new.db'}" in str(e.value)
    os.unlink(filler)
    new_ledger(small_fs / "new.db").close()


class FailingWrite(FailingCommit):
    """The ledger's connection, except that the next write statement after ``arm`` fails as SQLITE_FULL or
    SQLITE_IOERR may fail one: SQLite rolls the whole transaction back itself and reports the error."""

    def _fail(self, sql: str) -> None:
        if self.armed is not None and sql.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE")) \
                and self._db.in_transaction:
            self.armed = None
            self._db.execute("ROLLBACK")
            raise sqlite3.OperationalError("database or disk is full")

    def execute(self, sql: str, *args):
        self._fail(sql)
        return self._db.execute(sql, *args)

    def executemany(self, sql: str, *args):
        self._fail(sql)
        return self._db.executemany(sql, *args)


@pytest.mark.parametrize("site", [s for s in SITES if s.name in ("reserve", "commit", "commit_many", "recommit")],
                         ids=lambda s: s.name)
def test_a_write_statement_that_fails_and_rolls_back_leaves_no_trace(tmp_path, site):
    # A statement's SQLITE_FULL may roll the transaction back before COMMIT is reached; the ledger's own
    # ROLLBACK then failed ("no transaction is active") and the booked cache kept the failed booking.
    path = tmp_path / "l.db"
    led = new_ledger(path)
    site.setup(led)
    before = snapshot(led)
    failing = FailingWrite(led._db)
    led._db = failing
    failing.armed = "rolled back"
    with pytest.raises(sqlite3.OperationalError, match="disk is full"):
        site.change(led)
    _check_no_trace_and_next_commit(led, path, site, before)


def test_a_change_at_open_whose_statement_fails_and_rolls_back_names_the_cause(tmp_path, monkeypatch):
    # The open's own rewrite (a details key nothing reads) met SQLITE_FULL in its UPDATE, which rolled the
    # transaction back: its ROLLBACK then failed and the open was refused for "no transaction is active".
    import hamid.ledger.store as store
    from hamid.ledger.store import DROPPED_DETAILS

    path = tmp_path / "l.db"
    led = new_ledger(path)
    _full(led)
    led.close()
    raw = sqlite3.connect(str(path))
    raw.execute("UPDATE reservations SET details=? WHERE owner='docker:a'",
                ('{"runc_root": "/x", "%s": {"0": 1}}' % DROPPED_DETAILS[0],))
    raw.commit()
    raw.close()
    real = sqlite3.connect

    def connect(*args, **kw):
        failing = FailingWrite(real(*args, **kw))
        failing.armed = "rolled back"
        return failing

    monkeypatch.setattr(store.sqlite3, "connect", connect)
    with pytest.raises(LedgerError) as e:
        Ledger(path)
    assert str(path) in str(e.value) and "disk is full" in str(e.value)


class FailingCommitAndRollback(FailingCommit):
    """A COMMIT that fails leaving the transaction open, and a ROLLBACK after it that fails too (an I/O error
    on the WAL): the connection is left inside the transaction."""

    def execute(self, sql: str, *args):
        if sql == "ROLLBACK" and self.armed == "rollback-too" and self._db.in_transaction:
            self.armed = None
            raise sqlite3.OperationalError("disk I/O error")
        if sql == "COMMIT" and self.armed == "rollback-too" and self._db.in_transaction:
            raise sqlite3.OperationalError("database is locked")
        return self._db.execute(sql, *args)


def test_a_commit_and_rollback_that_both_fail_leave_no_transaction_open_and_the_next_write_commits(tmp_path):
    path = tmp_path / "l.db"
    led = new_ledger(path)
    before = snapshot(led)
    failing = FailingCommitAndRollback(led._db)
    led._db = failing
    failing.armed = "rollback-too"
    with pytest.raises(LedgerError):
        led.reserve(req("a"), kind="docker", details=Details(runc_root="/x"))
    assert failing.armed is None, "no ROLLBACK was tried"
    assert snapshot(led) == before
    # the connection is not left in the failed transaction: the next write begins and commits
    led.reserve(req("b"), kind="docker", details=Details(runc_root="/x"))
    assert [r.owner for r in Ledger(path).list()] == ["docker:b"]
