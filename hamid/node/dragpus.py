"""Which of the node's GPUs serve Dynamic Resource Allocation (``draDevices``).

One home for the answer: the node's capacity views carry it (``GpuView.dra``,
gossiped with them), so placement never chooses these GPUs for a device-plugin
pod or a Docker container that does not name them, wherever it runs; the DRA
face serves exactly these, the device plugin leaves them out, so a GPU is
never offered through both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from ..errors import HamidError


class _Gpu(Protocol):
    """What names a GPU: a reading (``GpuInfo``) or a view (``GpuView``)."""

    @property
    def uuid(self) -> str: ...

    @property
    def index(self) -> int: ...


class DraDevicesError(HamidError):
    """``draDevices`` names GPUs this node does not have."""


def dra_gpus(spec: str, gpus: Iterable[_Gpu]) -> frozenset[str]:
    """The UUIDs of the GPUs ``spec`` names: ``all``, or comma-separated indexes and UUIDs; empty: none."""
    items = [s.strip() for s in spec.split(",") if s.strip()]
    gpus = list(gpus)
    if items == ["all"]:
        return frozenset(g.uuid for g in gpus)
    out = set()
    for item in items:
        g = next((g for g in gpus if item in (g.uuid, str(g.index))), None)
        if g is None:
            raise DraDevicesError(f"draDevices: {item!r} is not a GPU of this node; accepted: all, or indexes "
                                  f"({', '.join(str(g.index) for g in gpus)}) and UUIDs of its GPUs")
        out.add(g.uuid)
    return frozenset(out)
