"""Device readings + node settings -> the capacity views the ledger keeps."""

from __future__ import annotations

from collections.abc import Iterable

from ..config import NodeSettings
from ..devices.types import GpuInfo
from ..placement.view import GpuView, gpu_view_from_info, restrict_mig_profiles


def is_filtered(info: GpuInfo, settings: NodeSettings) -> bool:
    f = settings.filterDevices
    return info.uuid in f.uuid or info.index in f.index


def capacity_views(gpus: Iterable[GpuInfo], settings: NodeSettings) -> list[GpuView]:
    """Each GPU as the node books it: split count, scaling, filterDevices and
    the MIG profiles ``migProfileAllowlist`` leaves it."""
    return [restrict_mig_profiles(gpu_view_from_info(g, split_count=settings.deviceSplitCount,
                                                     memory_scaling=settings.deviceMemoryScaling,
                                                     core_scaling=settings.deviceCoreScaling,
                                                     filtered=is_filtered(g, settings)),
                                  settings.migProfileAllowlist)
            for g in gpus]
