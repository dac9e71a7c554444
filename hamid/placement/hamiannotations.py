"""HAMi's allocation annotations, written on a placed pod for the tools that read them.

hamid writes them so that dashboards, monitors and scripts built for HAMi
keep working; no hamid node ever reads them back: a node's own ledger is
the truth (the webhook refuses a pod created with them).

Encoding (HAMi's ``pkg/device/devices.go``): each device ``UUID,TYPE,memMiB,cores:``;
each container's devices then ``;``; init containers first; a container
with no device is an empty ``;``.
"""

from __future__ import annotations

import time

from ..kube.bindphase import ALLOCATING, BIND_PHASE, DEVICES_TO_ALLOCATE
from .result import Decision

VGPU_NODE = "hami.io/vgpu-node"
VGPU_TIME = "hami.io/vgpu-time"
DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
BIND_TIME = "hami.io/bind-time"
TYPE = "NVIDIA"


def encode_devices(decision: Decision) -> str:
    ordered = [c for c in decision.containers if c.init] + [c for c in decision.containers if not c.init]
    return "".join("".join(f"{d.uuid},{TYPE},{d.mem_mib},{d.cores}:" for d in c.devices) + ";" for c in ordered)


def allocation(decision: Decision, now: float | None = None) -> dict[str, str]:
    """The annotations that record ``decision`` on its pod, as HAMi writes them once bound."""
    t = str(int(now if now is not None else time.time()))
    enc = encode_devices(decision)
    return {VGPU_NODE: decision.node, VGPU_TIME: t, DEVICES_ALLOCATED: enc, DEVICES_TO_ALLOCATE: enc,
            BIND_PHASE: ALLOCATING, BIND_TIME: t}
