"""Prometheus export of every container region under one directory.

Owns: walking `containers_root` (one directory per container, HAMi's layout
`<podUID>_<container>/` or any name, each holding one or more `*.cache`
region files), reading each region through hamid.shimregion.reader, and
yielding HAMi-compatible gauges at scrape time. It must not write to the
regions or keep them mapped between scrapes.

Metrics (labels: namespace, pod, container, vdevice_index, device_uuid, as
HAMi's vGPUmonitor uses them, plus its zone="vGPU"; names and meaning in
hamid.hamimetrics, legacy names with ``legacy``):
  hami_vgpu_memory_used_bytes          container's device memory in use
  hami_container_device_memory_bytes   the same (HAMi exports both)
  hami_vgpu_memory_limit_bytes         its limit (0: none)
  hami_vgpu_memory_context_bytes       the context/overhead part of the use
  hami_vgpu_memory_module_bytes        0: the shim counts modules in the buffer part
  hami_vgpu_memory_buffer_bytes        the allocation part of the use
  hami_container_device_utilization_ratio  percent of the GPU's time the container's kernels used
                                       since the previous scrape, from the GPU time the shim
                                       accounted (HAMi's unit: 40 is 40 %; absent on a
                                       container's first scrape)
  hami_container_last_kernel_elapsed_seconds  whole seconds since a limited launch was seen
  hamid_vgpu_core_limit_ratio          compute limit, 0..1 (0: none)
  hamid_vgpu_memory_peak_bytes         high-water mark of used
  hamid_vgpu_oom_refusals_total        allocations refused by the limit
  hamid_vgpu_gpu_time_seconds_total    GPU time charged by the compute limiter
  hamid_vgpu_throttle_seconds_total    time launches were held back
  hamid_vgpu_process_memory_used_bytes per process (extra label pid)
  hamid_vgpu_region_refusals_total     files skipped (label reason: symlink, type, count,
                                       owner, links, size, unreadable, budget)
  hamid_vgpu_region_untrusted_total    passes of the daemon's live pass in which a region's
                                       charges disagreed with NVML and were left out (label
                                       reason: over-busy, went-back, no-process, uncharged,
                                       unshimmed, under-charged, over-limit;
                                       hamid/shimlimits/live.py)
  hamid_vgpu_unaccounted_passes_total  live passes in which the containers sharing a GPU
                                       charged far less than NVML saw it busy: one of them
                                       may run past its shim, NVML cannot say which (label
                                       device_uuid)
  hamid_vgpu_bypass_stops_total        live passes in which the bypass guard kept a container
                                       that runs outside its shim stopped (over its compute
                                       limit; hamid/shimlimits/bypass.py)
  hamid_vgpu_memory_over_limit_passes_total  live passes in which a container's processes held
                                       more GPU memory than its limit by NVML's count
                                       (hamid/shimlimits/memguard.py)
  hamid_vgpu_memory_kills_total        processes with no shim killed for it
The labeler maps a container directory name to (namespace, pod, container);
the default splits HAMi's `<podUID>_<container>` and leaves namespace empty.

A container's directory and everything in it belong to the container's user,
and the daemon reads it as root, so nothing there is trusted: directories and
files are opened relative to their parent's descriptor without following
symbolic links and without blocking; a region must be a regular file with one
link, owned by the directory's owner (the container's uid, as the runtime
chowned it) or root, under the reader's size cap. Anything else is skipped,
logged once per path and reason, and counted. A scrape reads at most
MAX_REGIONS_PER_CONTAINER files per container and stops at its time budget
(the regions not read yet are left out of that scrape and counted as
`budget`).
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from hamid.logs import get_logger
from hamid.hamimetrics import Emitter
from hamid.shimregion.reader import RegionError, RegionRefused, RegionSnapshot, read_region

if TYPE_CHECKING:
    from hamid.shimlimits.live import LiveCounts

log = get_logger("shimregion")

Labeler = Callable[[str], tuple[str, str, str]]
_LABELS = ["namespace", "pod", "container", "vdevice_index", "device_uuid"]
# HAMi's vGPU monitor series this collector exports (definitions: hamid.hamimetrics)
REGION_SERIES = ("hami_vgpu_memory_used_bytes", "hami_vgpu_memory_limit_bytes", "hami_container_device_memory_bytes",
                 "hami_vgpu_memory_context_bytes", "hami_vgpu_memory_module_bytes", "hami_vgpu_memory_buffer_bytes",
                 "hami_container_device_utilization_ratio", "hami_container_last_kernel_elapsed_seconds")


def default_labeler(dirname: str) -> tuple[str, str, str]:
    pod, sep, ctr = dirname.partition("_")
    return ("", pod, ctr) if sep else ("", dirname, "")


MAX_REGIONS_PER_CONTAINER = 8  # the shim makes one; a few more are tolerated, not thousands
SCRAPE_BUDGET_S = 2.0  # reading every region of a scrape; the rest waits for the next scrape
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_LOGGED_MAX = 4096  # distinct (path, reason) pairs logged; later ones are only counted


class ShimRegionCollector(Collector):
    def __init__(self, containers_root: str | Path, labeler: Labeler = default_labeler,
                 budget_s: float = SCRAPE_BUDGET_S, *, legacy: bool = False,
                 live: Callable[[], LiveCounts] | None = None) -> None:
        self.root = Path(containers_root)
        self.live = live  # the daemon's live pass's counts (untrusted regions, unaccounted GPUs, guard stops)
        self.legacy = legacy  # HAMi's pre-2.9 names beside the hami_* ones
        self.labeler = labeler
        self.budget_s = budget_s
        self.read_errors = 0
        self.refusals: dict[str, int] = {}
        self._logged: set[tuple[str, str]] = set()
        # (container dir, vdevice index, uuid) -> (monotonic s, gpu_time_ns) at the previous scrape
        self._last_gpu: dict[tuple[str, int, str], tuple[float, int]] = {}

    def _skip(self, path: str, reason: str, detail: str) -> None:
        self.read_errors += 1
        self.refusals[reason] = self.refusals.get(reason, 0) + 1
        if (path, reason) not in self._logged and len(self._logged) < _LOGGED_MAX:
            self._logged.add((path, reason))
            log.warning("region skipped", path=path, reason=reason, detail=detail)

    def snapshots(self) -> Iterator[tuple[str, RegionSnapshot]]:
        """(container directory, region) of every readable region, within the
        budget: what a scrape reads (the web view reads it too)."""
        return self._snapshots()

    def _snapshots(self) -> Iterator[tuple[str, RegionSnapshot]]:
        """Every readable region under the root, within the time budget."""
        deadline = time.monotonic() + self.budget_s
        try:
            root_fd = os.open(self.root, _DIR_FLAGS)
        except OSError:
            return  # no containers directory yet (or not one): nothing to export
        try:
            with os.scandir(root_fd) as it:
                dirs = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
            for n, dirname in enumerate(dirs):
                if time.monotonic() > deadline:
                    self._skip(str(self.root), "budget",
                               f"scrape budget of {self.budget_s} s spent; {len(dirs) - n} directories left")
                    return
                yield from self._container(root_fd, dirname, deadline)
        finally:
            os.close(root_fd)

    def _container(self, root_fd: int, dirname: str, deadline: float) -> Iterator[tuple[str, RegionSnapshot]]:
        where = str(self.root / dirname)
        try:
            dfd = os.open(dirname, _DIR_FLAGS, dir_fd=root_fd)
        except OSError as e:
            self._skip(where, "unreadable", e.strerror or str(e))
            return
        try:
            owners = frozenset({os.fstat(dfd).st_uid, 0})
            with os.scandir(dfd) as it:
                names = []
                for entry in it:
                    if entry.name.endswith(".cache"):
                        names.append(entry.name)
                        if len(names) > MAX_REGIONS_PER_CONTAINER:
                            break
            names.sort()
            if len(names) > MAX_REGIONS_PER_CONTAINER:
                self._skip(where, "count", f"more than {MAX_REGIONS_PER_CONTAINER} *.cache files; "
                           f"reading the first {MAX_REGIONS_PER_CONTAINER} found")
                names = names[:MAX_REGIONS_PER_CONTAINER]
            for name in names:
                if time.monotonic() > deadline:
                    self._skip(where, "budget", f"scrape budget of {self.budget_s} s spent")
                    return
                try:
                    snap = read_region(name, dir_fd=dfd, owners=owners)
                except RegionRefused as e:
                    self._skip(f"{where}/{name}", e.reason, str(e))
                    continue
                except RegionError as e:
                    self._skip(f"{where}/{name}", "unreadable", str(e))
                    continue
                yield dirname, snap
        finally:
            os.close(dfd)

    def collect(self):  # noqa: C901 - one flat pass over the regions
        e = Emitter(self.legacy)
        g = {
            "core": GaugeMetricFamily("hamid_vgpu_core_limit_ratio", "compute limit (0..1, 0: none)", labels=_LABELS),
            "peak": GaugeMetricFamily("hamid_vgpu_memory_peak_bytes", "high-water mark of use", labels=_LABELS),
            "proc": GaugeMetricFamily(
                "hamid_vgpu_process_memory_used_bytes", "per-process device memory", labels=_LABELS + ["pid"]
            ),
        }
        c = {
            "oom": CounterMetricFamily("hamid_vgpu_oom_refusals", "allocations refused by the limit", labels=_LABELS),
            "gpu": CounterMetricFamily(
                "hamid_vgpu_gpu_time_seconds", "GPU time charged by the compute limiter", labels=_LABELS
            ),
            "thr": CounterMetricFamily("hamid_vgpu_throttle_seconds", "time launches were held back", labels=_LABELS),
        }
        now_ns = time.time_ns()
        mono = time.monotonic()
        gpu_now: dict[tuple[str, int, str], tuple[list[str], int]] = {}
        for dirname, snap in self._snapshots():
            ns, pod, ctr = self.labeler(dirname)
            ctx_by_dev: dict[int, int] = {}
            for p in snap.processes:
                for dev, b in p.context_bytes.items():
                    ctx_by_dev[dev] = ctx_by_dev.get(dev, 0) + b
            for d in snap.devices:
                lv = [ns, pod, ctr, str(d.index), d.uuid]
                t = tuple(lv)
                ctx = min(ctx_by_dev.get(d.index, 0), d.used_bytes)
                buf = d.used_bytes - ctx
                e.add("hami_vgpu_memory_used_bytes", t, d.used_bytes)
                e.add("hami_vgpu_memory_limit_bytes", t, d.limit_bytes)
                # HAMi's legacy series carries the split as labels: context, module, data, offset
                e.add("hami_container_device_memory_bytes", t, d.used_bytes,
                      legacy_values=(*t, str(ctx), "0", str(buf), "0"))
                e.add("hami_vgpu_memory_context_bytes", t, ctx)
                e.add("hami_vgpu_memory_module_bytes", t, 0)
                e.add("hami_vgpu_memory_buffer_bytes", t, buf)
                if d.last_kernel_realtime_ns:  # whole seconds, as HAMi's monitor gives them
                    e.add("hami_container_last_kernel_elapsed_seconds", t,
                          max(0, (now_ns - d.last_kernel_realtime_ns) // 1_000_000_000))
                g["core"].add_metric(lv, d.sm_limit_percent / 100.0)
                g["peak"].add_metric(lv, d.peak_used_bytes)
                c["oom"].add_metric(lv, d.oom_count)
                c["gpu"].add_metric(lv, d.gpu_time_ns / 1e9)
                k = (dirname, d.index, d.uuid)
                gpu_now[k] = (lv, gpu_now.get(k, (lv, 0))[1] + d.gpu_time_ns)
                c["thr"].add_metric(lv, d.throttle_ns / 1e9)
                for p in snap.processes:
                    if d.index in p.used_bytes:
                        g["proc"].add_metric(lv + [str(p.pid)], p.used_bytes[d.index])
        for k, (lv, ns_used) in gpu_now.items():
            prev = self._last_gpu.get(k)
            if prev is not None and mono > prev[0] and ns_used >= prev[1]:
                e.add("hami_container_device_utilization_ratio", tuple(lv),
                      min(100.0, 100.0 * (ns_used - prev[1]) / 1e9 / (mono - prev[0])))
        self._last_gpu = {k: (mono, v[1]) for k, v in gpu_now.items()}  # containers gone are forgotten
        refused = CounterMetricFamily("hamid_vgpu_region_refusals", "region files skipped, by reason",
                                      labels=["reason"])
        for reason, n in sorted(self.refusals.items()):
            refused.add_metric([reason], n)
        yield from e.families(REGION_SERIES)
        yield from g.values()
        yield from c.values()
        yield refused
        live = self.live() if self.live is not None else None
        doubted = CounterMetricFamily("hamid_vgpu_region_untrusted",
                                      "live passes in which a region's charges disagreed with NVML, by reason",
                                      labels=["reason"])
        for reason, n in sorted(live.untrusted.items() if live else ()):
            doubted.add_metric([reason], n)
        yield doubted
        if live is not None:
            missing = CounterMetricFamily("hamid_vgpu_unaccounted_passes",
                                          "live passes in which the charges of the containers sharing a GPU fell "
                                          "far short of its busy time", labels=["device_uuid"])
            for uuid, n in sorted(live.unaccounted.items()):
                missing.add_metric([uuid], n)
            yield missing
            yield CounterMetricFamily("hamid_vgpu_bypass_stops",
                                      "live passes in which a container running outside its shim was held stopped",
                                      value=live.bypass_stops)
            yield CounterMetricFamily("hamid_vgpu_memory_over_limit_passes",
                                      "live passes in which a container's processes held more GPU memory than its "
                                      "limit (NVML's count)", value=live.memory_over_passes)
            yield CounterMetricFamily("hamid_vgpu_memory_kills",
                                      "processes with no shim killed for their container's GPU memory",
                                      value=live.memory_kills)


def register_collector(
    registry: CollectorRegistry, containers_root: str | Path, labeler: Labeler = default_labeler,
    budget_s: float = SCRAPE_BUDGET_S, legacy: bool = False,
    live: Callable[[], LiveCounts] | None = None,
) -> ShimRegionCollector:
    """Register a collector of every region under `containers_root`; returns it."""
    col = ShimRegionCollector(containers_root, labeler, budget_s, legacy=legacy, live=live)
    registry.register(col)
    return col
