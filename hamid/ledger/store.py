"""The SQLite store behind the ledger.

Tables: ``meta`` (node name, node settings, schema version), ``gpus`` (the
capacity of each GPU under the node's settings, written at start-up by whoever
read the devices) and ``reservations`` (one row per owner, keyed by its stable
identity ``<kind>:<uid>`` with its display name beside it: the request, the
committed decision, its state, MIG instances created for it, and details such
as the container's directory). Use is never stored: it is derived from the
reservations each time, so it cannot drift from them.

A reservation moves through checked states (:data:`TRANSITIONS`)::

    reserved -> allocated -> running -> releasing -> (row deleted: gone)

``releasing`` is entered by exactly one claimant (a process, named with its
start time so a recycled pid is not mistaken for it) that tears down what the
reservation holds (MIG instances, directories) and only then deletes the row:
until then the row keeps its GPUs booked, so nothing can be given a
placement whose old instance still exists. A claim whose process is gone is
taken over by the next release.
"""

from __future__ import annotations

import builtins

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import HamidError
from ..logs import get_logger
from ..placement import Decision, NodeView, check, place
from ..placement.result import NoFit
from ..placement.view import GpuView, gpu_view_from_dict, gpu_view_to_dict
from ..request.model import Request, RequestError
from .booked import Booked
from .details import Details

log = get_logger("ledger")

SCHEMA_VERSION = 2

STATES = ("reserved", "allocated", "running", "releasing")
TRANSITIONS: dict[str, frozenset[str]] = {
    "reserved": frozenset({"allocated", "releasing"}),  # MIG made and edits delivered; or given up
    "allocated": frozenset({"running", "releasing"}),  # the container started; or never did
    "running": frozenset({"releasing"}),
    "releasing": frozenset(),  # only ends by deleting the row
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS gpus (uuid TEXT PRIMARY KEY, idx INTEGER NOT NULL, capacity TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS reservations (
    owner TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    created REAL NOT NULL,
    request TEXT NOT NULL,
    decision TEXT NOT NULL,
    mig TEXT NOT NULL DEFAULT '{}',
    details TEXT NOT NULL DEFAULT '{}',
    name TEXT NOT NULL DEFAULT '',
    claim TEXT
);
-- the rows in one state (the kubelet face's pods still waiting on their devices), oldest first,
-- without reading every row (IF NOT EXISTS: a ledger of an earlier version gets it when opened)
CREATE INDEX IF NOT EXISTS reservations_by_state ON reservations(state, kind, created);
"""

# Keys of a row's details that earlier versions stored and nothing reads any more, removed from every
# row when a ledger opens: ``slots``, the time slots the limiter stopped using (issue 39). The schema
# number stays: an earlier hamid opening the ledger again reads a missing key as none.
DROPPED_DETAILS = ("slots",)

# Schema 1 -> 2: the owner's display name, the release claim, states renamed.
_MIGRATE_1_2 = """
ALTER TABLE reservations ADD COLUMN name TEXT NOT NULL DEFAULT '';
ALTER TABLE reservations ADD COLUMN claim TEXT;
UPDATE reservations SET state = 'running' WHERE state = 'active';
UPDATE meta SET value = '2' WHERE key = 'schema';
"""


class LedgerError(HamidError):
    """The ledger cannot do what was asked (bad file, missing inventory...)."""


class IllegalTransition(LedgerError):
    """A state change the lifecycle does not allow (e.g. releasing -> running)."""


class Abandoned(LedgerError):
    """The caller's deadline passed before the change could be committed: its
    caller has given up on the answer, so nothing is committed for it."""

    http_status = 410  # Gone: the answer's caller is


class CommitFailed(LedgerError):
    """SQLite could not COMMIT a change (disk full, I/O error, busy): nothing of it was kept."""


class LedgerConflict(LedgerError):
    """The reservation does not fit the node as the ledger knows it."""

    http_status = 409

    def __init__(self, message: str, reasons: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.reasons = tuple(reasons)


@dataclass(frozen=True)
class Reservation:
    owner: str  # the key: "<kind>:<uid>" (a pod's UID, a container's id)
    kind: str  # "docker" or "pod"
    state: str  # one of STATES
    created: float
    request: Request | None  # what the owner asked (None: a commit that came without one)
    decision: Decision
    mig: dict[str, dict[str, Any]] = field(default_factory=dict)  # gpu uuid -> {gi, ci, uuid, caps}
    details: Details = field(default_factory=Details)
    name: str = ""  # for display: "namespace/name" or the container's name

    @property
    def uid(self) -> str:
        return self.owner.partition(":")[2]

    def to_dict(self) -> dict[str, Any]:
        return {"owner": self.owner, "kind": self.kind, "name": self.name, "state": self.state,
                "created": self.created, "request": self.request.to_dict() if self.request else {},
                "decision": self.decision.to_dict(),
                "mig": self.mig, "details": self.details.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Reservation":
        return cls(owner=d["owner"], kind=d["kind"], state=d["state"], created=d["created"],
                   request=Request.from_dict(d["request"]) if d.get("request") else None,
                   decision=Decision.from_dict(d["decision"]),
                   mig=d.get("mig") or {}, details=Details.from_dict(d.get("details")), name=d.get("name") or "")


def _stored_request(owner: str, text: str) -> Request | None:
    """A row's request. Every request is checked before it is stored (the node service parses what a
    caller sends); a row an earlier version stored unchecked that does not parse is read as none, said
    in the log once per owner, rather than making the whole ledger unreadable."""
    d = json.loads(text)
    if not d:
        return None
    try:
        return Request.from_dict(d)
    except RequestError as e:
        if owner not in _UNREADABLE:
            _UNREADABLE.add(owner)
            log.warning("a stored request does not parse; read as none (the node's defaults apply to it)",
                        owner=owner, error=str(e))
        return None


_UNREADABLE: set[str] = set()


def _row(r: sqlite3.Row) -> Reservation:
    return Reservation(owner=r["owner"], kind=r["kind"], state=r["state"], created=r["created"],
                       request=_stored_request(r["owner"], r["request"]), decision=Decision.from_dict(json.loads(r["decision"])),
                       mig=json.loads(r["mig"]), details=Details.from_dict(json.loads(r["details"])), name=r["name"])


def claimant_id(pid: int | None = None) -> str:
    """This process as a release claimant: ``<pid>@<start time in ticks>``."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}@{_start_time(pid)}"


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return "gone"
    # the command name (field 2) may hold spaces and parentheses: split after its last ')'
    return stat.rsplit(b")", 1)[1].split()[19].decode()


def claimant_alive(claim: str) -> bool:
    pid, _, start = claim.partition("@")
    try:
        return _start_time(int(pid)) == start
    except ValueError:
        return False


def _check_deadline(deadline: float | None, what: str) -> None:
    if deadline is not None and time.time() > deadline:
        raise Abandoned(f"{what}: its caller's deadline passed {time.time() - deadline:.1f} s ago, so it was "
                        "not committed (the caller has given up waiting)")


class Ledger:
    """One node's ledger file. Safe to share between threads of one process
    and between processes (SQLite's locking does the cross-process part)."""

    def __init__(self, path: str | os.PathLike, *, busy_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
            self._busy_timeout_s = busy_timeout_s
            self._db = self._connect()
        except (OSError, sqlite3.Error) as e:
            raise LedgerError(f"cannot open ledger {self.path}: {e}") from None
        self._lock = threading.RLock()
        self._stamp_db: sqlite3.Connection | None = None  # change_stamp's own connection
        self._stamp_lock = threading.Lock()
        # The booked state as last read, so a commit does not parse every reservation again (issue 25:
        # 2.5-6x the cost of a commit on an empty node at 400 reservations). Valid while SQLite's
        # data_version on this connection is the one it was read at (it moves when any *other*
        # connection commits: another process, the runtime); this connection's own commits update it
        # row by row after COMMIT (``_touched``), and a rolled-back transaction changes nothing.
        self._cache_version: int | None = None
        self._cache: Booked | None = None
        self._touched: set[str] = set()
        self._in_write = False
        # list()'s rows as last read and decoded, by owner: (the stored columns, the Reservation). Decoding
        # is ~15 us a row (JSON and the decision's objects), reading one ~1 us: the daemon lists every
        # reservation once a second (the priority pass) and on other loops, beside kubelet's calls.
        self._listed: dict[str, tuple[tuple, Reservation]] = {}
        try:
            self._prepare(busy_timeout_s)
        except sqlite3.Error as e:  # a full disk, an I/O error, a file that is not a database
            self._db.close()
            raise LedgerError(f"cannot open ledger {self.path}: {e}") from None
        for suffix in ("-wal", "-shm"):
            try:
                os.chmod(str(self.path) + suffix, 0o600)
            except FileNotFoundError:
                pass

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(str(self.path), timeout=self._busy_timeout_s, isolation_level=None,
                             check_same_thread=False)
        db.row_factory = sqlite3.Row
        return db

    def _reconnect(self) -> None:
        """A new connection in place of one left inside a transaction SQLite would not roll back: closing it
        drops the transaction, as a crash would, so the next change does not meet it."""
        try:
            self._db.close()
        except sqlite3.Error:
            pass
        self._db = self._connect()
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_s * 1000)}")

    def _prepare(self, busy_timeout_s: float) -> None:
        """WAL mode, the schema, and what an earlier version's file needs changed."""
        with self._lock:
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise LedgerError(f"ledger {self.path}: cannot switch to WAL mode (got {mode})")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            self._db.executescript(_SCHEMA)
            self._db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            got = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0]
            if int(got) == 1:
                cols = {r[1] for r in self._db.execute("PRAGMA table_info(reservations)")}
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    if "name" not in cols:
                        for stmt in filter(str.strip, _MIGRATE_1_2.split(";")):
                            self._db.execute(stmt)
                    else:  # made by this schema's CREATE: only the version to set
                        self._db.execute("UPDATE meta SET value = '2' WHERE key = 'schema'")
                except BaseException:
                    self._rollback_if_open()
                    raise
                self._commit("upgrade to schema 2")
                got = SCHEMA_VERSION
            if int(got) > SCHEMA_VERSION:
                raise LedgerError(f"ledger {self.path} has schema {got}, newer than this hamid ({SCHEMA_VERSION})")
            self._drop_details_keys()

    def _drop_details_keys(self) -> None:
        """Remove :data:`DROPPED_DETAILS` from every row that still has one, in one transaction
        (a crash leaves every row as it was, and the next open does it again)."""
        rows = self._db.execute("SELECT owner, details FROM reservations WHERE "
                                + " OR ".join("details LIKE ?" for _ in DROPPED_DETAILS),
                                [f'%"{k}"%' for k in DROPPED_DETAILS]).fetchall()
        changed = []
        for owner, text in rows:
            d = json.loads(text)
            if isinstance(d, dict) and any(k in d for k in DROPPED_DETAILS):
                changed.append((json.dumps({k: v for k, v in d.items() if k not in DROPPED_DETAILS}), owner))
        if not changed:
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany("UPDATE reservations SET details=? WHERE owner=?", changed)
        except BaseException:
            self._rollback_if_open()
            raise
        self._commit("removal of keys earlier versions stored")
        log.info("removed keys earlier versions stored and nothing reads", ledger=str(self.path),
                 keys=list(DROPPED_DETAILS), rows=len(changed))

    def close(self) -> None:
        with self._lock:
            self._db.close()
        with self._stamp_lock:
            if self._stamp_db is not None:
                self._stamp_db.close()
                self._stamp_db = None

    def change_stamp(self) -> int | None:
        """A number that changes whenever anyone commits to the ledger: this
        object, another connection, another process (SQLite's ``data_version``
        as seen by a connection of its own, which never writes). None when it
        cannot be read at once; treat that as a change. It never waits on a
        lock, so an event loop may call it where a full read would need a
        worker thread."""
        if not self._stamp_lock.acquire(blocking=False):
            return None
        try:
            if self._stamp_db is None:
                self._stamp_db = sqlite3.connect(str(self.path), timeout=0, isolation_level=None,
                                                 check_same_thread=False)
            return self._stamp_db.execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error:
            return None
        finally:
            self._stamp_lock.release()

    # --- transactions ------------------------------------------------------

    def _write(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``fn`` inside one immediate (write-locked) transaction."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._touched = set()
            self._in_write = True
            try:
                out = fn(self._db)
            except BaseException:
                if self._touched:  # the cache saw this transaction's inserts: read it again next time
                    self._cache, self._cache_version = None, None
                self._touched = set()
                self._rollback_if_open()
                raise
            finally:
                self._in_write = False
            self._commit("change")
            try:
                self._refresh_touched()
            except sqlite3.Error:  # committed, but its rows could not be read back: the cache is read anew
                self._cache, self._cache_version, self._touched = None, None, set()
            return out

    def _rollback_if_open(self) -> None:
        """ROLLBACK the transaction a statement failed in. SQLite may have rolled it back itself (a
        statement's SQLITE_FULL or SQLITE_IOERR): a ROLLBACK then fails ("no transaction is active") and
        its error would hide the one that matters."""
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def _commit(self, what: str) -> None:
        """COMMIT the open transaction. When SQLite cannot (disk full, I/O error,
        busy), nothing of it is on disk, so nothing of it stays in memory either:
        the transaction is rolled back if SQLite left it open (a busy COMMIT does),
        the booked cache is dropped (this transaction's bookings were put in it as
        they were made) and the next change starts from what is on disk."""
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error as e:
            self._cache, self._cache_version, self._touched = None, None, set()
            try:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
            except sqlite3.Error as e2:
                self._reconnect()
                raise CommitFailed(f"ledger {self.path}: the {what} could not be committed ({e}) nor rolled "
                                   f"back ({e2}): nothing of it was kept") from e
            raise CommitFailed(f"ledger {self.path}: the {what} could not be committed ({e}): nothing of it was "
                               "kept; it may be asked again once the cause (a full disk, an I/O error, another "
                               "writer holding the file) is gone") from e

    def _end_read(self) -> None:
        """End a read-only transaction: it wrote nothing, so ROLLBACK ends it as well as
        COMMIT would and, unlike COMMIT, cannot leave it open (a busy COMMIT does)."""
        self._db.execute("ROLLBACK")

    # --- the booked state, cached ---------------------------------------------

    def _booked(self, db: sqlite3.Connection) -> Booked:
        """The node's booked state as of this transaction (:class:`Booked`): the
        cache while no other connection committed since it was read. It is
        (re)filled only inside a write transaction (:meth:`_write`), where no
        other connection can commit between reading ``data_version`` and the
        rows; a read-only transaction that finds it stale reads the rows for
        itself and leaves the cache alone."""
        version = db.execute("PRAGMA data_version").fetchone()[0]
        if version == self._cache_version and self._cache is not None:
            return self._cache
        node = self._meta(db, "node")
        if node is None:
            raise LedgerError(f"ledger {self.path} has no inventory yet: start the daemon (hamid run) once")
        cap = [gpu_view_from_dict(json.loads(r[0])) for r in db.execute("SELECT capacity FROM gpus ORDER BY idx")]
        booked = Booked(node, cap, self._meta(db, "gpu_policy") or "spread")
        for r in db.execute("SELECT owner, decision FROM reservations"):
            booked.put(r[0], Decision.from_dict(json.loads(r[1])))
        if self._in_write:
            self._cache, self._cache_version = booked, version
        return booked

    def _refresh_touched(self) -> None:
        """After this connection's COMMIT: re-read the rows it changed (a few)."""
        if self._cache is None or not self._touched:
            self._touched = set()
            return
        for owner in self._touched:
            r = self._db.execute("SELECT decision FROM reservations WHERE owner=?", (owner,)).fetchone()
            if r is None:
                self._cache.remove(owner)
            else:
                self._cache.put(owner, Decision.from_dict(json.loads(r[0])))
        self._touched = set()

    # --- inventory ---------------------------------------------------------

    def set_inventory(self, node: str, gpus: Iterable[GpuView], gpu_policy: str = "spread") -> None:
        """Record the node's name and each GPU's capacity (replacing the old)."""
        gpus = list(gpus)

        def tx(db: sqlite3.Connection) -> None:
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('node', ?)", (node,))
            db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('gpu_policy', ?)", (gpu_policy,))
            db.execute("DELETE FROM gpus")
            db.executemany("INSERT INTO gpus(uuid, idx, capacity) VALUES (?, ?, ?)",
                           [(g.uuid, g.index, json.dumps(gpu_view_to_dict(g))) for g in gpus])
            self._cache, self._cache_version = None, None  # new capacity: the running sums start again

        self._write(tx)

    def _meta(self, db: sqlite3.Connection, key: str) -> str | None:
        r = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return r[0] if r else None

    def _view(self, db: sqlite3.Connection, without: str | None = None) -> NodeView:
        return self._booked(db).view(without)

    def view(self) -> NodeView:
        """The node's GPUs with what is booked on them now."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                return self._view(self._db)
            finally:
                self._end_read()

    def view_without(self, owner: str) -> NodeView:
        """The node as if ``owner`` held nothing (to place it again)."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                return self._view(self._db, without=owner)
            finally:
                self._end_read()

    # --- reservations ------------------------------------------------------

    def _existing(self, db: sqlite3.Connection, owner: str) -> Reservation | None:
        r = db.execute("SELECT * FROM reservations WHERE owner=?", (owner,)).fetchone()
        return _row(r) if r else None

    def _written(self, db: sqlite3.Connection, owner: str) -> Reservation:
        """The row this transaction just wrote, as stored (so every caller sees one shape)."""
        got = self._existing(db, owner)
        if got is None:
            raise LedgerError(f"{owner}: the row just written is not in the ledger")
        return got

    def _insert(self, db: sqlite3.Connection, owner: str, kind: str, request: Request | None, decision: Decision,
                details: Details, name: str) -> Reservation:
        booked = self._booked(db)
        self._touched.add(owner)
        booked.put(owner, decision)  # at once: the rest of this transaction sees it (a batch)
        db.execute("INSERT INTO reservations(owner, kind, state, created, request, decision, mig, details, name) "
                   "VALUES (?, ?, 'reserved', ?, ?, ?, '{}', ?, ?)",
                   (owner, kind, time.time(), json.dumps(request.to_dict() if request else {}),
                    json.dumps(decision.to_dict()),
                    json.dumps(details.to_dict()), name))
        return self._written(db, owner)

    @staticmethod
    def _key(owner: Any, kind: str | None) -> tuple[str, str, str]:
        """(key, kind, name) from an ``Owner`` or a ``<kind>:<uid>`` string."""
        if isinstance(owner, str):
            k, sep, uid = owner.partition(":")
            if not sep or not uid:
                raise LedgerError(f"owner {owner!r}: expected <kind>:<uid>")
            if kind is not None and k != kind:
                raise LedgerError(f"owner {owner!r} is not of kind {kind!r}")
            return owner, k, ""
        return owner.key, owner.kind, owner.name

    def reserve(self, request: Request, *, kind: str | None = None, owner: Any = None,
                node_policy: str = "binpack", details: Details | None = None,
                deadline: float | None = None,
                prepare: Callable[[Reservation], bool] | None = None) -> Reservation:
        """Place ``request`` on this node and commit it, in one transaction.

        ``owner`` (a :class:`hamid.node.identity.Owner`) keys the reservation;
        without one, ``request.owner`` (``<kind>:<uid>``) does. Idempotent per
        owner: asking again returns the existing reservation. A ``deadline``
        (wall-clock seconds) that has passed commits nothing (:class:`Abandoned`).
        ``prepare(reservation)``: called inside the transaction for a new
        reservation; True (it made what the containers need) commits it as
        ``allocated`` at once, False as ``reserved``; raising commits nothing
        (one transaction for an admission instead of two: :meth:`allocate`).
        """
        key, kind, name = self._key(owner if owner is not None else request.owner, kind)

        def tx(db: sqlite3.Connection) -> Reservation:
            _check_deadline(deadline, f"reservation for {key}")
            existing = self._existing(db, key)
            if existing is not None:
                return existing
            view = self._view(db)
            got = place(request, [view], node_policy)
            if isinstance(got, NoFit):
                reasons = got.reasons.get(view.name, ())
                raise LedgerConflict(f"{key} does not fit on {view.name}:\n" + got.message(), reasons)
            res = self._insert(db, key, kind, request, got, details or Details(), name)
            if prepare is not None and prepare(res):
                db.execute("UPDATE reservations SET state='allocated' WHERE owner=?", (key,))
                res = replace(res, state="allocated")
            return res

        return self._write(tx)

    def allocate(self, owner: str, prepare: Callable[[Reservation], bool], *, details: Details | None = None,
                 deadline: float | None = None) -> Reservation:
        """In one transaction: record ``details`` on a ``reserved`` reservation, call
        ``prepare`` with it as recorded, and move it to ``allocated`` if ``prepare`` says
        True. A reservation past ``reserved`` is returned as it is (``prepare`` not called).
        A ``deadline`` that has passed commits nothing (:class:`Abandoned`), as does
        ``prepare`` raising. ``prepare`` runs while the ledger's write lock is held: it may
        write files, never wait on anything slow (MIG, MPS daemons: the caller's two-step path)."""

        def tx(db: sqlite3.Connection) -> Reservation:
            _check_deadline(deadline, f"allocated for {owner}")
            existing = self._existing(db, owner)
            if existing is None:
                raise LedgerError(f"no reservation for {owner}")
            if existing.state != "reserved":
                return existing
            res = existing
            if details is not None:
                res = replace(existing, details=existing.details.merged(details))
            to = "allocated" if prepare(res) else "reserved"
            db.execute("UPDATE reservations SET state=?, details=? WHERE owner=?",
                       (to, json.dumps(res.details.to_dict()), owner))
            return replace(res, state=to)

        return self._write(tx)

    def commit(self, owner: Any, decision: Decision, *, kind: str | None = None, request: Request | None = None,
               details: Details | None = None, deadline: float | None = None) -> Reservation:
        """Commit a decision someone else proposed, after re-checking it here."""
        key, kind, name = self._key(owner, kind)

        def tx(db: sqlite3.Connection) -> Reservation:
            _check_deadline(deadline, f"commit for {key}")
            return self._commit_one(db, key, kind, name, decision, request, details)

        return self._write(tx)

    def commit_many(self, items: Iterable[tuple[Any, Decision, Request | None, Details | None]], *,
                    deadline: float | None = None) -> list[Reservation | LedgerConflict]:
        """Commit several proposed decisions ``(owner, decision, request, details)`` in ONE
        transaction (one fsync of the journal for all of them), each re-checked as :meth:`commit`
        checks one, in order, against the node with the ones before it booked. Each gets its own
        verdict, in the same order: the reservation, or the :class:`LedgerConflict` that refused
        it (a refused one does not refuse the others). Idempotent per owner, as :meth:`commit`. A
        passed ``deadline`` commits none of them (:class:`Abandoned`)."""
        keyed = [(self._key(owner, None), decision, request, details) for owner, decision, request, details in items]

        def tx(db: sqlite3.Connection) -> list[Reservation | LedgerConflict]:
            _check_deadline(deadline, f"commit of {len(keyed)} placements")
            out: list[Reservation | LedgerConflict] = []
            for (key, kind, name), decision, request, details in keyed:
                try:
                    out.append(self._commit_one(db, key, kind, name, decision, request, details))
                except LedgerConflict as e:
                    out.append(e)
            return out

        return self._write(tx)

    def _commit_one(self, db: sqlite3.Connection, key: str, kind: str, name: str, decision: Decision,
                    request: Request | None, details: Details | None) -> Reservation:
        existing = self._existing(db, key)
        if existing is not None:
            if existing.decision == decision:
                return existing
            raise LedgerConflict(f"{key} already holds a different reservation on this node")
        view = self._view(db)
        if decision.node != view.name:
            raise LedgerConflict(f"decision is for node {decision.node}, this ledger is {view.name}")
        problems = check(decision, view, request=request, claim=kind == "claim")
        if problems:
            raise LedgerConflict(f"{key} does not fit on {view.name}: " + "; ".join(problems), problems)
        return self._insert(db, key, kind, request, decision, details or Details(), name)

    def recommit(self, owner: str, decision: Decision, *, details: Details | None = None) -> Reservation:
        """Replace ``owner``'s decision with ``decision``, re-checked against
        everything else on the node in one transaction; refused while MIG instances exist for it or once it is
        being released."""

        def tx(db: sqlite3.Connection) -> Reservation:
            existing = self._existing(db, owner)
            if existing is None:
                raise LedgerError(f"no reservation for {owner}")
            if existing.decision == decision:
                return existing
            if existing.state == "releasing" or existing.mig:
                raise LedgerConflict(f"{owner} cannot move: it is {existing.state}"
                                     + (" with MIG instances made for it" if existing.mig else ""))
            view = self._view(db, without=owner)
            if decision.node != view.name:
                raise LedgerConflict(f"decision is for node {decision.node}, this ledger is {view.name}")
            problems = check(decision, view, request=existing.request, claim=existing.kind == "claim")
            if problems:
                raise LedgerConflict(f"{owner} cannot move on {view.name}: " + "; ".join(problems), problems)
            self._touched.add(owner)
            new_details = existing.details.merged(details)
            db.execute("UPDATE reservations SET decision=?, details=? WHERE owner=?",
                       (json.dumps(decision.to_dict()), json.dumps(new_details.to_dict()), owner))
            return self._written(db, owner)

        return self._write(tx)

    def release(self, owner: str) -> Reservation | None:
        """Delete a reservation that holds nothing to tear down. Idempotent:
        ``None`` when there was none. Anything with MIG instances or
        directories goes through :meth:`begin_release` / :meth:`finish_release`."""

        def tx(db: sqlite3.Connection) -> Reservation | None:
            existing = self._existing(db, owner)
            if existing is not None:
                db.execute("DELETE FROM reservations WHERE owner=?", (owner,))
                self._touched.add(owner)
            return existing

        return self._write(tx)

    def begin_release(self, owner: str, claimant: str) -> tuple[Reservation | None, bool]:
        """Move ``owner`` to ``releasing`` under ``claimant``'s claim.

        Returns (the reservation, whether this claimant now holds the claim).
        (None, False) when there is no reservation; (r, False) when another
        live claimant is tearing it down already.
        """

        def tx(db: sqlite3.Connection) -> tuple[Reservation | None, bool]:
            row = db.execute("SELECT claim FROM reservations WHERE owner=?", (owner,)).fetchone()
            if row is None:
                return None, False
            claim = row[0]
            if claim and claim != claimant and claimant_alive(claim):
                return self._existing(db, owner), False
            db.execute("UPDATE reservations SET state='releasing', claim=? WHERE owner=?", (claimant, owner))
            return self._existing(db, owner), True

        return self._write(tx)

    def finish_release(self, owner: str, claimant: str) -> bool:
        """Delete the row if ``claimant`` still holds its release claim."""

        def tx(db: sqlite3.Connection) -> bool:
            cur = db.execute("DELETE FROM reservations WHERE owner=? AND state='releasing' AND claim=?",
                             (owner, claimant))
            self._touched.add(owner)
            return cur.rowcount > 0

        return self._write(tx)

    def transition(self, owner: str, to: str, *, mig: dict | None = None, details: Details | None = None,
                   deadline: float | None = None) -> Reservation:
        """Move a reservation to state ``to`` (checked against :data:`TRANSITIONS`;
        staying in the same state is allowed and only records ``mig``/``details``)."""
        if to not in STATES or to == "releasing":
            raise LedgerError(f"state {to!r}: accepted: reserved, allocated, running (releasing: begin_release)")

        def tx(db: sqlite3.Connection) -> Reservation:
            _check_deadline(deadline, f"{to} for {owner}")
            existing = self._existing(db, owner)
            if existing is None:
                raise LedgerError(f"no reservation for {owner}")
            if to != existing.state and to not in TRANSITIONS[existing.state]:
                raise IllegalTransition(f"{owner}: {existing.state} -> {to} is not allowed; from "
                                        f"{existing.state}: {', '.join(sorted(TRANSITIONS[existing.state])) or 'none'}")
            new_mig = {**existing.mig, **(mig or {})}
            new_details = existing.details.merged(details)
            db.execute("UPDATE reservations SET state=?, mig=?, details=? WHERE owner=?",
                       (to, json.dumps(new_mig), json.dumps(new_details.to_dict()), owner))
            return self._written(db, owner)

        return self._write(tx)

    def update(self, owner: str, *, mig: dict | None = None, details: Details | None = None) -> Reservation:
        """Record progress on a reservation (MIG instances made, details), state unchanged."""
        existing = self.get(owner)
        if existing is None:
            raise LedgerError(f"no reservation for {owner}")
        return self.transition(owner, existing.state, mig=mig, details=details) \
            if existing.state != "releasing" else existing

    def get(self, owner: str) -> Reservation | None:
        with self._lock:
            return self._existing(self._db, owner)

    def list(self) -> list[Reservation]:
        """Every reservation, oldest first. A row whose stored columns are what they were at the last
        list is not decoded again: its :class:`Reservation` (frozen, never changed by a reader) is
        handed out again. The columns are compared, not a version, so a change by anyone (this
        object, another connection, another process) is decoded as it is."""
        with self._lock:
            last, seen, out = self._listed, {}, []
            for r in self._db.execute("SELECT * FROM reservations ORDER BY created"):
                raw = tuple(r)
                hit = last.get(r["owner"])
                res = hit[1] if hit is not None and hit[0] == raw else _row(r)
                seen[r["owner"]] = (raw, res)
                out.append(res)
            self._listed = seen  # only the rows there now: a deleted one is dropped with it
            return out

    def in_state(self, state: str, kind: str | None = None) -> builtins.list[Reservation]:
        """The reservations in ``state`` (and of ``kind``, if given), oldest first: found through an
        index and only those rows decoded, so asking costs what they are, not the whole ledger."""
        if state not in STATES:
            raise LedgerError(f"state {state!r}: accepted: {', '.join(STATES)}")
        sql, args = "SELECT * FROM reservations WHERE state=?", [state]
        if kind is not None:
            sql, args = sql + " AND kind=?", [state, kind]
        with self._lock:
            return [_row(r) for r in self._db.execute(sql + " ORDER BY created", args)]

    def stale(self, alive: Callable[[Reservation], bool], claimant: str) -> builtins.list[Reservation]:
        """The reservations whose owner ``alive`` says is gone (asked outside any
        transaction), plus those left ``releasing`` by ``claimant`` itself (a
        teardown that failed) or by a claimant that died: what a reconciler
        must release."""
        out = []
        for r in self.list():
            if r.state == "releasing":
                claim = self._claim(r.owner)
                if claim is None or claim == claimant or not claimant_alive(claim):
                    out.append(r)
            elif not alive(r):
                out.append(r)
        return out

    def _claim(self, owner: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT claim FROM reservations WHERE owner=?", (owner,)).fetchone()
            return row[0] if row else None
