"""What the node publishes to the scheduler: its DRA GPUs as one ResourceSlice pool.

A pure function of the node's view (:func:`pool`): the daemon calls it after
every change of the ledger or of the GPUs' health and publishes when the
result differs (:mod:`.publish` bumps the pool's generation then).

- A GPU that shares through the shim or MPS is one device with
  ``allowMultipleAllocations`` and two consumable capacities: ``memory``
  (bytes, requests rounded up to whole MiB: ``validRange{min 1Mi, step 1Mi}``,
  default the node's ``defaultMemory`` or else all that is left) and
  ``cores`` (percent of its compute, ``validRange{min 0, max 100, step 1}``,
  default the node's ``defaultCores``; 0 books no compute, as a pod without
  ``nvidia.com/gpucores`` books none), and ``shares``: the tenants it may
  still take (``deviceSplitCount``), each claim taking exactly one
  (``validRange{min 1, max 1}``), so the scheduler stops at N tenants per GPU
  as the device plugin does.
- **One ledger**: the capacity published is what the other faces (device
  plugin pods, Docker containers) have left on the GPU; the scheduler itself
  subtracts the claims it allocated. A booking by another face changes the
  slice (generation + 1). Between a booking and the scheduler reading the new
  slice, a claim may still be allocated against the old capacity: prepare
  then asks the ledger, which refuses what no longer fits (a per-claim error
  that kubelet shows and retries), so nothing is booked twice.
- A GPU with nothing left for claims (another face holds it whole) is left
  out; an unhealthy GPU is tainted ``NoSchedule`` with the reason.
- A MIG-mode GPU is partitionable: one counter set per physical GPU (its
  memory in bytes, its compute slices, one counter of 1 per memory slice)
  in a slice of its own (the API keeps ``sharedCounters`` and ``devices``
  apart), and one device per profile placement consuming its share
  (:func:`mig_devices`), from the MIG tables the daemon already has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..placement.view import MODE_MIG, SHARE_MPS, GpuView, MigSlot
from . import names

MIB = 1 << 20
# the API's limits: devices per slice (fewer when any uses taints or counters), counter sets per slice
DEVICES_PER_SLICE = 128
DEVICES_PER_SLICE_ADVANCED = 64
COUNTER_SETS_PER_SLICE = 8

# NVIDIA product families: architecture and CUDA compute capability by a name's model part
_ARCH = (("B200", "Blackwell", "10.0.0"), ("GB200", "Blackwell", "10.0.0"), ("H200", "Hopper", "9.0.0"),
         ("H100", "Hopper", "9.0.0"), ("GH200", "Hopper", "9.0.0"), ("L40", "Ada Lovelace", "8.9.0"),
         ("L4", "Ada Lovelace", "8.9.0"), ("A100", "Ampere", "8.0.0"), ("A30", "Ampere", "8.0.0"),
         ("A10", "Ampere", "8.6.0"), ("A40", "Ampere", "8.6.0"), ("T4", "Turing", "7.5.0"),
         ("V100", "Volta", "7.0.0"))


def architecture(product: str) -> tuple[str, str] | None:
    """(architecture, compute capability as a semantic version) of an NVIDIA product name, or None."""
    words = product.replace("-", " ").split()
    for model, arch, cc in _ARCH:
        if model in words:
            return arch, cc
    return None


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as the pool shows it: its view in the ledger and what the other faces booked on it."""

    view: GpuView
    foreign_mem_mib: int = 0  # booked by pods and containers of the other faces
    foreign_cores: int = 0
    foreign_exclusive: bool = False
    foreign_shares: int = 0  # tenants of the other faces
    foreign_mig: tuple[MigSlot, ...] = ()  # MIG instances the other faces hold
    health_reason: str = ""  # non-empty: unhealthy, why


@dataclass(frozen=True)
class Pool:
    """The pool's content, without its generation: compared to decide whether to publish."""

    devices: tuple[dict[str, Any], ...] = ()
    counter_sets: tuple[dict[str, Any], ...] = ()
    left_out: dict[str, str] = field(default_factory=dict)  # GPU uuid -> why it has no device

    def slices(self, node: str, generation: int) -> list[dict[str, Any]]:
        """The ResourceSlice objects of the pool (``nodeName`` set, ``resourceSliceCount`` right)."""
        per = DEVICES_PER_SLICE_ADVANCED if any(
            "taints" in d or "consumesCounters" in d for d in self.devices) else DEVICES_PER_SLICE
        parts: list[tuple[str, dict[str, Any]]] = [
            (f"gpus-{i // per}", {"devices": list(self.devices[i:i + per])})
            for i in range(0, max(1, len(self.devices)), per)]
        parts += [(f"counters-{i // COUNTER_SETS_PER_SLICE}",
                   {"sharedCounters": list(self.counter_sets[i:i + COUNTER_SETS_PER_SLICE])})
                  for i in range(0, len(self.counter_sets), COUNTER_SETS_PER_SLICE)]
        out = []
        for part, content in parts:
            out.append({"apiVersion": names.GROUP_VERSION, "kind": "ResourceSlice",
                        "metadata": {"name": names.slice_name(node, part)},
                        "spec": {"driver": names.DRIVER, "nodeName": node,
                                 "pool": {"name": node, "generation": generation, "resourceSliceCount": len(parts)},
                                 **content}})
        return out


def _attributes(g: GpuView, sharing: str, driver_version: str | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {"uuid": {"string": g.uuid}, "productName": {"string": g.name[:64]},
                             "index": {"int": g.index}, "sharing": {"string": sharing}}
    arch = architecture(g.name)
    if arch is not None:
        attrs["architecture"] = {"string": arch[0]}
        attrs["cudaComputeCapability"] = {"version": arch[1]}
    if driver_version:
        attrs["driverVersion"] = {"version": driver_version}
    if g.numa is not None:
        attrs[names.ATTR_NUMA] = {"int": g.numa}
    return attrs


def label_value(text: str) -> str:
    """``text`` as a Kubernetes label value (a taint's value must be one): at most 63 letters, digits,
    '-', '_' or '.', starting and ending with a letter or digit; anything else becomes '-'."""
    v = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", v)


def _taints(gf: GpuFacts) -> list[dict[str, str]]:
    if not gf.health_reason:
        return []
    return [{"key": names.TAINT_UNHEALTHY, "value": label_value(gf.health_reason) or "unhealthy",
             "effect": "NoSchedule"}]


def _range(minimum: int, maximum: int | None, step: int, cap: int, unit: str = "") -> dict[str, str]:
    out = {"min": f"{minimum}{unit}"}
    if maximum is not None:
        out["max"] = f"{maximum}{unit}"
    if minimum + step <= cap:  # the API: min + step <= capacity
        out["step"] = f"{step}{unit}"
    return out


def shared_device(gf: GpuFacts, *, default_mem_mib: int, default_cores: int,
                  driver_version: str | None) -> tuple[dict[str, Any] | None, str]:
    """A shim or MPS GPU's device (None and why when nothing is left for claims)."""
    g = gf.view
    mem = g.mem_total - gf.foreign_mem_mib
    cores = min(100, g.cores_total - gf.foreign_cores)
    if gf.foreign_exclusive or cores <= 0:
        return None, "another face holds all its compute"
    if mem < 2:
        return None, "another face holds all its memory"
    shares = g.shares_total - gf.foreign_shares
    if shares < 1:
        return None, "the other faces' tenants take all its shares (deviceSplitCount)"
    sharing = SHARE_MPS if g.serves and g.serves[0] == SHARE_MPS else "shim"
    dmem = min(default_mem_mib or mem, mem)
    dcores = min(default_cores, cores)
    dev: dict[str, Any] = {
        "name": names.device_name(g.index),
        "attributes": _attributes(g, sharing, driver_version),
        "capacity": {
            names.CAP_MEMORY: {"value": f"{mem}Mi", "requestPolicy": {
                "default": f"{dmem}Mi", "validRange": _range(1, None, 1, mem, "Mi")}},
            names.CAP_CORES: {"value": str(cores), "requestPolicy": {
                "default": str(dcores), "validRange": _range(0, cores, 1, cores)}},
            names.CAP_SHARES: {"value": str(shares), "requestPolicy": {
                "default": "1", "validRange": {"min": "1", "max": "1"}}},
        },
        "allowMultipleAllocations": True,
    }
    if SHARE_MPS in g.serves and sharing != SHARE_MPS:
        dev["attributes"]["mps"] = {"bool": True}
    taints = _taints(gf)
    if taints:
        dev["taints"] = taints
    return dev, ""


def mig_devices(gf: GpuFacts, driver_version: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A MIG-mode GPU's profile placements as partitionable devices, and its counter set.

    Each placement ``start:size`` of a profile consumes ``size`` memory-slice
    counters (one per slice it spans: two overlapping placements can never both
    be allocated), its compute slices and its memory; the counters hold what
    the other faces have not already taken (their MIG instances' slices)."""
    g = gf.view
    taken: set[int] = set()
    taken_compute = 0
    taken_mem = 0
    for used in gf.foreign_mig:
        taken.update(range(used.placement.start, used.placement.end))
        p = next((p for p in g.mig_profiles if p.name == used.profile), None)
        if p is not None:
            taken_compute += p.slices
            taken_mem += p.memory_mib
    cset = names.counter_set(g.index)
    total_mem = max((p.memory_mib for p in g.mig_profiles), default=0)
    counters = {names.COUNTER_MEMORY: {"value": f"{max(0, total_mem - taken_mem)}Mi"},
                names.COUNTER_COMPUTE: {"value": str(max(0, g.compute_slices - taken_compute))}}
    for s in range(g.memory_slices):
        counters[names.COUNTER_SLICE.format(s)] = {"value": "0" if s in taken else "1"}
    devices = []
    for p in g.mig_profiles:
        for pl in p.placements:
            attrs = _attributes(g, "mig", driver_version)
            attrs["parentUUID"] = attrs.pop("uuid")
            attrs["profile"] = {"string": p.name}
            attrs["placementStart"] = {"int": pl.start}
            use = {names.COUNTER_MEMORY: {"value": f"{p.memory_mib}Mi"},
                   names.COUNTER_COMPUTE: {"value": str(p.slices)}}
            for s in range(pl.start, pl.end):
                use[names.COUNTER_SLICE.format(s)] = {"value": "1"}
            dev: dict[str, Any] = {"name": names.mig_device_name(g.index, p.name, pl.start), "attributes": attrs,
                                   "capacity": {names.CAP_MEMORY: {"value": f"{p.memory_mib}Mi"}},
                                   "consumesCounters": [{"counterSet": cset, "counters": use}]}
            taints = _taints(gf)
            if taints:
                dev["taints"] = taints
            devices.append(dev)
    return devices, {"name": cset, "counters": counters}


def pool(gpus: list[GpuFacts], *, default_mem_mib: int = 0, default_cores: int = 0,
         driver_version: str | None = None) -> Pool:
    """The pool of the DRA GPUs ``gpus`` (in index order)."""
    devices: list[dict[str, Any]] = []
    counter_sets: list[dict[str, Any]] = []
    left_out: dict[str, str] = {}
    for gf in sorted(gpus, key=lambda x: x.view.index):
        if gf.view.filtered:
            left_out[gf.view.uuid] = "excluded by filterDevices"
            continue
        if gf.view.mode == MODE_MIG:
            devs, cset = mig_devices(gf, driver_version)
            devices += devs
            counter_sets.append(cset)
            continue
        dev, why = shared_device(gf, default_mem_mib=default_mem_mib, default_cores=default_cores,
                                 driver_version=driver_version)
        if dev is None:
            left_out[gf.view.uuid] = why
        else:
            devices.append(dev)
    return Pool(tuple(devices), tuple(counter_sets), left_out)
