"""Holding a container that runs kernels outside the shim to its compute limit.

Owns the one lever the daemon has over a process that takes no limits from
inside: stopping it. The live pass finds a container with a compute limit
whose processes NVML shows busy while its region charges nothing (reason
``uncharged``: no shim in its processes, or a region it froze); nothing inside
such a container limits it. The guard keeps, per such container and GPU, an
account of the GPU time its processes used (NVML's per-process samples of the
host pids the host's pid map gives it: nothing the container writes) against
its limit, and while the account is over, stops those processes (SIGSTOP,
through a pidfd) until the next pass; under again, it continues them.

A GPU queues a process's launches, so a stopped process's kernels run on for
up to a queue's length: the account, not the stop, holds the mean. Its
credit is bounded (CREDIT_S): a bypassing container that waited cannot burst
for long. Beside other busy processes NVML reads each busy one at about the
device's busy share, so the account over-reads and a bypassing container gets
less than its limit there, never more; honest neighbours are never touched.

Stopped processes are recorded (pid and start time, before the stop) in a
file, so that a daemon that dies with processes stopped continues them when
it starts again (``Signals.recover``), and a pid the kernel handed to another
process since is left alone.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from hamid.logs import get_logger

log = get_logger("shimlimits")

# Credit banked while under the limit, in seconds of the limit's share: one second, so that a bypassing
# container idle for a minute does not then run free for many seconds.
CREDIT_S = 1.0
# Debt kept at most (GPU seconds over the limit): a reading that over-read for a while (beside busy
# neighbours) stops the container for at most this many seconds' worth after it.
DEBT_MAX_S = 5.0
# A stop lasts until the next pass; passes come every second. With none for this long (NVML not answering,
# the pass stuck), every stopped container is continued: a stuck daemon must not keep a tenant stopped.
STALE_S = 5.0

Key = tuple[str, int]  # (limits file, device index): one container on one GPU


class Stopper(Protocol):
    """What stops and continues a container's processes (Signals; a test's recorder)."""

    def stop(self, key: Key, pids: Iterable[int]) -> None: ...

    def resume(self, key: Key) -> None: ...


@dataclass(frozen=True)
class Use:
    """One bypassing container on one GPU in one pass."""

    key: Key
    limit_pct: int  # its compute limit there (1..99)
    applies: bool  # whether its limit applies now (policy force, or default with another container active)
    pids: tuple[int, ...]  # its host pids on the GPU (the host's pid map)
    busy_pct: float | None  # NVML's share of the GPU its pids used over the pass; None: not known


@dataclass
class BypassGuard:
    """Per bypassing container: its account (GPU seconds over its limit; negative: credit) and whether its
    processes are stopped."""

    stopper: Stopper
    _debt: dict[Key, float] = field(default_factory=dict)
    _at: dict[Key, float] = field(default_factory=dict)  # monotonic s of its last pass
    stopped: set[Key] = field(default_factory=set)
    stops: int = 0  # passes that stopped a container, since start (for /metrics)
    _told: set[Key] = field(default_factory=set)
    ran_at: float | None = None  # monotonic s of the last pass
    # the pass runs in a worker thread, the watchdog (resume_if_stale) in the daemon's own
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self, now: float, uses: Iterable[Use]) -> None:
        """One pass at monotonic ``now`` over the bypassing containers; a container not among ``uses`` is
        continued and forgotten."""
        with self._lock:
            self._run(now, uses)
            self.ran_at = now

    def resume_if_stale(self, now: float, stale_s: float = STALE_S) -> bool:
        """Continues every stopped container when no pass ran for ``stale_s`` (monotonic ``now``); returns
        whether it did."""
        with self._lock:
            if not self.stopped or self.ran_at is None or now - self.ran_at <= stale_s:
                return False
            log.warning("no live pass for a while: every stopped container continued", since_s=round(now - self.ran_at, 1),
                        containers=len(self.stopped))
            for key in list(self.stopped):
                self._resume(key)
            return True

    def _run(self, now: float, uses: Iterable[Use]) -> None:
        seen = set()
        for u in uses:
            seen.add(u.key)
            was = self._at.get(u.key)
            self._at[u.key] = now
            debt = self._debt.get(u.key, 0.0)
            if was is not None and now > was and u.busy_pct is not None:
                allowed = u.limit_pct if u.applies else 100.0
                debt += (min(100.0, u.busy_pct) - allowed) / 100.0 * (now - was)
                debt = max(-CREDIT_S * u.limit_pct / 100.0, min(DEBT_MAX_S, debt))
            self._debt[u.key] = debt
            if debt > 0 and u.pids and u.busy_pct is not None:
                if u.key not in self._told:  # once while it is held: it is stopped every few seconds
                    self._told.add(u.key)
                    log.warning("bypassing container over its compute limit: its processes are stopped while "
                                "over it",
                             limits=u.key[0], device=u.key[1], pids=list(u.pids), limit_pct=u.limit_pct,
                             busy_pct=round(u.busy_pct, 1), over_s=round(debt, 2))
                self.stopper.stop(u.key, u.pids)
                self.stopped.add(u.key)
                self.stops += 1
            elif u.key in self.stopped:
                self._resume(u.key)
        for key in [k for k in self._at if k not in seen]:
            if key in self.stopped:
                self._resume(key)
            self._at.pop(key, None)
            self._debt.pop(key, None)
            self._told.discard(key)

    def resume_all(self) -> None:
        """Continues every stopped container (the pass failed, or the daemon stops)."""
        with self._lock:
            for key in list(self.stopped):
                self._resume(key)

    def _resume(self, key: Key) -> None:
        self.stopper.resume(key)
        self.stopped.discard(key)


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, /proc/<pid>/stat field 22), or None if gone: with the
    pid, what names one process over time (a pid is handed out again; a start time with it is not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": comm may hold spaces and parentheses
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


class Signals:
    """Stops and continues processes with SIGSTOP and SIGCONT through pidfds, each process checked to be the
    container's (``owns``: the host's pid map) after its pidfd is open, so that a pid handed to another
    process since the pass read the map is never signalled. ``record``: the file listing the stopped
    processes (pid -> start time), written before each stop."""

    def __init__(self, record: str | os.PathLike, owns) -> None:
        self.record = Path(record)
        self._owns = owns  # (key, pid) -> whether the process is that container's now
        self._fds: dict[Key, dict[int, tuple[int, int]]] = {}  # key -> pid -> (pidfd, start time)

    def stop(self, key: Key, pids: Iterable[int]) -> None:
        held = self._fds.setdefault(key, {})
        new: dict[int, tuple[int, int]] = {}
        for pid in pids:
            if pid in held:
                continue
            try:
                fd = os.pidfd_open(pid)
            except OSError:  # gone
                continue
            started = start_time(pid)
            if started is None or not self._owns(key, pid):
                os.close(fd)
                continue
            new[pid] = (fd, started)
        if not new:
            return
        held.update(new)
        self._save()  # before the stop: a daemon that dies after it must find what to continue
        for fd, _ in new.values():
            try:
                signal.pidfd_send_signal(fd, signal.SIGSTOP)
            except OSError:  # exited since
                pass

    def resume(self, key: Key) -> None:
        for fd, _ in self._fds.pop(key, {}).values():
            try:
                signal.pidfd_send_signal(fd, signal.SIGCONT)
            except OSError:
                pass
            finally:
                os.close(fd)
        self._save()

    def recover(self) -> int:
        """Continues the processes a previous daemon recorded as stopped that still run (the same pid and
        start time); returns how many. The record is emptied."""
        try:
            doc = json.loads(self.record.read_text())
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as e:
            log.warning("stopped-process record unreadable; nothing continued", path=str(self.record), error=str(e))
            return 0
        n = 0
        for pid_s, started in (doc.get("stopped") or {}).items() if isinstance(doc, dict) else ():
            try:
                pid = int(pid_s)
                fd = os.pidfd_open(pid)
            except (ValueError, OSError):
                continue
            try:
                if start_time(pid) == started:
                    signal.pidfd_send_signal(fd, signal.SIGCONT)
                    n += 1
            except OSError:
                pass
            finally:
                os.close(fd)
        self._fds.clear()
        self._save()
        if n:
            log.warning("continued processes a previous daemon had stopped", count=n, path=str(self.record))
        return n

    def _save(self) -> None:
        stopped: Mapping[str, int] = {str(p): s for held in self._fds.values() for p, (_, s) in held.items()}
        tmp = self.record.with_name(self.record.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump({"stopped": stopped}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.record)
