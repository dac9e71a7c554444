"""Prometheus export of every container region under one directory.

Owns: walking `containers_root` (one directory per container, HAMi's layout
`<podUID>_<container>/` or any name, each holding one or more `*.cache`
region files), reading each region through hamid.shimregion.reader, and
yielding HAMi-compatible gauges at scrape time. It must not write to the
regions or keep them mapped between scrapes.

Metrics (labels: namespace, pod, container, vdevice_index, device_uuid, as
HAMi's vGPUmonitor uses them, see shared/reference/hami.md §8):
  hami_vgpu_memory_used_bytes          container's device memory in use
  hami_vgpu_memory_limit_bytes         its limit (0: none)
  hami_vgpu_memory_context_bytes       the context/overhead part of the use
  hami_vgpu_memory_buffer_bytes        the allocation part of the use
  hami_vgpu_core_limit_ratio           compute limit, 0..1 (0: none)
  hami_container_last_kernel_elapsed_seconds  since a limited launch was seen
  hamid_vgpu_memory_peak_bytes         high-water mark of used
  hamid_vgpu_oom_refusals_total        allocations refused by the limit
  hamid_vgpu_gpu_time_seconds_total    GPU time charged by the compute limiter
  hamid_vgpu_throttle_seconds_total    time launches were held back
  hamid_vgpu_process_memory_used_bytes per process (extra label pid)
The labeler maps a container directory name to (namespace, pod, container);
the default splits HAMi's `<podUID>_<container>` and leaves namespace empty.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from hamid.shimregion.reader import RegionError, read_region

Labeler = Callable[[str], tuple[str, str, str]]
_LABELS = ["namespace", "pod", "container", "vdevice_index", "device_uuid"]


def default_labeler(dirname: str) -> tuple[str, str, str]:
    pod, sep, ctr = dirname.partition("_")
    return ("", pod, ctr) if sep else ("", dirname, "")


class ShimRegionCollector(Collector):
    def __init__(self, containers_root: str | Path, labeler: Labeler = default_labeler) -> None:
        self.root = Path(containers_root)
        self.labeler = labeler
        self.read_errors = 0

    def _regions(self) -> Iterator[tuple[str, Path]]:
        if not self.root.is_dir():
            return
        for d in sorted(self.root.iterdir()):
            if d.is_dir():
                for f in sorted(d.glob("*.cache")):
                    yield d.name, f

    def collect(self):  # noqa: C901 - one flat pass over the regions
        g = {
            "used": GaugeMetricFamily("hami_vgpu_memory_used_bytes", "vGPU device memory in use", labels=_LABELS),
            "limit": GaugeMetricFamily("hami_vgpu_memory_limit_bytes", "vGPU device memory limit", labels=_LABELS),
            "ctx": GaugeMetricFamily(
                "hami_vgpu_memory_context_bytes", "context and driver overhead part of the use", labels=_LABELS
            ),
            "buf": GaugeMetricFamily("hami_vgpu_memory_buffer_bytes", "allocation part of the use", labels=_LABELS),
            "core": GaugeMetricFamily("hami_vgpu_core_limit_ratio", "compute limit (0..1, 0: none)", labels=_LABELS),
            "last": GaugeMetricFamily(
                "hami_container_last_kernel_elapsed_seconds", "seconds since a limited launch", labels=_LABELS
            ),
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
        for dirname, path in self._regions():
            try:
                snap = read_region(path)
            except RegionError:
                self.read_errors += 1
                continue
            ns, pod, ctr = self.labeler(dirname)
            ctx_by_dev: dict[int, int] = {}
            for p in snap.processes:
                for dev, b in p.context_bytes.items():
                    ctx_by_dev[dev] = ctx_by_dev.get(dev, 0) + b
            for d in snap.devices:
                lv = [ns, pod, ctr, str(d.index), d.uuid]
                ctx = min(ctx_by_dev.get(d.index, 0), d.used_bytes)
                g["used"].add_metric(lv, d.used_bytes)
                g["limit"].add_metric(lv, d.limit_bytes)
                g["ctx"].add_metric(lv, ctx)
                g["buf"].add_metric(lv, d.used_bytes - ctx)
                g["core"].add_metric(lv, d.sm_limit_percent / 100.0)
                g["peak"].add_metric(lv, d.peak_used_bytes)
                if d.last_kernel_realtime_ns:
                    g["last"].add_metric(lv, max(0.0, (now_ns - d.last_kernel_realtime_ns) / 1e9))
                c["oom"].add_metric(lv, d.oom_count)
                c["gpu"].add_metric(lv, d.gpu_time_ns / 1e9)
                c["thr"].add_metric(lv, d.throttle_ns / 1e9)
                for p in snap.processes:
                    if d.index in p.used_bytes:
                        g["proc"].add_metric(lv + [str(p.pid)], p.used_bytes[d.index])
        yield from g.values()
        yield from c.values()


def register_collector(
    registry: CollectorRegistry, containers_root: str | Path, labeler: Labeler = default_labeler
) -> ShimRegionCollector:
    """Register a collector of every region under `containers_root`; returns it."""
    col = ShimRegionCollector(containers_root, labeler)
    registry.register(col)
    return col
