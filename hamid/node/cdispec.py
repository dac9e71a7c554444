"""A CDI spec file of a container's edits, as the device plugin's ``cdi-cri`` strategy and the DRA
plugin both hand them to the container runtime: one home for its shape and how it is written (whole,
mode 0644: the runtime reads it as another user)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

from ..atomicfile import replace_file
from .edits import ContainerEdits

CDI_VERSION = "0.6.0"  # containerd >= 1.7 and CRI-O read it


def write_cdi_spec(path: str, kind: str, devices: Sequence[tuple[str, ContainerEdits]]) -> str:
    """Writes the spec of ``kind`` naming each (device name, edits) at ``path``; returns ``path``."""
    entries = []
    for name, edits in devices:
        cdi = edits.to_cdi()
        if not cdi.get("hooks"):
            cdi.pop("hooks", None)
        entries.append({"name": name, "containerEdits": cdi})
    doc = {"cdiVersion": CDI_VERSION, "kind": kind, "devices": entries}
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    replace_file(path, json.dumps(doc, indent=1).encode(), 0o644)
    return path
