"""CDI specs for the device plugin's ``cdi-cri`` strategy: one spec per slot.

``Allocate`` answers with the CDI device ``hamid.io/vgpu=<slot>`` only; the
container runtime (containerd, CRI-O) resolves it when it creates the
container, which kubelet does right after ``PreStartContainer``. By then hamid
knows the pod and has written the spec: the edits ``realize`` gives that
container from its reservation, so nothing the container gets depends on
which virtual device IDs kubelet chose. Specs are written atomically
(temporary name, fsync, rename), mode 0644, and removed with the reservation.
"""

from __future__ import annotations

import json
import os

from ..node.edits import ContainerEdits

KIND = "hamid.io/vgpu"
CDI_VERSION = "0.6.0"  # containerd >= 1.7 and CRI-O read it


def device_name(slot: str) -> str:
    return f"{KIND}={slot}"


def spec_path(cdi_dir: str, slot: str) -> str:
    return os.path.join(cdi_dir, f"hamid.io-vgpu-{slot}.json")


def write_spec(cdi_dir: str, slot: str, edits: ContainerEdits) -> str:
    cdi = edits.to_cdi()
    if not cdi["hooks"]:
        del cdi["hooks"]
    doc = {"cdiVersion": CDI_VERSION, "kind": KIND, "devices": [{"name": slot, "containerEdits": cdi}]}
    os.makedirs(cdi_dir, mode=0o755, exist_ok=True)
    path = spec_path(cdi_dir, slot)
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path
