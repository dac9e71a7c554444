"""The node's facts: what the daemon found at start-up, for ``realize`` and the runtime.

The daemon writes them once (``node.json`` in the state directory,
atomically, mode 0600): the device backend (to reopen it where no daemon
answers), the GPUs' device nodes and the control nodes with their numbers,
the shim's installed paths, the device roots, the request defaults and the
node policy. ``realize`` reads nothing else about the host, so it stays a
pure function; the runtime reads ``node.json`` without heavy imports.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import HamidError
from .edits import DeviceNode
from .layout import FACTS_NAME


@dataclass(frozen=True)
class NodeFacts:
    node: str
    state_dir: str
    backend: dict[str, Any]  # {"kind": "nvml"|"simulated", "simulate": spec|None, "mig_enabled": bool}
    gpu_minors: dict[str, int] = field(default_factory=dict)  # uuid -> minor
    gpu_nodes: dict[str, DeviceNode] = field(default_factory=dict)  # uuid -> /dev/nvidia<minor>
    control_nodes: tuple[DeviceNode, ...] = ()
    dev_root: str = "/dev"
    caps_root: str = "/proc/driver/nvidia/capabilities"
    shim_library: str | None = None
    shim_preload: str | None = None
    defaults: dict[str, int] = field(default_factory=dict)  # Defaults' fields
    node_policy: str = "binpack"
    region_tmpfs: bool = True  # region directories on a tmpfs of their own (node/regionfs.py)
    core_policy: str = "default"  # gpuCorePolicy: GPU_CORE_UTILIZATION_POLICY unless a container asks force
    compute_bypass: str = "stop"  # computeBypass: stop or only report a container its shim does not charge
    memory_bypass: str = "kill"  # memoryBypass: kill or only report unshimmed processes over a memory limit
    mps_control: str | None = None  # nvidia-cuda-mps-control's path, where some GPU serves MPS and it was found
    mps_dir: str | None = None  # mpsDir: where the GPUs' MPS pipe and log directories are (None: stateDir/mps)
    mps_missing: str | None = None  # why MPS cannot run here though some GPU serves it (its programs not found)

    @property
    def real(self) -> bool:
        """A real driver: every device node must exist (simulated GPUs may have none)."""
        return self.backend.get("kind") == "nvml"

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "state_dir": self.state_dir, "backend": self.backend,
                "gpu_minors": self.gpu_minors,
                "gpu_nodes": {u: n.to_cdi() for u, n in self.gpu_nodes.items()},
                "control_nodes": [n.to_cdi() for n in self.control_nodes],
                "dev_root": self.dev_root, "caps_root": self.caps_root,
                "shim": {"library": self.shim_library, "preload": self.shim_preload},
                "defaults": self.defaults, "node_policy": self.node_policy, "region_tmpfs": self.region_tmpfs,
                "core_policy": self.core_policy, "compute_bypass": self.compute_bypass,
                "memory_bypass": self.memory_bypass,
                "mps_control": self.mps_control, "mps_dir": self.mps_dir, "mps_missing": self.mps_missing}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NodeFacts":
        shim = d.get("shim") or {}
        return cls(node=d["node"], state_dir=d["state_dir"], backend=dict(d["backend"]),
                   gpu_minors={u: int(m) for u, m in (d.get("gpu_minors") or {}).items()},
                   gpu_nodes={u: DeviceNode.from_cdi(n) for u, n in (d.get("gpu_nodes") or {}).items()},
                   control_nodes=tuple(DeviceNode.from_cdi(n) for n in d.get("control_nodes") or ()),
                   dev_root=d.get("dev_root", "/dev"),
                   caps_root=d.get("caps_root", "/proc/driver/nvidia/capabilities"),
                   shim_library=shim.get("library"), shim_preload=shim.get("preload"),
                   defaults=dict(d.get("defaults") or {}), node_policy=d.get("node_policy", "binpack"),
                   region_tmpfs=bool(d.get("region_tmpfs", True)), core_policy=d.get("core_policy", "default"),
                   compute_bypass=d.get("compute_bypass", "stop"), memory_bypass=d.get("memory_bypass", "kill"),
                   mps_control=d.get("mps_control"), mps_dir=d.get("mps_dir"), mps_missing=d.get("mps_missing"))


def write_facts(state_dir: str | Path, facts: NodeFacts) -> None:
    path = Path(state_dir) / FACTS_NAME
    tmp = path.with_name(FACTS_NAME + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(facts.to_dict(), f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_facts(state_dir: str | Path) -> NodeFacts:
    path = Path(state_dir) / FACTS_NAME
    try:
        with open(path) as f:
            return NodeFacts.from_dict(json.load(f))
    except FileNotFoundError:
        raise HamidError(f"no {path}: start the daemon once (hamid run --state-dir {state_dir}), "
                         "or give this runtime the daemon's --state-dir") from None
    except (ValueError, KeyError, TypeError) as e:
        raise HamidError(f"{path} is not a node facts file of this hamid ({e!r}): restart the daemon "
                         "to rewrite it") from None
