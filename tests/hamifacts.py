"""HAMi's metric definitions, written down as facts, and a checker of a daemon's exposition against them.

The facts are HAMi's own (v2.9 on; the scheduler's ``cmd/scheduler/metrics.go``
and the vGPU monitor's ``cmd/vGPUmonitor/metrics.go`` in Project-HAMi/HAMi at
4707fb0, read 2026-11-29, and the two changes merged after it: #2776 gave
``hami_host_gpu_memory_controller_utilization_ratio`` the ``node`` label its
siblings have, #2898 dropped the always-0 ``container_index``/``containeridx``
from the four vGPU allocation series, which are per pod since): each series'
name, its label names,
the legacy name and legacy label names ``--legacy-metrics`` adds, and its unit.
Beyond HAMi's own output, one GPU has one ``device_type`` in every series
(HAMi's scheduler writes ``NVIDIA H100 ...`` where its monitor writes
``NVIDIA-NVIDIA H100 ...``; a dashboard joining the two needs one).
They are written here independently of hamid's own table
(hamid/hamimetrics.py), so a renamed label or a changed unit there fails the
check. Every HAMi series carries ``zone="vGPU"`` but ``hami_build_info``.
"""

from __future__ import annotations

GPU = ("node", "device_uuid", "device_index", "device_type")
LGPU = ("nodeid", "deviceuuid", "deviceidx", "devicetype")
ALLOC = ("namespace", "node", "pod", "device_uuid")  # per pod since HAMi #2898
LALLOC = ("podnamespace", "nodename", "podname", "deviceuuid")
CTR = ("namespace", "pod", "container", "vdevice_index", "device_uuid")
LCTR = ("podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid")
HOST = ("node", "device_index", "device_uuid", "device_type")
LHOST = ("nodeid", "deviceidx", "deviceuuid", "devicetype")

# name: (labels, legacy name, legacy labels, unit)
# units: bytes; percent (0-100, HAMi's "_ratio" core and utilization series); fraction (0-1); count; info (1); seconds
FACTS: dict[str, tuple[tuple[str, ...], str | None, tuple[str, ...] | None, str]] = {
    # scheduler (:9395 in HAMi)
    "hami_gpu_memory_limit_bytes": (GPU, "GPUDeviceMemoryLimit", LGPU, "bytes"),
    "hami_gpu_core_limit_ratio": (GPU, "GPUDeviceCoreLimit", LGPU, "percent"),
    "hami_gpu_memory_allocated_bytes": (("node", "device_uuid", "device_index", "device_cores", "device_type"),
                                        "GPUDeviceMemoryAllocated",
                                        ("nodeid", "deviceuuid", "deviceidx", "devicecores", "devicetype"), "bytes"),
    "hami_gpu_shared_count": (GPU, "GPUDeviceSharedNum", LGPU, "count"),
    "hami_gpu_core_allocated_ratio": (GPU, "GPUDeviceCoreAllocated", LGPU, "percent"),
    "hami_node_gpu_overview": (("node", "device_uuid", "device_index", "device_cores", "device_memory_limit",
                                "device_type"), "nodeGPUOverview",
                               ("nodeid", "deviceuuid", "deviceidx", "devicecores", "devicememorylimit", "devicetype"),
                               "bytes"),
    "hami_node_gpu_memory_allocated_ratio": (GPU, "nodeGPUMemoryPercentage", ("nodeid", "deviceuuid", "deviceidx"),
                                             "fraction"),
    "hami_node_gpu_mig_instance_info": (("node", "device_uuid", "device_index", "mig_uuid", "profile",
                                         "gpu_instance_id", "compute_instance_id", "placement_start", "placement_size"),
                                        "nodeGPUMigInstance", ("nodeid", "deviceuuid", "deviceidx", "migname"), "info"),
    "hami_vgpu_memory_allocated_bytes": (ALLOC, "vGPUMemoryAllocated", LALLOC, "bytes"),
    "hami_vgpu_core_allocated_ratio": (ALLOC, "vGPUCoreAllocated", LALLOC, "percent"),
    # scheduler, namespace quotas: quota_name is the resource (nvidia.com/gpumem), limit the limit as written
    # (0 when the namespace has none); values in the resource's units (MiB, percent of a GPU), so not checked
    "hami_resource_quota_used": (("namespace", "quota_name", "limit"), "QuotaUsed",
                                 ("quotanamespace", "quotaName", "limit"), "count"),
    "hami_resource_quota_limit": (("namespace", "quota_name"), None, None, "count"),
    # vGPU monitor (:9394 in HAMi)
    "hami_host_gpu_memory_used_bytes": (HOST, "HostGPUMemoryUsage", LHOST, "bytes"),
    "hami_host_gpu_utilization_ratio": (HOST, "HostCoreUtilization", LHOST, "percent"),
    "hami_host_gpu_memory_controller_utilization_ratio": (HOST, None, None, "percent"),  # node since HAMi #2776
    "hami_vgpu_memory_used_bytes": (CTR, "vGPU_device_memory_usage_in_bytes", LCTR, "bytes"),
    "hami_vgpu_memory_limit_bytes": (CTR, "vGPU_device_memory_limit_in_bytes", LCTR, "bytes"),
    "hami_container_device_memory_bytes": (CTR, "Device_memory_desc_of_container",
                                           LCTR + ("context", "module", "data", "offset"), "bytes"),
    "hami_container_device_utilization_ratio": (CTR, "Device_utilization_desc_of_container", LCTR, "percent"),
    "hami_container_last_kernel_elapsed_seconds": (CTR, "Device_last_kernel_of_container", LCTR, "seconds"),
    "hami_vgpu_memory_context_bytes": (CTR, None, None, "bytes"),
    "hami_vgpu_memory_module_bytes": (CTR, None, None, "bytes"),
    "hami_vgpu_memory_buffer_bytes": (CTR, None, None, "bytes"),
    "hami_mig_device_info": (CTR + ("mig_uuid", "profile", "gpu_instance_id", "compute_instance_id"), "MigInfo",
                             LCTR + ("instanceid",), "info"),
}
BUILD_INFO = ("hami_build_info", ("version", "revision", "build_date", "go_version", "compiler", "platform"))


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by metric name: (labels, value), from the Prometheus text format."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels: dict[str, str] = {}
        rest = rest.rstrip("}")
        while rest:
            k, _, rest = rest.partition('="')
            v = []
            i = 0
            while rest[i] != '"':
                if rest[i] == "\\":
                    i += 1
                v.append(rest[i])
                i += 1
            labels[k] = "".join(v)
            rest = rest[i + 1:].lstrip(",")
        out.setdefault(name, []).append((labels, float(value)))
    return out


def problems(samples: dict, *, legacy: bool, expect: tuple[str, ...]) -> list[str]:
    """What in one exposition disagrees with the facts. `expect`: the names that must have samples."""
    found = []
    for name in expect:
        if not samples.get(name):
            found.append(f"{name}: no sample")
    for name, (labels, lname, llabels, unit) in FACTS.items():
        for lab, v in samples.get(name, ()):
            want = set(labels) | {"zone"}
            if set(lab) != want:
                found.append(f"{name}: labels {sorted(lab)}, HAMi's are {sorted(want)}")
            elif lab["zone"] != "vGPU":
                found.append(f"{name}: zone={lab['zone']!r}, HAMi's is 'vGPU'")
            if unit in ("percent",) and not 0 <= v <= 100 * 4:  # deviceCoreScaling may lift a GPU above 100
                found.append(f"{name}: {v} is not a percent")
            if unit == "fraction" and not 0 <= v <= 1:
                found.append(f"{name}: {v} is not a 0-1 fraction")
            if unit == "info" and v != 1:
                found.append(f"{name}: {v}, an info series is 1")
        if lname is None:
            continue
        got = samples.get(lname, ())
        if legacy and samples.get(name) and not got:
            found.append(f"{lname} (legacy of {name}): no sample with legacy metrics on")
        if not legacy and got:
            found.append(f"{lname}: exported with legacy metrics off")
        for lab, _ in got:
            if set(lab) != set(llabels) | {"zone"}:
                found.append(f"{lname}: labels {sorted(lab)}, HAMi's are {sorted(set(llabels) | {'zone'})}")
    bname, blabels = BUILD_INFO
    for lab, v in samples.get(bname, ()):
        if set(lab) != set(blabels) or v != 1:
            found.append(f"{bname}: labels {sorted(lab)} value {v}; HAMi's are {sorted(blabels)}, 1")
    if not samples.get(bname):
        found.append(f"{bname}: no sample")
    return found + type_problems(samples)


def type_problems(samples: dict) -> list[str]:
    """GPUs whose ``device_type`` (legacy ``devicetype``) differs between series."""
    seen: dict[str, dict[str, str]] = {}  # uuid -> type -> the first series that wrote it
    for name, got in samples.items():
        for lab, _ in got:
            uuid, typ = lab.get("device_uuid", lab.get("deviceuuid")), lab.get("device_type", lab.get("devicetype"))
            if uuid is not None and typ is not None:
                seen.setdefault(uuid, {}).setdefault(typ, name)
    return [f"{uuid}: device_type differs between series: {types}" for uuid, types in seen.items() if len(types) > 1]


def one(samples: dict, name: str, **match: str) -> float:
    """The value of the one sample of `name` whose labels include `match`."""
    hits = [v for lab, v in samples.get(name, ()) if all(lab.get(k) == x for k, x in match.items())]
    assert len(hits) == 1, f"{name} {match}: {len(hits)} samples in {samples.get(name)}"
    return hits[0]
