"""Collectors of node and GPU metrics, and the ``/metrics`` ASGI app.

Names follow HAMi where the meaning is the same (its device plugin and vGPU monitor):
``hami_gpu_memory_limit_bytes``, ``hami_gpu_memory_allocated_bytes``,
``hami_gpu_core_limit_ratio``, ``hami_gpu_core_allocated_ratio``,
``hami_gpu_shared_count``, ``hami_node_gpu_mig_instance_info``,
``hami_vgpu_memory_allocated_bytes``, ``hami_vgpu_core_allocated_ratio``,
``hami_build_info``; hamid's own are ``hamid_*``.

Scrapes run in worker threads of their own (at most ``SCRAPE_THREADS`` at a
time, not the process's shared pool that the local API uses) and each has a
time budget (``SCRAPE_TIMEOUT_S``): a collector that blocks makes scrapes
answer 503 after the budget, never starves the API of threads.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.to_thread
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from .. import __version__
from ..ledger import Ledger
from ..logs import get_logger

log = get_logger("metrics")

MIB = 1024 * 1024
GPU_LABELS = ["node", "device_uuid", "device_index", "device_type"]


class LedgerCollector:
    """Reads the ledger on each scrape (in the scrape's worker thread)."""

    def __init__(self, ledger: Ledger, backend: Callable[[], str]) -> None:
        self._ledger = ledger
        self._backend = backend

    def collect(self):
        view = self._ledger.view()
        res = self._ledger.list()
        f = {
            "mem_limit": GaugeMetricFamily("hami_gpu_memory_limit_bytes", "Bookable device memory (after scaling)", labels=GPU_LABELS),
            "mem_alloc": GaugeMetricFamily("hami_gpu_memory_allocated_bytes", "Device memory reserved in the ledger", labels=GPU_LABELS),
            "core_limit": GaugeMetricFamily("hami_gpu_core_limit_ratio", "Bookable compute (1.0 = whole GPU)", labels=GPU_LABELS),
            "core_alloc": GaugeMetricFamily("hami_gpu_core_allocated_ratio", "Compute reserved in the ledger", labels=GPU_LABELS),
            "shared": GaugeMetricFamily("hami_gpu_shared_count", "Tenants sharing the GPU", labels=GPU_LABELS),
        }
        mig = GaugeMetricFamily("hami_node_gpu_mig_instance_info", "MIG instances booked on the GPU",
                                labels=GPU_LABELS + ["profile", "placement_start", "placement_size"])
        for g in view.gpus:
            lab = [view.name, g.uuid, str(g.index), g.name]
            f["mem_limit"].add_metric(lab, g.mem_total * MIB)
            f["mem_alloc"].add_metric(lab, g.mem_used * MIB)
            f["core_limit"].add_metric(lab, g.cores_total / 100)
            f["core_alloc"].add_metric(lab, g.cores_used / 100)
            f["shared"].add_metric(lab, g.slots_used)
            for s in g.mig_used:
                mig.add_metric(lab + [s.profile, str(s.placement.start), str(s.placement.size)], 1)
        vlabels = ["namespace", "node", "pod", "container", "device_uuid", "owner"]
        vmem = GaugeMetricFamily("hami_vgpu_memory_allocated_bytes", "Memory reserved per container and GPU",
                                 labels=vlabels)
        vcore = GaugeMetricFamily("hami_vgpu_core_allocated_ratio", "Compute reserved per container and GPU",
                                  labels=vlabels)
        per_kind: dict[str, int] = {}
        for r in res:
            per_kind[r.kind] = per_kind.get(r.kind, 0) + 1
            for c in r.decision.containers:
                for d in c.devices:
                    ns, pod = owner_labels(r)
                    lab = [ns, view.name, pod, c.name, d.uuid, r.owner]
                    vmem.add_metric(lab, d.mem_mib * MIB)
                    vcore.add_metric(lab, d.cores / 100)
        resv = GaugeMetricFamily("hamid_reservations", "Reservations in the ledger", labels=["kind"])
        for kind in ("docker", "pod"):
            resv.add_metric([kind], per_kind.get(kind, 0))
        info = InfoMetricFamily("hami_build", "hamid build", value={"version": __version__, "backend": self._backend()})
        yield from f.values()
        yield from (mig, vmem, vcore, resv, info)


def owner_labels(r) -> tuple[str, str]:
    """(namespace, pod) as HAMi's metrics carry them: a pod's own; a Docker
    container's as namespace ``docker`` and its name."""
    if r.kind == "pod":
        ns, sep, name = r.name.partition("/")
        return (ns, name) if sep else ("", r.name or r.uid)
    return "docker", r.name or r.uid


class SlotLabeler:
    """Labels for a container's region directory (its slot): (namespace, pod,
    container) from the reservation that owns the slot, looked up in the ledger
    once per change of it (scrapes read many regions)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._stamp: int | None = None
        self._map: dict[str, tuple[str, str, str]] = {}

    def __call__(self, slot: str) -> tuple[str, str, str]:
        stamp = self._ledger.change_stamp()
        if stamp is None or stamp != self._stamp:
            from ..node.realize import slot_name

            fresh = {}
            for r in self._ledger.list():
                ns, pod = owner_labels(r)
                for c in r.decision.containers:
                    fresh.setdefault(slot_name(r, c.name), (ns, pod, c.name if r.kind == "pod" else "main"))
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
