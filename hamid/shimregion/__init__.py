"""hamid.shimregion: the daemon's side of the shim's shared region.

Owns reading a container's region file (layout: shim/include/hamid_region.h,
parsed by cffi from that same header) read-only, and exporting what it holds
as Prometheus metrics. It never writes to a region and never talks to the
GPU; the shim (shim/) is the only writer.
"""

from hamid.shimregion.reader import (
    DeviceUsage,
    ProcessUsage,
    RegionError,
    RegionRefused,
    RegionSnapshot,
    read_region,
)
from hamid.shimregion.collector import ShimRegionCollector, register_collector

__all__ = [
    "DeviceUsage",
    "ProcessUsage",
    "RegionError",
    "RegionRefused",
    "RegionSnapshot",
    "ShimRegionCollector",
    "read_region",
    "register_collector",
]
