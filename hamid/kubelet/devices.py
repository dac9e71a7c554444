"""What kubelet sees of the node's GPUs: virtual device IDs, health, NUMA.

Each GPU is advertised as as many virtual devices as it takes tenants
(``deviceSplitCount``, or its MIG instance limit), with IDs ``<GPU UUID>-<n>``
(at most 63 characters, as kubelet requires), its NUMA node as topology, and
its health. The set of IDs kubelet gives one container names that
container's *slot* (its region directory, limits file and CDI device): kubelet
never gives the same device to two live containers, and hands an init
container's devices on to later containers of the same pod, which then share
the slot.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from ..placement.view import GpuView
from .api import HEALTHY, UNHEALTHY
from .api import deviceplugin_pb2 as pb


def device_id(uuid: str, n: int) -> str:
    return f"{uuid}-{n}"


def gpu_of(device: str) -> str:
    """The GPU UUID a virtual device ID belongs to."""
    uuid, sep, n = device.rpartition("-")
    if not sep or not n.isdigit() or not uuid:
        raise ValueError(f"device ID {device!r} is not one of hamid's (<GPU UUID>-<n>)")
    return uuid


def slot_of(devices: Iterable[str]) -> str:
    """The slot a set of device IDs names (a file name: ``k`` and 24 hex digits)."""
    digest = hashlib.sha256("\n".join(sorted(set(devices))).encode()).hexdigest()
    return "k" + digest[:24]


def advertised(gpus: Iterable[GpuView], health: dict[str, bool]) -> list[pb.Device]:
    """The full device list kubelet is sent (every ListAndWatch message is the whole list)."""
    out = []
    for g in gpus:
        if g.filtered:
            continue  # filterDevices: never handed out, not even registered
        ok = health.get(g.uuid, g.healthy)
        topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=g.numa)]) if g.numa is not None else None
        for n in range(g.shares_total):
            out.append(pb.Device(ID=device_id(g.uuid, n), health=HEALTHY if ok else UNHEALTHY, topology=topo))
    return out
