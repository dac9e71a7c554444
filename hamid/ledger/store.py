"""The SQLite store behind the ledger.

Tables: ``meta`` (node name, node settings, schema version), ``gpus`` (the
capacity of each GPU under the node's settings, written at start-up by whoever
read the devices) and ``reservations`` (one row per owner: the request, the
committed decision, MIG instances created for it, and free-form details such
as the container's directory). Use is never stored: it is derived from the
reservations each time, so it cannot drift from them.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import HamidError
from ..placement import Decision, NodeView, check, place, timeslots
from ..placement.result import NoFit
from ..placement.usage import with_usage
from ..placement.view import GpuView, gpu_view_from_dict, gpu_view_to_dict
from ..request.model import Request

SCHEMA_VERSION = 1

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
    details TEXT NOT NULL DEFAULT '{}'
);
"""


class LedgerError(HamidError):
    """The ledger cannot do what was asked (bad file, missing inventory...)."""


class LedgerConflict(LedgerError):
    """The reservation does not fit the node as the ledger knows it."""

    def __init__(self, message: str, reasons: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.reasons = tuple(reasons)


@dataclass(frozen=True)
class Reservation:
    owner: str
    kind: str  # "docker" or "pod"
    state: str  # "reserved" or "active"
    created: float
    request: dict[str, Any]
    decision: Decision
    mig: dict[str, dict[str, Any]] = field(default_factory=dict)  # gpu uuid -> {gi, ci, uuid}
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"owner": self.owner, "kind": self.kind, "state": self.state, "created": self.created,
                "request": self.request, "decision": self.decision.to_dict(), "mig": self.mig,
                "details": self.details}


def _row(r: sqlite3.Row) -> Reservation:
    return Reservation(owner=r["owner"], kind=r["kind"], state=r["state"], created=r["created"],
                       request=json.loads(r["request"]), decision=Decision.from_dict(json.loads(r["decision"])),
                       mig=json.loads(r["mig"]), details=json.loads(r["details"]))


class Ledger:
    """One node's ledger file. Safe to share between threads of one process
    and between processes (SQLite's locking does the cross-process part)."""

    def __init__(self, path: str | os.PathLike, *, busy_timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
            self._db = sqlite3.connect(str(self.path), timeout=busy_timeout_s, isolation_level=None,
                                       check_same_thread=False)
        except (OSError, sqlite3.Error) as e:
            raise LedgerError(f"cannot open ledger {self.path}: {e}") from None
        self._db.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        self._stamp_db: sqlite3.Connection | None = None  # change_stamp's own connection
        self._stamp_lock = threading.Lock()
        with self._lock:
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise LedgerError(f"ledger {self.path}: cannot switch to WAL mode (got {mode})")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            self._db.executescript(_SCHEMA)
            self._db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            got = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0]
            if int(got) > SCHEMA_VERSION:
                raise LedgerError(f"ledger {self.path} has schema {got}, newer than this hamid ({SCHEMA_VERSION})")
        for suffix in ("-wal", "-shm"):
            try:
                os.chmod(str(self.path) + suffix, 0o600)
            except FileNotFoundError:
                pass

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
            try:
                out = fn(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return out

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

        self._write(tx)

    def _meta(self, db: sqlite3.Connection, key: str) -> str | None:
        r = db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return r[0] if r else None

    def _view(self, db: sqlite3.Connection) -> NodeView:
        node = self._meta(db, "node")
        if node is None:
            raise LedgerError(f"ledger {self.path} has no inventory yet: start the daemon (hamid run) once")
        cap = [gpu_view_from_dict(json.loads(r[0])) for r in db.execute("SELECT capacity FROM gpus ORDER BY idx")]
        decisions = [Decision.from_dict(json.loads(r[0])) for r in db.execute("SELECT decision FROM reservations")]
        return with_usage(node, cap, decisions, self._meta(db, "gpu_policy") or "spread")

    def view(self) -> NodeView:
        """The node's GPUs with what is booked on them now."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                return self._view(self._db)
            finally:
                self._db.execute("COMMIT")

    def has_inventory(self) -> bool:
        with self._lock:
            return self._meta(self._db, "node") is not None

    # --- reservations ------------------------------------------------------

    def _existing(self, db: sqlite3.Connection, owner: str) -> Reservation | None:
        r = db.execute("SELECT * FROM reservations WHERE owner=?", (owner,)).fetchone()
        return _row(r) if r else None

    def _insert(self, db: sqlite3.Connection, owner: str, kind: str, request: dict, decision: Decision,
                details: dict) -> Reservation:
        others = (json.loads(r[0]).get("slots", {}) for r in db.execute("SELECT details FROM reservations"))
        details = dict(details)
        slots = timeslots.assign(decision, others)
        if slots:
            details["slots"] = slots
        res = Reservation(owner=owner, kind=kind, state="reserved", created=time.time(), request=request,
                          decision=decision, details=details)
        db.execute("INSERT INTO reservations(owner, kind, state, created, request, decision, mig, details) "
                   "VALUES (?, ?, ?, ?, ?, ?, '{}', ?)",
                   (owner, kind, res.state, res.created, json.dumps(request), json.dumps(decision.to_dict()),
                    json.dumps(res.details)))
        return self._existing(db, owner)  # as stored, so every caller sees one shape

    def reserve(self, request: Request, *, kind: str, node_policy: str = "binpack",
                details: dict | None = None) -> Reservation:
        """Place ``request`` on this node and commit it, in one transaction.

        Idempotent per owner: asking again returns the existing reservation.
        """

        def tx(db: sqlite3.Connection) -> Reservation:
            existing = self._existing(db, request.owner)
            if existing is not None:
                return existing
            view = self._view(db)
            got = place(request, [view], node_policy)
            if isinstance(got, NoFit):
                reasons = got.reasons.get(view.name, ())
                raise LedgerConflict(f"{request.owner} does not fit on {view.name}:\n" + got.message(), reasons)
            return self._insert(db, request.owner, kind, request.to_dict(), got, details or {})

        return self._write(tx)

    def commit(self, owner: str, decision: Decision, *, kind: str, request: dict | None = None,
               details: dict | None = None) -> Reservation:
        """Commit a decision someone else proposed, after re-checking it here."""

        def tx(db: sqlite3.Connection) -> Reservation:
            existing = self._existing(db, owner)
            if existing is not None:
                if existing.decision == decision:
                    return existing
                raise LedgerConflict(f"{owner} already holds a different reservation on this node")
            view = self._view(db)
            if decision.node != view.name:
                raise LedgerConflict(f"decision is for node {decision.node}, this ledger is {view.name}")
            problems = check(decision, view)
            if problems:
                raise LedgerConflict(f"{owner} does not fit on {view.name}: " + "; ".join(problems), problems)
            return self._insert(db, owner, kind, request or {}, decision, details or {})

        return self._write(tx)

    def release(self, owner: str) -> Reservation | None:
        """Remove a reservation. Idempotent: ``None`` when there was none."""

        def tx(db: sqlite3.Connection) -> Reservation | None:
            existing = self._existing(db, owner)
            if existing is not None:
                db.execute("DELETE FROM reservations WHERE owner=?", (owner,))
            return existing

        return self._write(tx)

    def update(self, owner: str, *, state: str | None = None, mig: dict | None = None,
               details: dict | None = None) -> Reservation:
        """Record progress on a reservation (state, created MIG instances, details)."""

        def tx(db: sqlite3.Connection) -> Reservation:
            existing = self._existing(db, owner)
            if existing is None:
                raise LedgerError(f"no reservation for {owner}")
            new_mig = {**existing.mig, **(mig or {})}
            new_details = {**existing.details, **(details or {})}
            db.execute("UPDATE reservations SET state=?, mig=?, details=? WHERE owner=?",
                       (state or existing.state, json.dumps(new_mig), json.dumps(new_details), owner))
            return self._existing(db, owner)

        return self._write(tx)

    def get(self, owner: str) -> Reservation | None:
        with self._lock:
            return self._existing(self._db, owner)

    def list(self) -> list[Reservation]:
        with self._lock:
            return [_row(r) for r in self._db.execute("SELECT * FROM reservations ORDER BY created")]

    def reconcile(self, alive: Callable[[Reservation], bool]) -> list[Reservation]:
        """Release every reservation whose owner ``alive`` says is gone.

        Returns what was released, so the caller can destroy MIG instances and
        directories that belonged to it. ``alive`` is asked outside the write
        transaction; each release is its own idempotent transaction.
        """
        gone = [r for r in self.list() if not alive(r)]
        out = []
        for r in gone:
            released = self.release(r.owner)
            if released is not None:
                out.append(released)
        return out
