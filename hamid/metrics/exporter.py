"""Collectors of node and GPU metrics, and the ``/metrics`` ASGI app.

HAMi's series (names, labels, units: :mod:`hamid.hamimetrics`) from the
ledger, as HAMi's scheduler exports them: ``hami_gpu_memory_limit_bytes``,
``hami_gpu_core_limit_ratio``, ``hami_gpu_memory_allocated_bytes``,
``hami_gpu_shared_count``, ``hami_gpu_core_allocated_ratio``,
``hami_node_gpu_overview``, ``hami_node_gpu_memory_allocated_ratio``,
``hami_node_gpu_mig_instance_info``, ``hami_vgpu_memory_allocated_bytes``,
``hami_vgpu_core_allocated_ratio``, ``hami_build_info``, and the vGPU monitor's
``hami_mig_device_info``; the host's GPUs (:class:`HostCollector`, from NVML)
as the monitor exports them; hamid's own are ``hamid_*``
(``hamid_reservations``, ``hamid_vgpu_allocation_info``,
``hamid_host_gpu_temperature_celsius``, ``hamid_host_gpu_power_watts``,
``hamid_host_gpu_ecc_uncorrected_errors``, ``hamid_build_info``,
``hamid_gpu_mps_shares``: a GPU's MPS client shares).

A Docker container is labelled as HAMi would a pod: namespace ``docker``, pod
its name (``docker run --name``, else its short id), container ``main``.
``hami_vgpu_*_allocated`` are per pod and GPU, as HAMi's since #2898;
``hamid_vgpu_allocation_info`` says which container holds what, with the
reservation's owner key. A GPU's ``device_type`` is the same in every series,
the host's included (:func:`hamid.hamimetrics.device_type`).

Scrapes run in worker threads of their own (at most ``SCRAPE_THREADS`` at a
time, not the process's shared pool that the local API uses) and each has a
time budget (``SCRAPE_TIMEOUT_S``): a collector that blocks makes scrapes
answer 503 after the budget, never starves the API of threads.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from typing import Protocol

import anyio
import anyio.to_thread
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from .. import __version__
from ..buildinfo import build_info
from ..logs import get_logger
from ..hamimetrics import BUILD_INFO_LABELS, Emitter, device_type
from ..placement.usage import parts

log = get_logger("metrics")

MIB = 1024 * 1024
SCHEDULER_SERIES = ("hami_gpu_memory_limit_bytes", "hami_gpu_core_limit_ratio", "hami_gpu_memory_allocated_bytes",
                    "hami_gpu_shared_count", "hami_gpu_core_allocated_ratio", "hami_node_gpu_overview",
                    "hami_node_gpu_memory_allocated_ratio", "hami_node_gpu_mig_instance_info",
                    "hami_vgpu_memory_allocated_bytes", "hami_vgpu_core_allocated_ratio", "hami_mig_device_info")


class LedgerReader(Protocol):
    """What the collectors read of the node: the node service's door (:class:`hamid.node.service.NodeDoor`),
    or a ledger opened read-only beside a daemon."""

    def view(self): ...

    def list(self) -> list: ...

    def change_stamp(self): ...


class LedgerCollector:
    """Reads the ledger on each scrape (in the scrape's worker thread)."""

    def __init__(self, ledger: "LedgerReader", backend: Callable[[], str], *, legacy: bool = False) -> None:
        self._ledger = ledger
        self._backend = backend
        self._legacy = legacy

    def collect(self):
        view = self._ledger.view()
        res = self._ledger.list()
        e = Emitter(self._legacy)
        for g in view.gpus:
            idx, typ = str(g.index), g.hami_type
            lab = (view.name, g.uuid, idx, typ)
            e.add("hami_gpu_memory_limit_bytes", lab, g.mem_total * MIB)
            e.add("hami_gpu_core_limit_ratio", lab, g.cores_total)
            e.add("hami_gpu_memory_allocated_bytes", (view.name, g.uuid, idx, str(g.cores_total), typ),
                  g.mem_used * MIB)
            e.add("hami_gpu_shared_count", lab, g.shares_used)
            e.add("hami_gpu_core_allocated_ratio", lab, g.cores_used)
            e.add("hami_node_gpu_overview", (view.name, g.uuid, idx, str(g.cores_total), str(g.mem_total), typ),
                  g.mem_used * MIB)
            if g.mem_total > 0:
                e.add("hami_node_gpu_memory_allocated_ratio", lab, g.mem_used / g.mem_total,
                      legacy_values=(view.name, g.uuid, idx))
        mps_shares = GaugeMetricFamily("hamid_gpu_mps_shares", "Of the GPU's tenants, the MPS client shares",
                                       labels=["node", "device_uuid", "device_index", "device_type"])
        for g in view.gpus:
            mps_shares.add_metric([view.name, g.uuid, str(g.index), g.hami_type], g.mps_used)
        alloc_info = GaugeMetricFamily("hamid_vgpu_allocation_info", "Which containers of a pod hold the GPUs of "
                                       "its hami_vgpu_*_allocated series, and the reservation's owner key",
                                       labels=["namespace", "node", "pod", "container", "device_uuid", "owner"])
        per_kind: dict[str, int] = {}
        caps = {g.uuid: g for g in view.gpus}
        for r in res:
            per_kind[r.kind] = per_kind.get(r.kind, 0) + 1
            ns, pod = owner_labels(r)
            # per pod and GPU, as HAMi (#2898): the pod's booking, the larger of its init peak and app sum
            booked = {u: [p[0], p[1]] for u, p in parts(r.decision, caps).items()}
            for c in r.decision.containers:
                ctr = c.name if r.kind != "docker" else "main"
                for vi, d in enumerate(c.devices):
                    alloc_info.add_metric([ns, view.name, pod, ctr, d.uuid, r.owner], 1)
                    # parts() counts a MIG instance in slices; HAMi's series carry its memory
                    if d.mig_profile is not None and d.mig_placement is not None and d.uuid in booked:
                        booked[d.uuid][0] += d.mem_mib
                        booked[d.uuid][1] += d.cores
                    inst = (r.mig or {}).get(d.uuid) or {}
                    if d.mig_profile and inst.get("uuid") and d.mig_placement is not None:
                        gi, cid = str(inst.get("gi", "")), str(inst.get("ci", ""))
                        e.add("hami_node_gpu_mig_instance_info",
                              (view.name, d.uuid, str(d.index), inst["uuid"], d.mig_profile, gi, cid,
                               str(d.mig_placement.start), str(d.mig_placement.size)), 1,
                              legacy_values=(view.name, d.uuid, str(d.index), f"{d.mig_profile}-{gi}"))
                        e.add("hami_mig_device_info", (ns, pod, ctr, str(vi), d.uuid, inst["uuid"], d.mig_profile,
                                                       gi, cid), 1,
                              legacy_values=(ns, pod, ctr, str(vi), d.uuid, gi))
            for uuid, (mem, cores) in sorted(booked.items()):
                e.add("hami_vgpu_memory_allocated_bytes", (ns, view.name, pod, uuid), mem * MIB)
                e.add("hami_vgpu_core_allocated_ratio", (ns, view.name, pod, uuid), cores)
        yield from e.families(SCHEDULER_SERIES)
        yield alloc_info
        yield mps_shares
        resv = GaugeMetricFamily("hamid_reservations", "Reservations in the ledger", labels=["kind"])
        for kind in ("docker", "pod", "claim"):
            resv.add_metric([kind], per_kind.get(kind, 0))
        yield resv
        build = GaugeMetricFamily("hami_build_info", "hami build metadata exposed as labels with a constant value "
                                  "of 1 (hamid's: no Go, the Python version in go_version)",
                                  labels=list(BUILD_INFO_LABELS))
        info = build_info()
        build.add_metric([__version__, info.revision, info.build_date, platform.python_version(),
                          platform.python_implementation().lower(),
                          f"{platform.system().lower()}/{platform.machine()}"], 1)
        yield build
        yield InfoMetricFamily("hamid_build", "hamid build", value={"version": __version__, "backend": self._backend()})


class HostCollector:
    """The host's GPUs as HAMi's vGPU monitor exports them (memory used,
    utilization, memory-controller utilization), read from the device backend
    (NVML; the simulated backend reads zeros) on each scrape, and hamid's own
    temperature, power and uncorrected ECC series where the backend has them."""

    def __init__(self, node: str, readings: Callable[[], list], *, legacy: bool = False) -> None:
        self._node = node
        self._readings = readings
        self._legacy = legacy

    def collect(self):
        e = Emitter(self._legacy)
        extra = {"temp": GaugeMetricFamily("hamid_host_gpu_temperature_celsius", "GPU temperature (NVML)",
                                           labels=["node", "device_index", "device_uuid", "device_type"]),
                 "power": GaugeMetricFamily("hamid_host_gpu_power_watts", "GPU power draw (NVML)",
                                            labels=["node", "device_index", "device_uuid", "device_type"]),
                 "ecc": GaugeMetricFamily("hamid_host_gpu_ecc_uncorrected_errors",
                                          "Uncorrected ECC errors since the driver loaded (NVML, volatile)",
                                          labels=["node", "device_index", "device_uuid", "device_type"])}
        try:
            readings = self._readings()
        except Exception as err:  # a GPU that stops answering must not fail the whole scrape
            log.warning("host GPU readings failed", error=str(err))
            readings = []
        for h in readings:
            idx, typ = str(h.index), device_type(h.name)  # the scheduler series' type, so the two join
            lab = (self._node, idx, h.uuid, typ)
            if h.memory_used_bytes is not None:
                e.add("hami_host_gpu_memory_used_bytes", lab, h.memory_used_bytes)
            if h.utilization_gpu is not None:
                e.add("hami_host_gpu_utilization_ratio", lab, h.utilization_gpu)
            if h.utilization_memory is not None:
                e.add("hami_host_gpu_memory_controller_utilization_ratio", lab, h.utilization_memory)
            for key, v in (("temp", h.temperature_c), ("power", h.power_w), ("ecc", h.ecc_uncorrected)):
                if v is not None:
                    extra[key].add_metric(list(lab), v)
        yield from e.families(("hami_host_gpu_memory_used_bytes", "hami_host_gpu_utilization_ratio",
                               "hami_host_gpu_memory_controller_utilization_ratio"))
        yield from extra.values()


def owner_labels(r) -> tuple[str, str]:
    """(namespace, pod) as HAMi's metrics carry them: a pod's own (a DRA claim's: its namespace and
    name); a Docker container's as namespace ``docker`` and its name."""
    if r.kind in ("pod", "claim"):
        ns, sep, name = r.name.partition("/")
        return (ns, name) if sep else ("", r.name or r.uid)
    return "docker", r.name or r.uid


class SlotLabeler:
    """Labels for a container's region directory (its slot): (namespace, pod,
    container) from the reservation that owns the slot, looked up in the ledger
    once per change of it (scrapes read many regions)."""

    def __init__(self, ledger: "LedgerReader") -> None:
        self._ledger = ledger
        self._stamp: int | None = None
        self._map: dict[str, tuple[str, str, str]] = {}

    def __call__(self, slot: str) -> tuple[str, str, str]:
        stamp = self._ledger.change_stamp()
        if stamp is None or stamp != self._stamp:
            from ..node.realize import slot_name

            fresh: dict[str, tuple[str, str, str]] = {}
            for r in self._ledger.list():
                ns, pod = owner_labels(r)
                for c in r.decision.containers:
                    fresh.setdefault(slot_name(r, c.name), (ns, pod, c.name if r.kind != "docker" else "main"))
            self._map, self._stamp = fresh, stamp
        # a directory no reservation names: a container the runtime admitted without the daemon
        return self._map.get(slot, ("docker", slot, "main"))


def new_registry() -> tuple[CollectorRegistry, Counter]:
    reg = CollectorRegistry()
    commits = Counter("hamid_ledger_commits", "Reservation commits through the local API", ["result"], registry=reg)
    return reg, commits


SCRAPE_THREADS = 2
SCRAPE_TIMEOUT_S = 10.0


def metrics_app(registry: CollectorRegistry, *, threads: int | None = None,
                timeout_s: float | None = None) -> Starlette:
    """The ``/metrics`` app; `threads` and `timeout_s` default to SCRAPE_THREADS and SCRAPE_TIMEOUT_S."""
    limiter: list[anyio.CapacityLimiter] = []  # made on the first scrape, inside the event loop

    async def metrics(_req):
        nonlocal timeout_s
        if not limiter:
            limiter.append(anyio.CapacityLimiter(threads or SCRAPE_THREADS))
            timeout_s = SCRAPE_TIMEOUT_S if timeout_s is None else timeout_s
        with anyio.move_on_after(timeout_s):
            # abandoned on timeout: a blocked thread keeps its token of this limiter only
            body = await anyio.to_thread.run_sync(generate_latest, registry,
                                                  abandon_on_cancel=True, limiter=limiter[0])
            return Response(body, media_type=CONTENT_TYPE_LATEST)
        log.warning("metrics scrape over its budget", timeout_s=timeout_s, busy_threads=limiter[0].borrowed_tokens)
        return Response(f"scrape took longer than {timeout_s} s\n", status_code=503, media_type="text/plain")

    return Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])
