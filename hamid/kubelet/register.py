"""HAMi's node annotations, written as HAMi's device plugin writes them.

HAMi's tools (HAMi-WebUI, scripts, HAMi's own scheduler) learn a node's GPUs
from two annotations on the Node:

``hami.io/node-nvidia-register``
    HAMi's v2.8+ format: a JSON array, one object per GPU, fields in this
    order and left out when empty/zero/false (Go's ``omitempty``): ``id`` (the
    UUID), ``index``, ``count`` (tenants per GPU: ``deviceSplitCount``; in MIG
    mode the largest instance count of its profiles), ``devmem`` (MiB, times
    ``deviceMemoryScaling`` outside MIG mode), ``devcore`` (100 times
    ``deviceCoreScaling``; 100 in MIG mode), ``type`` (the NVML name,
    ``NVIDIA-`` prefixed unless it starts with "NVIDIA"), ``numa``, ``mode``
    (``hami-core`` or ``mig``), ``migProfiles`` (MIG mode only: ``name``,
    ``memoryMB``, ``core`` = the profile's SMs in percent of the largest
    profile's, rounded up, ``sliceCount``, ``placements`` [{``start``,
    ``size``}]), ``health``. GPUs excluded by ``filterDevices`` are not listed,
    nor those that serve DRA (``draDevices``): HAMi's scheduler would place
    device-plugin pods there.

``hami.io/node-handshake``
    ``Requesting_<YYYY-MM-DD HH:MM:SS>`` (the node's local time), which HAMi's
    scheduler reads as "registered, fresh" for 60 s: refreshed with every
    write (:data:`REFRESH_S`).

Pure functions here; the kubelet face patches them onto its Node.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

from ..devices.types import GpuInfo
from ..placement.view import MODE_MIG, GpuView

REGISTER = "hami.io/node-nvidia-register"
HANDSHAKE = "hami.io/node-handshake"
# HAMi's device plugin rewrites its annotations every 30 s; its scheduler
# trusts a handshake for 60 s, so a write every 30 s is never stale.
REFRESH_S = 30.0


def hami_model(name: str) -> str:
    """The ``type`` HAMi's device plugin registers for an NVML name."""
    return name if name.startswith("NVIDIA") else f"NVIDIA-{name}"


def register_devices(views: list[GpuView], infos: dict[str, GpuInfo]) -> list[dict[str, Any]]:
    """One object per GPU, HAMi's fields in HAMi's order, empty ones left out."""
    out = []
    for g in views:
        if g.filtered or g.dra:
            continue
        info = infos.get(g.uuid)
        mig = g.mode == MODE_MIG
        d: dict[str, Any] = {"id": g.uuid, "index": g.index, "count": g.shares_total,
                             "devmem": (info.memory_mib if info is not None else g.mem_total) if mig else g.mem_total,
                             "devcore": 100 if mig else g.cores_total, "type": hami_model(g.name),
                             "numa": g.numa or 0, "mode": "mig" if mig else "hami-core"}
        if mig:
            full = max((p.sm_count for p in g.mig_profiles), default=0)
            d["migProfiles"] = [{"name": p.name, "memoryMB": p.memory_mib,
                                 "core": math.ceil(p.sm_count * 100 / full) if full else 0,
                                 "sliceCount": p.slices,
                                 "placements": [{"start": pl.start, "size": pl.size} for pl in p.placements]}
                                for p in g.mig_profiles]
            d["count"] = max((p.max_instances for p in g.mig_profiles), default=0)
        d["health"] = g.healthy
        out.append({k: v for k, v in d.items() if v not in (0, "", False, None, [])})
    return out


def register_annotation(views: list[GpuView], infos: dict[str, GpuInfo]) -> str:
    """The annotation's value: compact JSON, as Go's ``json.Marshal`` writes it."""
    return json.dumps(register_devices(views, infos), separators=(",", ":"))


def handshake_value(now: datetime | None = None) -> str:
    """``Requesting_`` and the time in Go's ``time.DateTime`` layout, local time."""
    return "Requesting_" + (now or datetime.now()).strftime("%Y-%m-%d %H:%M:%S")
