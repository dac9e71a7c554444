"""Namespace GPU quotas as HAMi enforces them: what a namespace's pods may still book.

HAMi reads ResourceQuota objects and refuses a placement that would take a
namespace past them (its ``pkg/device/quota.go``, read as facts); hamid does
the same:

- The ``spec.hard`` key ``limits.<memory resource>`` limits the GPU memory
  (MiB) a namespace's pods hold, ``limits.<cores resource>`` their GPU cores
  (percent of a GPU); the resource names are the configured ones
  (``resourceMemoryName``, ``resourceCoreName``: ``nvidia.com/gpumem``,
  ``nvidia.com/gpucores``). No other key is hamid's (Kubernetes' own quota
  admission counts ``requests.``-prefixed extended resources only, which is
  why HAMi checks these itself). A value that is not a whole number is no
  limit (HAMi's ``AsInt64``; hamid logs it); ``0`` refuses every pod that
  would add memory (or cores).
- The memory limit is in the units the pod writes: it is multiplied by
  ``memoryFactor`` before it is compared with what pods hold (MiB).
- What a namespace holds: for each of its pods that was placed (HAMi's
  allocation annotation ``hami.io/vgpu-devices-allocated``, which only the
  daemons write: the webhook refuses it from anyone else) and has not
  terminated (phase Succeeded or Failed), the memory and cores each of its
  GPUs gives it; on one GPU its init containers count at their peak and its
  app containers summed, the larger of the two (app containers alone once
  every init container has succeeded), as HAMi's
  ``CollapseInitContainerUsage``. A percentage request counts what it came
  to on the GPU chosen; ``gpucores`` over 100 counts as the 100 it was
  clamped to; a MIG instance counts its profile's memory and no cores (hamid
  books none for it; HAMi counts the profile's share of the SMs: a
  difference the README lists).
- A placement fits when what the namespace holds (the pod's own earlier
  placement left out) plus what the placement gives the pod stays within
  every limit. HAMi checks this per GPU as it fits a pod; hamid checks each
  node's whole decision (the same answer: the sum only grows as GPUs are
  added), and a node whose decision does not fit gets the reason ``quota``
  (HAMi's ``ResourceQuotaNotFit``) naming the namespace, the ResourceQuota,
  the resource and the numbers.

Where hamid differs: several ResourceQuotas of one namespace naming the same
key each hold (Kubernetes' rule for quotas), so the smallest is checked and
named, where HAMi keeps whichever its informer delivered last. HAMi's webhook
also denies, at creation, a pod whose explicit request already exceeds the
quota; hamid's webhook (which may run apart from the leader, unprivileged,
with no view of the namespace's pods) does not: such a pod is created and
waits, with the reason, until the quota allows it.

Who counts: the leader only (gate mode: the gate controller; extender mode:
filter and bind), from a pod informer and a ResourceQuota informer, plus the
placements it committed that the pod informer does not show yet, so a burst
of pods in one namespace cannot all pass on the same free quota. The leader
alone exports HAMi's quota series (:meth:`QuotaBook.series`), as HAMi's one
scheduler does: were every daemon to export them, a dashboard summing over
instances would count each namespace once per daemon.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

import trio

from ..errors import HamidError
from ..kube.informer import Informer
from ..logs import get_logger
from ..placement import Decision
from ..placement.reasons import Reason
from ..request.model import ResourceNames
from ..request.quantity import quantity
from ..placement import hamiannotations

log = get_logger("quota")

PREFIX = "limits."  # HAMi reads only limits.-prefixed keys
TERMINATED = ("Succeeded", "Failed")  # HAMi's IsPodInTerminatedState: such a pod holds nothing
# A placement this leader committed, counted until the pod informer shows the pod's allocation (the
# update that writes it follows the commit within seconds) or the placement is undone; a booking no pod
# ever shows (the pod deleted meanwhile) is dropped after this long.
BOOKING_TTL_S = 60.0


class QuotaUnknown(HamidError):
    """The quotas cannot be checked here now (not the leader, or its informers have not listed yet)."""


@dataclass(frozen=True)
class Usage:
    mem: int = 0  # MiB (after memoryFactor, as placed)
    cores: int = 0  # percent of a GPU

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.mem + other.mem, self.cores + other.cores)


Containers = Iterable[tuple[bool, Iterable[tuple[str, int, int]]]]  # (init, [(gpu uuid, MiB, cores)])


def usage_of(containers: Containers, *, init_done: bool = False) -> Usage:
    """What a pod holds: per GPU the larger of its init containers' peak and its app containers' sum
    (app containers alone with ``init_done``), summed over its GPUs."""
    peak: dict[str, tuple[int, int]] = {}
    apps: dict[str, tuple[int, int]] = {}
    for init, devices in containers:
        if init and init_done:
            continue
        for uuid, mem, cores in devices:
            if init:
                p = peak.get(uuid, (0, 0))
                peak[uuid] = (max(p[0], mem), max(p[1], cores))
            else:
                a = apps.get(uuid, (0, 0))
                apps[uuid] = (a[0] + mem, a[1] + cores)
    mem = cores = 0
    for uuid in peak.keys() | apps.keys():
        p, a = peak.get(uuid, (0, 0)), apps.get(uuid, (0, 0))
        mem += max(p[0], a[0])
        cores += max(p[1], a[1])
    return Usage(mem, cores)


def decision_usage(decision: Decision) -> Usage:
    """What ``decision`` gives its pod, counted as a placed pod is."""
    return usage_of((c.init, [(d.uuid, d.mem_mib, d.cores) for d in c.devices]) for c in decision.containers)


def decode_allocation(text: str, n_init: int) -> list[tuple[bool, list[tuple[str, int, int]]]]:
    """``hami.io/vgpu-devices-allocated`` (:func:`.hamiannotations.encode_devices`: ``UUID,TYPE,MiB,cores:``
    per device, ``;`` after each container, init containers first) back into containers, the first
    ``n_init`` of them init containers. ``ValueError`` names a malformed device."""
    parts = text.split(";")
    if parts and parts[-1] == "":
        parts.pop()
    out = []
    for i, part in enumerate(parts):
        devices = []
        for dev in part.split(":"):
            if not dev:
                continue
            f = dev.split(",")
            if len(f) != 4 or not f[2].isdigit() or not f[3].isdigit():
                raise ValueError(f"device {dev[:80]!r}: UUID,TYPE,MiB,cores expected")
            devices.append((f[0], int(f[2]), int(f[3])))
        out.append((i < n_init, devices))
    return out


def _inits_succeeded(pod: dict) -> bool:
    """HAMi's ``AllInitContainersSucceeded``: the pod has init containers and each ended with exit code 0."""
    n = len((pod.get("spec") or {}).get("initContainers") or ())
    st = (pod.get("status") or {}).get("initContainerStatuses") or ()
    return n > 0 and len(st) == n and all(
        ((s.get("state") or {}).get("terminated") or {}).get("exitCode", 1) == 0 for s in st)


def pod_usage(pod: dict) -> Usage | None:
    """What a placed pod holds; None for a pod not placed by hamid, or terminated."""
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    text = ann.get(hamiannotations.DEVICES_ALLOCATED)
    if text is None or not ann.get(hamiannotations.VGPU_NODE):
        return None
    if (pod.get("status") or {}).get("phase") in TERMINATED:
        return None
    n_init = len((pod.get("spec") or {}).get("initContainers") or ())
    return usage_of(decode_allocation(text, n_init), init_done=_inits_succeeded(pod))


@dataclass(frozen=True)
class Limit:
    resource: str  # nvidia.com/gpumem
    value: int  # as the ResourceQuota writes it
    quota: str  # the ResourceQuota's name
    scaled: int  # what pods' use is compared with: value x memoryFactor for memory


@dataclass(frozen=True)
class NamespaceQuota:
    """One namespace's limits and what it holds, for checking decisions (pure; any thread)."""

    namespace: str
    limits: dict[str, Limit]
    used: Usage
    names: ResourceNames
    memory_factor: int = 1

    def check(self, decision: Decision) -> Reason | None:
        """None when ``decision`` fits the namespace's quota, else the reason (HAMi's ResourceQuotaNotFit)."""
        return self.check_usage(decision_usage(decision))

    def check_usage(self, want: Usage) -> Reason | None:
        """:meth:`check` for what a decision gives the pod (the extender keeps that per node)."""
        for res, asked, used, unit in ((self.names.memory, want.mem, self.used.mem, " MiB"),
                                       (self.names.cores, want.cores, self.used.cores, "%")):
            lim = self.limits.get(res)
            if lim is None or used + asked <= lim.scaled:
                continue
            scaled = f" (x memoryFactor {self.memory_factor} = {lim.scaled}{unit})" if lim.scaled != lim.value else ""
            text = (f"namespace {self.namespace} GPU quota: ResourceQuota {lim.quota} sets {PREFIX}{res} "
                    f"{lim.value}{scaled}; {used}{unit} in use, the pod adds {asked}{unit} (ResourceQuotaNotFit)")
            return Reason("quota", text, asked=asked, free=max(lim.scaled - used, 0),
                          what=f"ResourceQuota {self.namespace}/{lim.quota} {PREFIX}{res}: {lim.value}")
        return None


class QuotaBook:
    """The leader's count of namespace GPU quotas: a ResourceQuota informer it runs, the pod informer
    it is given (the gate controller's, or the extender's), and its own placements in flight. Read
    from any thread; :meth:`book` and :meth:`unbook` from the trio thread that places."""

    def __init__(self, api, pods: Informer, *, names: ResourceNames, memory_factor: int = 1,
                 clock=time.monotonic, kube=None) -> None:
        """``kube``: the async API client to list and watch ResourceQuotas through (an
        :class:`~hamid.kube.rest.AsyncKube`; else one of ``api``'s is made for the informer's run)."""
        self.pods = pods
        self.names = names
        self.memory_factor = memory_factor
        self.quotas = Informer(kube if kube is not None else api, "/api/v1/resourcequotas", name="resourcequotas")
        self._clock = clock
        self._lock = threading.Lock()
        self._booked: dict[str, tuple[str, Usage, float]] = {}  # pod uid -> (namespace, usage, when)
        self._counted: tuple[int, dict[str, dict[str, Usage]]] = (-1, {})  # (pods.version, ns -> uid -> usage)
        self._warned: set[tuple[str, str, str]] = set()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Run the ResourceQuota informer (the pod informer is run by its owner)."""
        await self.quotas.run(task_status=task_status)

    @property
    def ready(self) -> bool:
        return self.pods.synced.is_set() and self.quotas.synced.is_set()

    # --- what is set ------------------------------------------------------------------------

    def _limits(self, quotas: Iterable[dict]) -> dict[str, Limit]:
        out: dict[str, Limit] = {}
        for q in quotas:
            meta = q.get("metadata") or {}
            for key, v in ((q.get("spec") or {}).get("hard") or {}).items():
                res = key[len(PREFIX):] if key.startswith(PREFIX) else None
                if res not in (self.names.memory, self.names.cores):
                    continue
                try:
                    val = quantity(v)
                except ValueError:
                    val = None
                if val is None or val.denominator != 1 or val < 0:
                    self._warn(meta, key, v)
                    continue
                n = int(val)
                scaled = n * self.memory_factor if res == self.names.memory else n
                cur = out.get(res)
                name = str(meta.get("name"))
                if cur is None or (scaled, name) < (cur.scaled, cur.quota):
                    out[res] = Limit(res, n, name, scaled)
        return out

    def _warn(self, meta: dict, key: str, value) -> None:
        k = (str(meta.get("namespace")), str(meta.get("name")), key)
        if k not in self._warned:
            self._warned.add(k)
            log.warning("a GPU quota that is not a whole number is no limit (as HAMi reads it)",
                        quota=f"{k[0]}/{k[1]}", key=key, value=str(value)[:40], accepted="a whole number, e.g. 8000")

    def limits(self, namespace: str) -> dict[str, Limit]:
        return self._limits(q for q in self.quotas.snapshot() if (q.get("metadata") or {}).get("namespace") == namespace)

    # --- what is held -----------------------------------------------------------------------

    def _by_namespace(self) -> dict[str, dict[str, Usage]]:
        version = self.pods.version
        with self._lock:
            if self._counted[0] == version:
                return self._counted[1]
        out: dict[str, dict[str, Usage]] = {}
        for p in self.pods.snapshot():
            meta = p.get("metadata") or {}
            try:
                got = pod_usage(p)
            except ValueError as e:  # only daemons write the annotation; a bad one is said, not counted
                log.warning("a placed pod's allocation annotation cannot be read; not counted in its quota",
                            pod=f"{meta.get('namespace')}/{meta.get('name')}", error=str(e))
                continue
            if got is not None:
                out.setdefault(str(meta.get("namespace")), {})[str(meta.get("uid"))] = got
        with self._lock:
            self._counted = (version, out)
        return out

    def _held(self, namespace: str, pods: dict[str, Usage], except_uid: str | None) -> Usage:
        total = Usage()
        for uid, u in pods.items():
            if uid != except_uid:
                total += u
        now = self._clock()
        with self._lock:
            for uid, (ns, u, at) in list(self._booked.items()):
                if now - at > BOOKING_TTL_S or (ns == namespace and uid in pods):
                    del self._booked[uid]  # the pod shows its allocation now (counted above), or never did
                elif ns == namespace and uid != except_uid:
                    total += u
        return total

    def used(self, namespace: str, except_uid: str | None = None) -> Usage:
        """What the namespace's pods hold, ``except_uid``'s left out, in-flight placements included."""
        return self._held(namespace, self._by_namespace().get(namespace, {}), except_uid)

    def of(self, namespace: str, except_uid: str | None = None) -> NamespaceQuota | None:
        """The namespace's quota to check a placement against (None: no GPU quota there).
        :class:`QuotaUnknown` while the informers have not listed."""
        if not self.ready:
            raise QuotaUnknown("namespace GPU quotas are not read yet (the leader is listing ResourceQuotas and "
                               "pods); tried again shortly")
        lim = self.limits(namespace)
        if not lim:
            return None
        return NamespaceQuota(namespace, lim, self.used(namespace, except_uid), self.names, self.memory_factor)

    def book(self, uid: str, namespace: str, decision: Decision) -> None:
        """A placement of this leader's, counted until the pod shows it (call before committing it)."""
        now = self._clock()
        with self._lock:
            self._booked.pop(uid, None)  # re-inserted: the dict stays in booking order, oldest first
            self._booked[uid] = (namespace, decision_usage(decision), now)
            while True:  # drop the expired ones here too: a namespace no one checks is never pruned otherwise
                first = next(iter(self._booked.items()))
                if now - first[1][2] <= BOOKING_TTL_S:
                    break
                del self._booked[first[0]]

    def unbook(self, uid: str) -> None:
        """A placement that was refused or undone."""
        with self._lock:
            self._booked.pop(uid, None)

    # --- HAMi's series ----------------------------------------------------------------------

    def series(self) -> list[tuple[str, str, int, int, bool]]:
        """(namespace, resource, used, limit as written or 0, limit set) as HAMi's scheduler exports
        them: every resource a namespace's ResourceQuotas limit, and both resources of a namespace
        whose pods hold GPUs."""
        by_ns = self._by_namespace()
        with self._lock:
            booked_ns = {ns for ns, _, _ in self._booked.values()}
        quotas: dict[str, list[dict]] = {}
        for q in self.quotas.snapshot():
            quotas.setdefault(str((q.get("metadata") or {}).get("namespace")), []).append(q)
        out = []
        for ns in sorted(set(quotas) | set(by_ns) | booked_ns):
            lim = self._limits(quotas.get(ns, ()))
            held = self._held(ns, by_ns.get(ns, {}), None)
            holds = bool(by_ns.get(ns)) or ns in booked_ns
            for res, used in ((self.names.memory, held.mem), (self.names.cores, held.cores)):
                if res in lim or holds:
                    got = lim.get(res)
                    out.append((ns, res, used, got.value if got else 0, got is not None))
        return out
