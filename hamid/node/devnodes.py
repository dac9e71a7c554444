"""GPU device nodes and MIG capability nodes, as the host has them.

Read once by the daemon at start-up (the GPUs' own nodes and the control
nodes, recorded in the node's facts) and at MIG admission (the capability
nodes of a new instance, recorded on the reservation), so that ``realize``
never touches the host.

Device numbers are read from the host's nodes (``stat``), never guessed. The
roots are configurable so a test node can point them at a directory of its own
nodes: ``dev_root`` (``/dev``) and ``caps_root``
(``/proc/driver/nvidia/capabilities``).
"""

from __future__ import annotations

import os
import stat

from ..errors import HamidError
from .edits import DeviceNode as Node

CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


class DeviceNodeError(HamidError):
    pass


def _node(host_path: str, container_path: str) -> Node | None:
    try:
        st = os.stat(host_path)
    except FileNotFoundError:
        return None
    if not stat.S_ISCHR(st.st_mode):
        raise DeviceNodeError(f"{host_path} is not a character device")
    return Node(container_path, host_path, os.major(st.st_rdev), os.minor(st.st_rdev), file_mode=stat.S_IMODE(st.st_mode))


def gpu_node(dev_root: str, minor: int) -> Node | None:
    """A GPU's own node (``/dev/nvidia<minor>``), or None where the host has none."""
    return _node(os.path.join(dev_root, f"nvidia{minor}"), f"/dev/nvidia{minor}")


def control_nodes(dev_root: str) -> list[Node]:
    """The driver's control nodes that exist on the host (``nvidiactl``, ``nvidia-uvm``...)."""
    return [n for name in CONTROL_NODES if (n := _node(os.path.join(dev_root, name), f"/dev/{name}")) is not None]


def _access_minor(path: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "DeviceFileMinor":
                    return int(value.strip())
    except (OSError, ValueError) as e:
        raise DeviceNodeError(f"cannot read MIG capability {path}: {e}") from None
    raise DeviceNodeError(f"{path} has no DeviceFileMinor line")


def mig_cap_nodes(dev_root: str, caps_root: str, gpu_minor: int, gi: int, ci: int, required: bool) -> list[Node]:
    """The two ``nvidia-cap`` nodes giving access to one GPU and compute instance."""
    base = os.path.join(caps_root, f"gpu{gpu_minor}", "mig", f"gi{gi}")
    files = [os.path.join(base, "access"), os.path.join(base, f"ci{ci}", "access")]
    if not all(os.path.exists(f) for f in files):
        if required:
            raise DeviceNodeError(f"MIG capability files under {base} are missing")
        return []
    out = []
    for f in files:
        minor = _access_minor(f)
        host = os.path.join(dev_root, "nvidia-caps", f"nvidia-cap{minor}")
        n = _node(host, f"/dev/nvidia-caps/nvidia-cap{minor}")
        if n is None:
            major = _caps_major()
            n = Node(f"/dev/nvidia-caps/nvidia-cap{minor}", host, major, minor, file_mode=0o444)
        out.append(n)
    return out


def _caps_major() -> int:
    try:
        with open("/proc/devices") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and parts[1] == "nvidia-caps":
                    return int(parts[0])
    except OSError:
        pass
    raise DeviceNodeError("cannot find the nvidia-caps major number in /proc/devices")
