"""The node's authority, as plain blocking calls: admit, commit, release, reconcile.

:class:`NodeCore` is the one place that turns a request into a reservation
and a reservation into what a container gets, and back. The daemon runs it
in worker threads behind :class:`hamid.node.service.NodeService`; the Docker
runtime runs the very same code in its own process when no daemon answers.
The ledger's transactions make the two equivalent: a reservation is re-checked
against the ledger's own state wherever it is committed.

Admission (``admit``): finish pending releases first, reserve (idempotent per
owner, refused once the caller's deadline has passed), make MIG instances,
make each container's region directory and limits file, move the row to
``allocated`` (again under the deadline), then ``realize``. A failure at any
step releases what this call reserved. Release: claim the row
(``releasing``), destroy its MIG instances, remove its directories and
limits files, and only then delete the row.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from ..devices import DeviceBackend
from ..errors import HamidError
from ..ledger import Details, Ledger, LedgerConflict, Reservation, claimant_id
from ..ledger.report import status_document
from ..logs import get_logger
from ..placement.reasons import refusal_headline
from ..request.model import Defaults, Request
from ..shimlimits.live import UNTRUSTED_SAYS, GpuReading, LiveCounts, LivePass, Tenant
from ..shimlimits.memguard import MEMORY_SAYS, MemoryGuard, MemUse
from . import layout, mig, mps, regionfs, released
from .edits import ContainerEdits
from .facts import NodeFacts
from .identity import Owner
from .mps import MpsControl  # the annotations' name: the class body's ``mps`` is the property
from .realize import limits_of, priority_of, realize, slot_assignment, slot_name

log = get_logger("node")

PIDS_UNSEEN_PASSES = 3  # passes (one a second) in which none of NVML's processes is in /proc: a pid that exited
                        # between NVML's answer and the look is one pass, not three

Liveness = Callable[[Reservation], bool]


@dataclass(frozen=True)
class Admitted:
    """A reservation and what each of its containers gets."""

    reservation: Reservation
    edits: dict[str, ContainerEdits]

    def to_dict(self) -> dict[str, Any]:
        return {"reservation": self.reservation.to_dict(),
                "edits": {name: e.to_cdi() for name, e in self.edits.items()}}


def container_answer(got: Admitted | None) -> dict[str, Any]:
    """A container admission as the runtime reads it: ``{"ours": False}``, or
    ``{"ours": True, "reservation": ..., "edits": {container: CDI edits}}``."""
    return {"ours": False} if got is None else {"ours": True, **got.to_dict()}


def refusal(e: HamidError) -> str:
    """How a container's refusal reads to the person who ran it (``docker run`` shows it)."""
    return f"{refusal_headline(e.reasons)}: {e}" if isinstance(e, LedgerConflict) else str(e)


def _safe_dir(path: str, mode: int) -> None:
    """Make ``path`` (a directory of ours) without following a link at it."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise HamidError(f"{path} exists and is not a directory; remove it") from None


def _limits_on_disk(path: str):
    """The limits a limits file of ours says (:class:`ContainerLimits`), or None where the entry is
    missing or is not one: not a regular file (a link is not followed, a FIFO not waited on), not
    root's (the daemon's), not a limits file's size, or bytes that do not decode."""
    from ..shimlimits import LimitsFormatError, decode, limits_size

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:  # missing, or a symbolic link (ELOOP)
        return None
    try:
        st = os.fstat(fd)
        size = limits_size()
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size != size:
            return None
        data = os.read(fd, size + 1)
    finally:
        os.close(fd)
    try:
        return decode(data)
    except LimitsFormatError:
        return None


KILLS_KEPT = 8  # an owner's kills kept until told: a container killed again and again needs one Event, not all


class _Slot(NamedTuple):
    """One container's use of one GPU, as a live pass finds it in the ledger and its files."""

    uuid: str
    limits: str  # its limits file on the host
    device: int  # the GPU's index in that file
    priority: int
    usage: Any  # its region's device usage (shimregion's), None: no region yet
    charged: bool  # its shim charges its kernels there
    limit_pct: int  # the compute limit the bypass guard holds it to (0: none)
    policy: str
    mem_bytes: int  # the memory limit the memory guard holds it to (0: none)


class NodeCore:
    def __init__(self, ledger: Ledger, facts: NodeFacts, backend: Callable[[], DeviceBackend]) -> None:
        self.ledger = ledger
        self.facts = facts
        self.state_dir = Path(facts.state_dir)
        self._open_backend = backend
        self._backend: DeviceBackend | None = None
        self.claimant = claimant_id()
        self._live = LivePass()  # the limits files' live part: hold lists, sharing correction
        self._memory = MemoryGuard()  # GPU memory no shim counts (memguard.py); its killer set on the first pass
        self._kills_untold: dict[str, list[dict[str, Any]]] = {}  # owner -> its kills no face has told yet
        self._guard_ready = False  # the bypass guard is made (and a previous daemon's stops undone) on the first pass
        self._pids_unseen_passes = 0
        # Directories outside the state directory where a face writes files for
        # a reservation (the kubelet face's CDI specs); release deletes a file
        # named in a reservation only when it is a plain entry of one of these.
        self._file_dirs: set[str] = set()
        self._mps_silent: dict[str, set[int]] = {}  # GPU -> MPS servers that gave no status at the last check

    def own_file_dir(self, path: str) -> None:
        """Let reservations name files of ``path`` (a directory a face of this
        node writes into) for release to delete."""
        self._file_dirs.add(os.path.abspath(path))

    @property
    def backend(self) -> DeviceBackend:
        if self._backend is None:
            self._backend = self._open_backend()
        return self._backend

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()
            self._backend = None

    # --- admission -----------------------------------------------------------

    def admit(self, owner: Owner, request: Request, *, user: tuple[int, int] | None = (0, 0),
              details: Details | None = None, deadline: float | None = None) -> Admitted:
        """Reserve ``request`` for ``owner`` and prepare every container of it.
        ``user``: who owns the containers' region directories (None: not known,
        as for a pod; the directory is then open to whichever user the
        container runs as, inside the root-only state directory)."""
        self.drain_released()
        before = self.ledger.get(owner.key)
        res = self.ledger.reserve(request, owner=owner, node_policy=self.facts.node_policy,
                                  details=details, deadline=deadline,
                                  prepare=lambda r: self._prepare_new(r, user))
        if res.state == "releasing":
            raise HamidError(f"{owner} is being released; try again once it is gone")
        if before is not None and res.state in ("allocated", "running"):
            # a start that finds its reservation (a Docker restart, perhaps with no daemon after an OS crash)
            # reuses its limits files: made what the ledger says first, as the daemon's start-up pass does
            self._restore_limits(res)
        try:
            res = self.prepare(res.owner, user=user, deadline=deadline)
        except BaseException:
            if before is None:  # ours alone to undo
                try:
                    self.release(owner.key)
                except Exception as e:  # keep the first error; the reconciler retries the release
                    log.error("rollback of a failed admission failed", owner=owner.key, error=str(e))
            raise
        return Admitted(res, {c.name: realize(res, self.facts, c.name) for c in res.decision.containers})

    def admit_container(self, cid: str, env: list[str], *, user: tuple[int, int], details: Details,
                        defaults: Defaults, deadline: float | None = None,
                        elsewhere: Callable[[Request], str] | None = None) -> Admitted | None:
        """A container's admission from its ``HAMI_*`` variables: the one path for
        the Docker face, the local API's ``/v1/containers`` (the Python runtime
        through the daemon) and the runtime with no daemon. None when it asks
        nothing of ours. ``elsewhere(request)``: where else it fits now, put first
        in a refusal (``docker run`` shows runc's log line, cut at 4 KiB)."""
        from ..request import parse_docker_env

        request = parse_docker_env(env, cid, defaults)
        if request is None:
            return None
        owner = Owner("docker", cid, name=details.display_name or cid[:12])
        try:
            return self.admit(owner, request, user=user, details=replace(details, container_id=cid),
                              deadline=deadline)
        except LedgerConflict as e:
            if elsewhere is None:
                raise
            raise LedgerConflict(f"{elsewhere(request)}; on this node: {e}", e.reasons) from None

    def prepare(self, key: str, *, user: tuple[int, int] | None = None,
                deadline: float | None = None, slots: Mapping[str, str] | None = None) -> Reservation:
        """Make what a ``reserved`` reservation's containers need (MIG
        instances, region directories, limits files) and move it to
        ``allocated``; ``slots`` (container -> device-plugin slot, kubelet's) are
        recorded first. Without MIG or MPS that is one ledger transaction (the
        files written inside it: :meth:`_prepare_now`); MIG instances and MPS
        daemons are made outside any transaction, then the move. A reservation
        already past ``reserved`` is returned with only ``slots`` recorded."""
        res = self.ledger.get(key)
        if res is None:
            raise HamidError(f"no reservation for {key}")
        merged = Details(container_slots={**res.details.container_slots, **slots}) if slots else None
        if res.state != "reserved":
            if merged is not None and merged.container_slots != res.details.container_slots:
                res = self.ledger.update(key, details=merged)
            return res
        if not mig.wanted(res) and not mps.wanted(res):
            got = self.ledger.allocate(key, lambda r: self._prepare_now(r, user), details=merged, deadline=deadline)
            if got.state != "reserved":
                return got
            res = got
        elif merged is not None:
            res = self.ledger.update(key, details=merged)
        if mig.wanted(res):
            owner = res.owner
            mig.create_instances(self.backend, res, self.facts, lambda entry: self.ledger.update(owner, mig=entry))
            res = self.ledger.get(res.owner) or res
        for uuid in mps.wanted(res):
            self._mps_up(uuid)
        self._all_container_files(res, user)
        return self.ledger.transition(res.owner, "allocated", deadline=deadline)

    def _prepare_now(self, res: Reservation, user: tuple[int, int] | None) -> bool:
        """Inside the ledger transaction that records ``res``: write its containers' files and say
        True (commit it ``allocated``), or say False when it needs MIG instances or an MPS daemon
        first (slow work no transaction may wait on: :meth:`prepare` does it after)."""
        if mig.wanted(res) or mps.wanted(res):
            return False
        self._all_container_files(res, user)
        return True

    def _prepare_new(self, res: Reservation, user: tuple[int, int] | None) -> bool:
        """:meth:`_prepare_now` for a reservation this transaction makes: on failure its files go
        too (the transaction leaves no row whose release would remove them)."""
        try:
            return self._prepare_now(res, user)
        except BaseException:
            kind, _, uid = res.owner.partition(":")
            for c in res.decision.containers:
                for slot in {slot_name(res, c.name), layout.slot(kind, uid, c.name)}:
                    self._remove_container_files(slot)
            raise

    def _all_container_files(self, res: Reservation, user: tuple[int, int] | None) -> None:
        done: set[str] = set()
        for c in res.decision.containers:
            slot = slot_name(res, c.name)
            if c.devices and not any(d.mig_profile for d in c.devices) and slot not in done:
                self._container_files(res, c.name, user)
                done.add(slot)

    def write_container_files(self, key: str, container: str, user: tuple[int, int] | None = None) -> None:
        """(Re)write one container's region directory and limits file from its
        reservation as it stands (after a face moved or re-keyed it)."""
        res = self.ledger.get(key)
        if res is None:
            raise HamidError(f"no reservation for {key}")
        self._container_files(res, container, user)

    def _container_files(self, res: Reservation, container: str, user: tuple[int, int] | None) -> None:
        """The region directory (the container's user's) and the limits file (root's, read-only)."""
        from ..shimlimits import write_limits_file

        slot = slot_name(res, container)
        for d in (layout.CONTAINERS_DIR, layout.LIMITS_DIR):
            _safe_dir(str(self.state_dir / d), 0o700)
        rdir = layout.region_dir(self.state_dir, slot)
        _safe_dir(rdir, 0o700)
        if self.facts.region_tmpfs:
            regionfs.mount(rdir)  # a tenant writes here: its own small tmpfs, not the node's disk
        fd = os.open(rdir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if user is not None:
                os.fchown(fd, *user)
                os.fchmod(fd, 0o700)  # its user's alone (it may have been opened to all before the user was known)
            else:  # any user of the container may make the region file (it is made 0600, its own)
                os.fchmod(fd, 0o777)
        finally:
            os.close(fd)
        # Not fsynced (durable=False): the ledger row this file is derived from is committed (and fsynced)
        # after it is written, in the same transaction; a daemon that crashes loses nothing (the page cache
        # outlives the process), and after an OS crash, when every container died with the machine,
        # restore_limits_files() rewrites every live reservation's file whose bytes are not the ledger's
        # before any face serves (hamid/daemon/service.py: before the Docker face answers a create and
        # before the device plugin registers with kubelet, which calls PreStartContainer, which rewrites
        # it, before every start), and an admission that finds its reservation (a Docker restart, with or
        # without a daemon) checks them first too (admit). A file torn in between is one the shim refuses.
        write_limits_file(layout.limits_file(self.state_dir, slot), self._limits(res, container), durable=False)

    def _limits(self, res: Reservation, container: str):
        """What ``container``'s limits file says (:func:`hamid.node.realize.limits_of`)."""
        return limits_of(res, container, self.facts.core_policy)

    def restore_limits_files(self) -> list[str]:
        """At start-up, before any face serves: every live (``allocated``, ``running``) reservation's
        limits file made what the ledger says again where it is not (missing, emptied, torn, replaced
        by something that is not a regular file of ours, or limits that are not the ledger's: the
        files are written without fsync, :meth:`_container_files`). A file that already says the
        ledger's limits is left alone (a running container's bind mount holds that inode, whose
        live part the priority pass keeps writing). Only limits files: never a region directory or
        anything in one. Returns the paths rewritten."""
        from ..shimlimits import limits_size

        limits_size()  # the codec (cffi over the shim's header, ~70 ms) is built now, not at the first start
        out = []
        for res in self.ledger.list():
            if res.state in ("allocated", "running"):
                out += self._restore_limits(res)
        return out

    def _restore_limits(self, res: Reservation) -> list[str]:
        """:meth:`restore_limits_files` for one reservation; the paths rewritten."""
        from ..shimlimits import write_limits_file

        _safe_dir(str(self.state_dir / layout.LIMITS_DIR), 0o700)
        out: list[str] = []
        done: set[str] = set()
        for c in res.decision.containers:
            if not c.devices or any(d.mig_profile for d in c.devices):
                continue
            try:
                slot = slot_name(res, c.name)
                if slot in done:
                    continue
                done.add(slot)
                want = self._limits(res, c.name)
                path = layout.limits_file(self.state_dir, slot)
                if _limits_on_disk(path) == want:
                    continue
                write_limits_file(path, want)  # durable: once per damaged file
            except (HamidError, OSError) as e:  # one bad row must not keep the others' files unrestored
                log.error("limits file not restored", owner=res.owner, container=c.name, error=str(e))
                continue
            log.warning("limits file restored from the ledger", owner=res.owner, container=c.name, path=path)
            out.append(path)
        return out

    def realize(self, key: str, container: str | None = None) -> ContainerEdits:
        res = self.ledger.get(key)
        if res is None:
            raise HamidError(f"no reservation for {key}")
        return realize(res, self.facts, container)

    # --- what a face learns after admission ---------------------------------------

    def move(self, key: str, request: Request, slots: Mapping[str, str]) -> Reservation:
        """Place ``key`` again with ``request`` (the GPUs a face learnt its
        containers really got) against everything else on the node, and record
        ``slots`` with it; refused (:class:`HamidError`) when it does not fit."""
        from ..placement import place
        from ..placement.result import NoFit

        res = self.ledger.get(key)
        if res is None:
            raise HamidError(f"no reservation for {key}")
        view = self.ledger.view_without(key)
        got = place(request, [view], self.facts.node_policy)
        if isinstance(got, NoFit):
            raise HamidError(f"{key} does not fit on the GPUs kubelet gave it: "
                             + "; ".join(got.reasons.get(view.name, ())))
        return self.ledger.recommit(key, got, details=Details(
            container_slots={**res.details.container_slots, **slots}))

    def attach_file(self, key: str, path: str) -> Reservation:
        """Record a file a face wrote for ``key`` (a CDI spec) for release to
        delete; only in a directory the face registered (:meth:`own_file_dir`)."""
        if os.path.dirname(os.path.abspath(path)) not in self._file_dirs:
            raise HamidError(f"{path} is not in a directory a face of this node registered for its files")
        res = self.ledger.get(key)
        if res is None:
            raise HamidError(f"no reservation for {key}")
        if path in res.details.extra_files:
            return res
        return self.ledger.update(key, details=Details(extra_files=(*res.details.extra_files, path)))

    # --- decisions proposed elsewhere -----------------------------------------

    def commit(self, owner: Owner, decision, *, request: Request | None = None, details: Details | None = None,
               deadline: float | None = None) -> Reservation:
        return self.ledger.commit(owner, decision, request=request, details=details, deadline=deadline)

    def commit_many(self, items, *, deadline: float | None = None) -> list:
        """Several proposed decisions ``(owner, decision, request, details)`` in one ledger
        transaction (:meth:`hamid.ledger.Ledger.commit_many`): each its reservation or the
        :class:`LedgerConflict` that refused it, in order."""
        return self.ledger.commit_many(items, deadline=deadline)

    def set_state(self, key: str, state: str) -> Reservation:
        return self.ledger.transition(key, state)

    def recommit(self, key: str, decision, *, details: Details | None = None) -> Reservation:
        """Move a reservation to another decision on this node (a face learnt
        where its containers really run), re-checked in one transaction."""
        return self.ledger.recommit(key, decision, details=details)

    # --- release -------------------------------------------------------------

    def release(self, key: str) -> Reservation | None:
        """Tear down and forget ``key``'s reservation. Idempotent; None when
        there was none. Raises (leaving the row ``releasing``, its GPUs still
        booked) if a MIG instance cannot be destroyed; the reconciler retries."""
        return self._release(key)[0]

    def _release(self, key: str) -> tuple[Reservation | None, bool]:
        """``release``, and whether this call is the one that finished it."""
        res, mine = self.ledger.begin_release(key, self.claimant)
        if res is None:
            return None, False
        if not mine:
            log.info("release already in progress elsewhere", owner=key)
            return res, False
        if mig.wanted(res):
            mig.destroy_instances(self.backend, res)
        for uuid in mps.wanted(res):
            self._mps_down_if_last(uuid, key)
        kind, _, uid = key.partition(":")
        for c in res.decision.containers:  # the slot a face keyed it to, and the default one it had before
            for slot in (lambda: slot_name(res, c.name), lambda: layout.slot(kind, uid, c.name)):
                try:
                    name = slot()
                except layout.LayoutError as e:  # never ours: nothing was made under such a name
                    log.warning("not removing files under a malformed name", owner=key, error=str(e))
                    continue
                self._remove_container_files(name)
        for path in res.details.extra_files:  # a face's own files for it (CDI specs)
            self._remove_face_file(key, path)
        self.ledger.finish_release(key, self.claimant)
        return res, True

    def _remove_face_file(self, key: str, path: object) -> None:
        """Delete ``path`` if it is a plain entry of a directory a face owns
        (:meth:`own_file_dir`), through that directory's descriptor (no link
        followed on the way); anything else is logged and left alone."""
        if not isinstance(path, str) or os.path.abspath(os.path.dirname(path)) not in self._file_dirs:
            log.warning("not deleting a file outside the directories this node writes", owner=key,
                        path=str(path)[:200])
            return
        try:
            name = layout.component(os.path.basename(path), "file name")
            dfd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except (layout.LayoutError, OSError) as e:
            log.warning("not deleting a face's file", owner=key, path=path, error=str(e))
            return
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass
        finally:
            os.close(dfd)

    def _remove_container_files(self, slot: str) -> None:
        rdir = layout.region_dir(self.state_dir, slot)
        regionfs.unmount(rdir)  # first: rmtree must not descend into a tmpfs a container still maps
        shutil.rmtree(rdir, ignore_errors=True)
        try:
            os.unlink(layout.limits_file(self.state_dir, slot))
        except FileNotFoundError:
            pass

    def drain_released(self) -> list[str]:
        """Finish the releases that poststop hooks left as markers."""
        done = []
        for cid in released.pending(str(self.state_dir)):
            res, here = self._release(f"docker:{cid}")
            self._remove_container_files(cid)
            released.clear(str(self.state_dir), cid)
            if res is not None and here:  # one line per release, whichever of racing drains finished it
                log.info("released", owner=f"docker:{cid}", by="poststop")
            done.append(cid)
        return done

    def reconcile(self, liveness: Mapping[str, Liveness]) -> list[Reservation]:
        """Release what ``liveness`` (per owner kind) proves gone, and finish
        releases left halfway. Kinds with no check are left alone: hamid never
        releases what it cannot prove is gone; a failing check keeps the row."""

        def alive(r: Reservation) -> bool:
            check = liveness.get(r.kind)
            if check is None:
                return True
            try:
                return check(r)
            except Exception as e:
                log.warning("liveness check failed; keeping reservation", owner=r.owner, error=str(e))
                return True

        out = []
        for r in self.ledger.stale(alive, self.claimant):
            try:
                if self.release(r.owner) is not None:
                    out.append(r)
                    log.info("released stale reservation", owner=r.owner, kind=r.kind, name=r.name)
            except Exception as e:
                log.error("release failed; will retry", owner=r.owner, error=str(e))
        return out

    def priority_pass(self) -> int:
        """The live part of every limits file (hamid/shimlimits/live.py), once a second: per GPU, the hold
        lists (HAMi's task priority: 0 high, 1 low, unset 1; the host pids of the higher-priority containers'
        processes), whether another container launched kernels recently (policy default) and the sharing
        correction (each container's charged GPU time from its region against NVML's device-wide busy share).
        Whose processes are on a GPU comes from NVML's process list and the host's pid map
        (hamid/shimlimits/hostpids.py), never from a region. Written in place, only what changed; returns how
        many fields were written."""
        from ..shimlimits import LimitsFormatError, decode
        from ..shimlimits.hostpids import file_idents, maps_any, owners
        from ..shimregion import RegionError, read_region

        self._ready_guard()
        found: list[_Slot] = []
        for res in self.ledger.list():
            if res.state not in ("allocated", "running") or not res.decision:
                continue
            for c in res.decision.containers:
                asked = priority_of(res, c.name)
                prio = 1 if asked is None else asked
                slot = slot_name(res, c.name)
                limits = layout.limits_file(self.state_dir, slot)
                try:
                    with open(limits, "rb") as f:
                        lim = decode(f.read())
                except FileNotFoundError:
                    continue
                except (OSError, LimitsFormatError) as e:
                    log.warning("limits file unreadable; its live part is left alone", limits=limits, error=str(e))
                    continue
                try:
                    snap = read_region(os.path.join(layout.region_dir(self.state_dir, slot), "vgpu.cache"))
                except (RegionError, OSError):
                    snap = None  # no process has started CUDA yet (or the region is refused)
                for i, d in enumerate(slot_assignment(res, c.name).devices):
                    charged = (i < len(lim.devices) and lim.devices[i].sm_percent > 0 and not lim.mps
                               and lim.sm_policy != "disable")
                    # the limit the bypass guard holds it to: none where its file says observe (charged, never
                    # held: a limit being tried out)
                    held_to = lim.devices[i].sm_percent if i < len(lim.devices) and lim.sm_mode != "observe" else 0
                    # memory: a MIG instance's is the GPU's own partition (and NVML's process list of its parent
                    # says nothing of it)
                    mem = lim.devices[i].memory_bytes if i < len(lim.devices) and not d.mig_profile else 0
                    found.append(_Slot(d.uuid, str(limits), i, prio, snap.device(i) if snap else None, charged,
                                       held_to, lim.sm_policy, mem))
        try:
            readings = self.backend.busy()
        except Exception as e:  # no reading: no sharing correction, no pids this pass
            log.warning("GPU busy shares not read", error=str(e)[:300])
            readings = {}
        on: dict[str, frozenset[int]] = {u: (r.pids or frozenset()) | r.busy_pids for u, r in readings.items()}
        whose = owners({p for ps in on.values() for p in ps}, {one.limits: one.limits for one in found},
                       layout.LIMITS_IN_CONTAINER)
        self._check_pid_namespace(whose)
        # every shim this daemon ever installed (versioned files, never rewritten nor removed: a container
        # started before an upgrade maps the old one)
        shim_dir = self.state_dir / layout.SHIM_DIR
        shims = file_idents(sorted(shim_dir.glob("libvgpu.so.*"))) if shim_dir.is_dir() else frozenset()
        on_gpu: dict[str, list[Tenant]] = {}
        memory: list[MemUse] = []
        for one in found:
            pids = tuple(sorted(p for p in on.get(one.uuid, ()) if whose.get(p) == one.limits))
            bare = tuple(p for p in pids if maps_any(p, shims) is False) if (one.charged or one.mem_bytes) and shims \
                else ()
            on_gpu.setdefault(one.uuid, []).append(Tenant(
                limits=one.limits, device=one.device, priority=one.priority, pids=pids,
                charged_ns=None if one.usage is None else one.usage.gpu_time_ns, charged=one.charged,
                last_kernel_ns=(one.usage.last_kernel_realtime_ns or None) if one.usage is not None else None,
                limit_pct=one.limit_pct, policy=one.policy, unshimmed=bare if one.charged else ()))
            pid_mem = readings[one.uuid].pid_mem if one.uuid in readings else None
            if one.mem_bytes and pid_mem is not None:
                memory.append(MemUse((one.limits, one.device), one.mem_bytes, sum(pid_mem.get(p, 0) for p in pids), bare))
        self._memory.run(memory)
        try:
            return self._live.run(time.monotonic(), {
                u: (GpuReading(readings[u].busy_pct, readings[u].busy_pids, readings[u].pid_busy)
                    if u in readings else GpuReading(None), ts)
                for u, ts in on_gpu.items()})
        except BaseException:
            self.resume_stopped()  # a pass that failed must not leave a container stopped until the next one
            raise

    def _ready_guard(self) -> None:
        """The bypass guard (computeBypass stop), made on the first pass: only the daemon runs passes, and
        it continues first whatever a previous daemon left stopped (its record in the state directory)."""
        if self._guard_ready:
            return
        self._guard_ready = True
        from ..shimlimits.bypass import BypassGuard, Signals
        from ..shimlimits.hostpids import owned_by
        from ..shimlimits.memguard import PidfdKiller

        signals = Signals(self.state_dir / layout.STOPPED_NAME,
                          lambda key, pid: owned_by(pid, key[0], layout.LIMITS_IN_CONTAINER))
        signals.recover()
        if self.facts.compute_bypass == "stop":
            self._live.guard = BypassGuard(signals)
        if self.facts.memory_bypass == "kill":
            self._memory.killer = PidfdKiller(lambda key, pid: owned_by(pid, key[0], layout.LIMITS_IN_CONTAINER))

    def resume_if_stale(self) -> bool:
        """Continues every container the bypass guard stopped when no pass has run for a while (the daemon's
        watchdog, every second, outside the pass's thread)."""
        return self._live.guard is not None and self._live.guard.resume_if_stale(time.monotonic())

    def resume_stopped(self) -> None:
        """Continues every container the bypass guard stopped (the daemon stops, or a pass failed)."""
        if self._live.guard is not None:
            self._live.guard.resume_all()

    def _check_pid_namespace(self, whose: dict[int, str | None]) -> None:
        """Says so, once, when NVML's processes are absent from this daemon's /proc pass after pass: it runs
        outside the host's pid namespace (a pod without hostPID, a container without --pid=host), so no
        process maps to a container, hold lists stay empty and priority does nothing."""
        seen = [p for p in whose if os.path.exists(f"/proc/{p}")]
        self._pids_unseen_passes = 0 if (seen or not whose) else self._pids_unseen_passes + 1
        if self._pids_unseen_passes == PIDS_UNSEEN_PASSES:
            log.warning("NVML's processes are not in this daemon's pid namespace: no process maps to a container, "
                        "so priority hold lists stay empty", nvml_pids=sorted(whose)[:8],
                        fix="run the daemon in the host's pid namespace (the chart's hostPID: true; "
                            "docker run --pid=host)")

    def live_counts(self) -> LiveCounts:
        """What the live pass counted since start: regions not trusted, GPUs whose busy time was not accounted
        for, passes the bypass guard held a container stopped, and the memory guard's passes and kills."""
        return replace(self._live.counts(), memory_over_passes=self._memory.over_passes,
                       memory_kills=self._memory.kills)

    def memory_killed(self) -> list[dict[str, Any]]:
        """The containers whose processes with no shim the last pass killed for their GPU memory (owner,
        container, GPU, reason, what it means), each also kept for :meth:`take_memory_kills` until a face
        takes it (at most KILLS_KEPT per owner)."""
        got = self._containers_of(dict.fromkeys(self._memory.killed_last, "over-memory"))
        for k in got:
            if not k["owner"].startswith("pod:"):
                continue  # a Docker container's kill is in the log and /metrics: no face tells it
            kept = self._kills_untold.setdefault(k["owner"], [])
            kept[:] = [*kept, k][-KILLS_KEPT:]
        return got

    def take_memory_kills(self, owner: str) -> list[dict[str, Any]]:
        """The kills of ``owner``'s processes not yet told (the kubelet face's Event), forgotten once taken."""
        return self._kills_untold.pop(owner, [])

    # --- MPS control daemons ----------------------------------------------------

    @property
    def mps(self) -> MpsControl:
        if not self.facts.mps_control:
            raise HamidError("MPS shares cannot run on this node: "
                             + (self.facts.mps_missing or "no GPU of it serves mps (operatingMode, deviceModes)"))
        return mps.MpsControl(self.facts.mps_control, str(self.state_dir), timeout=mps.COMMAND_TIMEOUT_S,
                              root=self.facts.mps_dir)

    def _mps_tenants(self, without: str | None = None) -> dict[str, list[str]]:
        """GPU UUID -> owners booking it in MPS mode (rows being released left out)."""
        out: dict[str, list[str]] = {}
        for r in self.ledger.list():
            if r.owner == without or r.state == "releasing":
                continue
            for uuid in mps.wanted(r):
                out.setdefault(uuid, []).append(r.owner)
        return out

    def _mps_up(self, uuid: str) -> None:
        """GPU ``uuid``'s control daemon answers (started now if none runs)."""
        ctl = self.mps
        with ctl.locked(uuid):
            if not ctl.running(uuid):  # a wedged one raises: the health check restarts it
                ctl.start(uuid)

    def _mps_down_if_last(self, uuid: str, leaving: str) -> None:
        """Stop GPU ``uuid``'s control daemon when ``leaving`` was its last MPS tenant."""
        try:
            ctl = self.mps
            with ctl.locked(uuid):
                if uuid not in self._mps_tenants(without=leaving):
                    ctl.stop(uuid)
        except Exception as e:  # the release goes on; mps_check stops a daemon left without tenants
            log.error("could not stop the MPS control daemon after its last tenant", gpu=uuid, error=str(e))

    def _mark_mps_failure(self, owners: list[str], note: dict[str, Any]) -> None:
        for o in owners:
            try:
                self.ledger.update(o, details=Details(mps_failure=note))
            except Exception as e:
                log.warning("could not record the MPS failure", owner=o, error=str(e))

    def _mps_server_faults(self, ctl: MpsControl, uuid: str, owners: list[str]) -> list[dict[str, Any]]:
        """What went wrong in GPU ``uuid``'s MPS server while its daemon is fine: a server that has given
        no status in two checks in a row (wedged: killed, so the daemon starts a new one for the next
        client; its clients lose it, as they would a dead one), and the clients' fatal faults the
        server logged since the last check. Measured on an H200: a stopped server leaves
        ``get_server_status`` unanswered while the daemon answers the rest, and a client's kernels
        already running keep their rate meanwhile."""
        notes = []
        silent = set(ctl.wedged_servers(uuid, ctl.server_list(uuid)))
        again = sorted(silent & self._mps_silent.get(uuid, set()))
        self._mps_silent[uuid] = silent - set(again)
        if silent - set(again):
            log.warning("an MPS server gave no status; killed if it gives none at the next check", gpu=uuid,
                        pids=sorted(silent - set(again)))
        killed = [pid for pid in again if ctl.kill_server(uuid, pid)]
        if killed:
            notes.append({"gpu": uuid, "kind": "server_wedged", "at": time.time(),
                          "reason": f"MPS server {', '.join(map(str, killed))} gave no status in two checks in a "
                                    "row (wedged); hamid killed it and the control daemon starts a new one for "
                                    "the next client"})
            log.error("wedged MPS server killed; the GPU's MPS tenants are marked", gpu=uuid, pids=killed,
                      tenants=owners)
        faults = ctl.client_faults(uuid)
        if faults:
            notes.append({"gpu": uuid, "kind": "client_fault", "at": time.time(),
                          "reason": f"a client of the GPU's MPS server took a fatal GPU fault, which fails the "
                                    f"running work of every client of that server (the server logged: "
                                    f"{faults[-1].strip()[:300]})"})
            log.error("an MPS client faulted; the GPU's MPS tenants are marked", gpu=uuid, lines=faults[-5:],
                      tenants=owners)
        return notes

    def mps_check(self) -> list[dict[str, Any]]:
        """Bring every GPU's MPS control daemon in line with the ledger: adopt
        one that answers and has tenants (a restarted hamid never stops it),
        stop one left without tenants, and for one that is dead or wedged
        while it has tenants: record the failure on each tenant's reservation
        (``details.mps_failure``; nothing is released), restart it, and
        return what happened so faces can tell the owners (an Event for pods).
        A client's fatal GPU fault that the GPU's MPS server logged is recorded
        the same way (``kind`` ``client_fault``): measured on an H200, it fails
        the running work of every client of that server, while the daemon and
        server live on and take new clients, so nothing is restarted."""
        if not self.facts.mps_control:
            return []
        ctl = self.mps
        failures = []
        for uuid in sorted(set(ctl.gpus()) | set(self._mps_tenants())):
            try:
                with ctl.locked(uuid):
                    owners = self._mps_tenants().get(uuid, [])
                    if not owners:
                        if ctl.daemon_pids(uuid):
                            log.info("stopping an MPS control daemon without tenants", gpu=uuid)
                            ctl.stop(uuid)
                        continue
                    why = ctl.health(uuid)
                    if why is None:
                        for note in self._mps_server_faults(ctl, uuid, owners):
                            self._mark_mps_failure(owners, note)
                            failures.append({**note, "owners": owners})
                        continue
                    log.error("MPS control daemon failed; restarting it", gpu=uuid, reason=why, tenants=owners)
                    note = {"gpu": uuid, "kind": "daemon", "reason": why, "at": time.time()}
                    self._mark_mps_failure(owners, note)
                    ctl.stop(uuid)
                    ctl.start(uuid)
                    failures.append({**note, "owners": owners})
            except Exception as e:
                log.error("MPS check failed", gpu=uuid, error=str(e))
        return failures

    # --- reading ---------------------------------------------------------------

    def status(self, backend_label: str) -> dict[str, Any]:
        pending = {f"docker:{cid}" for cid in released.pending(str(self.state_dir))}
        doc = status_document(self.ledger.view(), self.ledger.list(), backend_label, releasing=pending)
        if self.facts.mps_missing:
            doc["mps_missing"] = self.facts.mps_missing
        held = self.held_containers()
        if held:
            doc["compute_held"] = held
        unaccounted = self._live.unaccounted_gpus()
        if unaccounted:
            doc["unaccounted_gpus"] = unaccounted
        return doc

    def held_containers(self) -> list[dict[str, Any]]:
        """The containers the live pass holds to their compute limits from outside (bypass.py), by owner,
        container and GPU, with the reason: what an operator looks for when a container stalls."""
        return self._containers_of(self._live.held())

    def _containers_of(self, keys: Mapping[tuple[str, int], str]) -> list[dict[str, Any]]:
        """Each (limits file, device) of ``keys`` as its owner, container and GPU, with its reason."""
        out: list[dict[str, Any]] = []
        if not keys:
            return out
        for res in self.ledger.list():
            if not res.decision:
                continue
            for c in res.decision.containers:
                limits = layout.limits_file(self.state_dir, slot_name(res, c.name))
                for i, dev in enumerate(slot_assignment(res, c.name).devices):
                    why = keys.get((str(limits), i))
                    if why:
                        out.append({"owner": res.owner, "container": c.name, "gpu": dev.uuid, "reason": why,
                                    "says": UNTRUSTED_SAYS.get(why) or MEMORY_SAYS.get(why)
                                    or UNTRUSTED_SAYS[None]})
        return out
