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

import os

from ..node.cdispec import write_cdi_spec
from ..node.edits import ContainerEdits

KIND = "hamid.io/vgpu"


def device_name(slot: str) -> str:
    return f"{KIND}={slot}"


def spec_path(cdi_dir: str, slot: str) -> str:
    return os.path.join(cdi_dir, f"hamid.io-vgpu-{slot}.json")


def write_spec(cdi_dir: str, slot: str, edits: ContainerEdits) -> str:
    return write_cdi_spec(spec_path(cdi_dir, slot), KIND, [(slot, edits)])
