"""Device readings + node settings -> the capacity views the ledger keeps.

``settings`` is the node's resolved settings (``hamid.config.NodeSettings``),
read by attribute: the core does not import the config schema."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..devices.modelnames import model_matches
from ..devices.types import GpuInfo
from ..placement.view import GpuView, gpu_view_from_info, restrict_mig_profiles
from .dragpus import dra_gpus


def is_filtered(info: GpuInfo, settings: Any) -> bool:
    f = settings.filterDevices
    return info.uuid in f.uuid or info.index in f.index


def capacity_views(gpus: Iterable[GpuInfo], settings: Any, mps_missing: bool = False) -> list[GpuView]:
    """Each GPU as the node books it: split count, scaling, filterDevices,
    the share modes it serves (``operatingMode``/``deviceModes``), whether it
    serves DRA (``draDevices``; one that names no GPU of the node is refused
    here) and the MIG profiles ``migProfileAllowlist`` leaves it.
    ``mps_missing``: NVIDIA's MPS programs are not there, so a GPU set to
    serve mps is marked and refuses it."""
    gpus = list(gpus)
    dra = dra_gpus(settings.draDevices, gpus)
    return [restrict_mig_profiles(gpu_view_from_info(g, split_count=settings.deviceSplitCount,
                                                     memory_scaling=settings.deviceMemoryScaling,
                                                     core_scaling=settings.deviceCoreScaling,
                                                     filtered=is_filtered(g, settings),
                                                     serves=settings.share_modes(g.index, g.uuid),
                                                     mps_missing=mps_missing, dra=g.uuid in dra),
                                  settings.migProfileAllowlist)
            for g in gpus]


def unlisted_mig_gpus(gpus: Iterable[GpuInfo], allowlist) -> list[GpuInfo]:
    """The MIG-capable GPUs no entry of a non-empty ``migProfileAllowlist``
    names: every profile of their table is allowed, which an allowlist
    written for them under another model name would not mean."""
    if not allowlist:
        return []
    out = []
    for g in gpus:
        if not g.mig_profiles:
            continue
        memory = max(p.memory_mib for p in g.mig_profiles)
        if not any(model_matches(m, g.name, memory) for e in allowlist for m in e.models):
            out.append(g)
    return out
