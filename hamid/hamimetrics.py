"""HAMi's metric names, labels and legacy names, and one way to emit them.

A shared library (no face, no core): the metrics face's ledger and host
collectors and the core's region collector (hamid/shimregion) both emit
through it.

HAMi exports its series from two processes: the scheduler (``:9395``: what is
allocated, from its view of the cluster) and the vGPU monitor (``:9394``:
what the host and each container use). hamid's one daemon exports both sets
on its metrics port, under HAMi's names and labels (v2.9 on), in HAMi's units
(the core series carry percent of a GPU, 50 for half of one, as HAMi's do, in
spite of their ``_ratio`` suffix; ``hami_node_gpu_memory_allocated_ratio`` is
the one 0-1 fraction), with the label ``zone="vGPU"`` HAMi adds to all of them
but ``hami_build_info``. With ``legacyMetrics`` the pre-2.9 names are exported
beside them, with their own label names, as HAMi's ``--legacy-metrics`` does.
Everything HAMi has no series for is ``hamid_*``.

The table below is written from HAMi's definitions (``cmd/scheduler/metrics.go``,
``cmd/vGPUmonitor/metrics.go``, as of HAMi #2776 and #2898, August 2026) as
facts: names, label names, meaning. The vGPU allocation series are per pod
and GPU (a pod books the larger of its init peak and its app sum, as HAMi's
collapsed pod usage); which container holds what is ``hamid_vgpu_allocation_info``.
A GPU's ``device_type`` is the one HAMi registers (:func:`device_type`) in
every series, the host's too, where HAMi's monitor prefixes ``NVIDIA-`` to
every name: one GPU, one type, so scheduler and monitor series join.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily

ZONE = ("zone", "vGPU")  # HAMi registers its collectors with this constant label

GPU = ("node", "device_uuid", "device_index", "device_type")
LEGACY_GPU = ("nodeid", "deviceuuid", "deviceidx", "devicetype")
ALLOC = ("namespace", "node", "pod", "device_uuid")  # per pod: HAMi #2898 dropped the always-0 container_index
LEGACY_ALLOC = ("podnamespace", "nodename", "podname", "deviceuuid")
CTR = ("namespace", "pod", "container", "vdevice_index", "device_uuid")
LEGACY_CTR = ("podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid")
HOST = ("node", "device_index", "device_uuid", "device_type")
LEGACY_HOST = ("nodeid", "deviceidx", "deviceuuid", "devicetype")


@dataclass(frozen=True)
class MetricDef:
    name: str
    help: str
    labels: tuple[str, ...]
    legacy: str | None = None
    legacy_labels: tuple[str, ...] | None = None  # None: the same values as `labels`, renamed by position


_DEFS = (
    # scheduler side: what the ledger has booked
    MetricDef("hami_gpu_memory_limit_bytes", "Device memory limit for a certain GPU", GPU,
              "GPUDeviceMemoryLimit", LEGACY_GPU),
    MetricDef("hami_gpu_core_limit_ratio", "Device core limit for a certain GPU (percent of the GPU)", GPU,
              "GPUDeviceCoreLimit", LEGACY_GPU),
    MetricDef("hami_gpu_memory_allocated_bytes", "Device memory allocated for a certain GPU",
              ("node", "device_uuid", "device_index", "device_cores", "device_type"),
              "GPUDeviceMemoryAllocated", ("nodeid", "deviceuuid", "deviceidx", "devicecores", "devicetype")),
    MetricDef("hami_gpu_shared_count", "Number of containers sharing this GPU", GPU, "GPUDeviceSharedNum", LEGACY_GPU),
    MetricDef("hami_gpu_core_allocated_ratio", "Device core allocated for a certain GPU (percent of the GPU)", GPU,
              "GPUDeviceCoreAllocated", LEGACY_GPU),
    MetricDef("hami_node_gpu_overview", "GPU overview on a certain node (memory allocated, bytes)",
              ("node", "device_uuid", "device_index", "device_cores", "device_memory_limit", "device_type"),
              "nodeGPUOverview", ("nodeid", "deviceuuid", "deviceidx", "devicecores", "devicememorylimit", "devicetype")),
    MetricDef("hami_node_gpu_memory_allocated_ratio", "GPU Memory Allocated Percentage on a certain GPU (0-1)", GPU,
              "nodeGPUMemoryPercentage", ("nodeid", "deviceuuid", "deviceidx")),
    MetricDef("hami_node_gpu_mig_instance_info", "Realized MIG instance identity and scheduler placement",
              ("node", "device_uuid", "device_index", "mig_uuid", "profile", "gpu_instance_id", "compute_instance_id",
               "placement_start", "placement_size"),
              "nodeGPUMigInstance", ("nodeid", "deviceuuid", "deviceidx", "migname")),
    MetricDef("hami_vgpu_memory_allocated_bytes", "vGPU memory allocated from a pod", ALLOC,
              "vGPUMemoryAllocated", LEGACY_ALLOC),
    MetricDef("hami_vgpu_core_allocated_ratio", "vGPU core allocated from a pod (percent of the GPU)", ALLOC,
              "vGPUCoreAllocated", LEGACY_ALLOC),
    # vGPU monitor side: the host's GPUs (NVML) and each container's region
    MetricDef("hami_host_gpu_memory_used_bytes", "GPU device memory usage in bytes", HOST,
              "HostGPUMemoryUsage", LEGACY_HOST),
    MetricDef("hami_host_gpu_utilization_ratio", "GPU core utilization ratio (0-100)", HOST,
              "HostCoreUtilization", LEGACY_HOST),
    MetricDef("hami_host_gpu_memory_controller_utilization_ratio", "GPU memory controller utilization ratio (0-100)",
              HOST),  # node since HAMi #2776
    MetricDef("hami_vgpu_memory_used_bytes", "vGPU device memory usage in bytes", CTR,
              "vGPU_device_memory_usage_in_bytes", LEGACY_CTR),
    MetricDef("hami_vgpu_memory_limit_bytes", "vGPU device memory limit in bytes", CTR,
              "vGPU_device_memory_limit_in_bytes", LEGACY_CTR),
    MetricDef("hami_container_device_memory_bytes", "Container device memory usage in bytes", CTR,
              "Device_memory_desc_of_container", LEGACY_CTR + ("context", "module", "data", "offset")),
    MetricDef("hami_container_device_utilization_ratio",
              "Container device SM utilization ratio (percent of GPU time since the last scrape)", CTR,
              "Device_utilization_desc_of_container", LEGACY_CTR),
    MetricDef("hami_container_last_kernel_elapsed_seconds", "Seconds since last kernel execution in container", CTR,
              "Device_last_kernel_of_container", LEGACY_CTR),
    MetricDef("hami_vgpu_memory_context_bytes", "Container device memory context size in bytes", CTR),
    MetricDef("hami_vgpu_memory_module_bytes",
              "Container device memory module size in bytes (hamid's shim counts modules in the buffer part: 0)", CTR),
    MetricDef("hami_vgpu_memory_buffer_bytes", "Container device memory buffer size in bytes", CTR),
    MetricDef("hami_mig_device_info", "MIG runtime identity for a container allocation",
              CTR + ("mig_uuid", "profile", "gpu_instance_id", "compute_instance_id"),
              "MigInfo", LEGACY_CTR + ("instanceid",)),
    # scheduler side, namespace GPU quotas (the leader's: hamid/scheduling/quota.py); quota_name is the
    # resource (nvidia.com/gpumem), not the ResourceQuota's name; limit is the limit as written, 0 when none
    MetricDef("hami_resource_quota_used", "resourcequota usage for a certain device",
              ("namespace", "quota_name", "limit"), "QuotaUsed", ("quotanamespace", "quotaName", "limit")),
    MetricDef("hami_resource_quota_limit", "resourcequota limit for a certain device", ("namespace", "quota_name")),
)
DEFS: dict[str, MetricDef] = {d.name: d for d in _DEFS}

def device_type(name: str) -> str:
    """The type HAMi (v2.8 on) registers for a GPU named `name`: the name,
    ``NVIDIA-`` prefixed when it lacks "NVIDIA" (``NVIDIA-Tesla T4``)."""
    return name if "NVIDIA" in name.upper() else "NVIDIA-" + name


# hami_build_info's labels (a constant 1, no zone); hamid fills the Go-specific ones with its own facts
BUILD_INFO_LABELS = ("version", "revision", "build_date", "go_version", "compiler", "platform")


class Emitter:
    """Collects samples of HAMi's series during one scrape and yields their
    families (with ``zone``), and the legacy families when asked for."""

    def __init__(self, legacy: bool = False) -> None:
        self.legacy = legacy
        self._samples: dict[str, list[tuple[tuple[str, ...], float]]] = {}
        self._legacy: dict[str, list[tuple[tuple[str, ...], float]]] = {}

    def add(self, name: str, values: tuple[str, ...], value: float, *,
            legacy_values: tuple[str, ...] | None = None, legacy_value: float | None = None) -> None:
        d = DEFS[name]
        if len(values) != len(d.labels):
            raise ValueError(f"{name}: {len(values)} label values for {d.labels}")
        self._samples.setdefault(name, []).append((values, float(value)))
        if self.legacy and d.legacy:
            lv = values if legacy_values is None else legacy_values
            if len(lv) != len(d.legacy_labels or d.labels):
                raise ValueError(f"{d.legacy}: {len(lv)} label values for {d.legacy_labels}")
            self._legacy.setdefault(name, []).append((lv, float(value if legacy_value is None else legacy_value)))

    def families(self, names: tuple[str, ...] | None = None):
        """Every family named (default: every one sampled), empty ones included
        when named, so a scrape shows the series' type and help even with no sample."""
        for name in names if names is not None else tuple(self._samples):
            d = DEFS[name]
            fam = GaugeMetricFamily(d.name, d.help, labels=[*d.labels, ZONE[0]])
            for values, v in self._samples.get(name, ()):
                fam.add_metric([*values, ZONE[1]], v)
            yield fam
            if self.legacy and d.legacy:
                lf = GaugeMetricFamily(d.legacy, d.help, labels=[*(d.legacy_labels or d.labels), ZONE[0]])
                for values, v in self._legacy.get(name, ()):
                    lf.add_metric([*values, ZONE[1]], v)
                yield lf
