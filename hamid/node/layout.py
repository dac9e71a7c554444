"""Where the node keeps things: in the state directory and in a container.

The state directory (``/var/lib/hamid`` by default, mode 0700) holds the
ledger, the facts the daemon found at start-up, the installed shim, and one
entry per GPU container in each of ``containers/`` (its shared-region
directory, owned by the container's user so its processes can share the
region file) and ``limits/`` (its limits file, owned by root and mounted
read-only, so no process in the container can change it). ``mps/<GPU uuid>/``
holds the pipe and log directories of that GPU's MPS control daemon
(hamid.node.mps). ``released/``
holds release requests from poststop hooks that could not reach the daemon.

A container's *slot* names its entries: a Docker container's id, or
``<pod uid>_<container name>`` for a container of a pod.
"""

from __future__ import annotations

import os
import re

from ..errors import HamidError

LEDGER_NAME = "ledger.db"
LOCK_NAME = "hamid.lock"
FACTS_NAME = "node.json"
SOCKET_NAME = "hamid.sock"
DOCKER_SOCKET_NAME = "docker.sock"  # the Docker face's creates (the C hamid-runtime)
STOPPED_NAME = "stopped.json"  # processes the bypass guard stopped (hamid.shimlimits.bypass), for a restart
CONTAINERS_DIR = "containers"
LIMITS_DIR = "limits"
RELEASED_DIR = "released"
SHIM_DIR = "shim"
MPS_DIR = "mps"

SHIM_IN_CONTAINER = "/usr/local/vgpu/libvgpu.so"
LIMITS_IN_CONTAINER = "/usr/local/vgpu/hamid.limits"
PRELOAD_IN_CONTAINER = "/etc/ld.so.preload"
REGION_DIR_IN_CONTAINER = "/run/hamid"
REGION_FILE_IN_CONTAINER = REGION_DIR_IN_CONTAINER + "/vgpu.cache"
MPS_PIPE_IN_CONTAINER = "/run/hamid-mps"  # an MPS share's GPU pipe directory (hamid.node.mps, the shim's HAMID_MPS_PIPE_DIR)


# One path component of ours: no separator, no leading dot (so never "." or
# ".."), printable ASCII only. Pod UIDs, Docker ids and Kubernetes container
# names (DNS labels) all fit; 255 is the file-name limit of every Linux file system.
_COMPONENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$")


class LayoutError(HamidError):
    """A name the node would turn into a path is not one plain path component."""


def component(name: object, what: str = "name") -> str:
    """``name`` if it is one safe path component, else :class:`LayoutError`.
    Every name the node derives a path from passes here, whoever sent it."""
    if not isinstance(name, str) or not _COMPONENT.match(name):
        shown = repr(name)[:80]
        raise LayoutError(f"{what}: bad value {shown}; accepted: 1 to 255 letters, digits, '_', '.', '-', "
                          "not starting with '.', '_' or '-'")
    return name


def slot(owner_kind: str, uid: str, container: str) -> str:
    """The name of a container's entries under ``containers/`` and ``limits/``."""
    return component(uid if owner_kind == "docker" else f"{uid}_{container}", "container slot")


def region_dir(state_dir: str | os.PathLike, slot_name: str) -> str:
    return os.path.join(state_dir, CONTAINERS_DIR, component(slot_name, "container slot"))


def limits_file(state_dir: str | os.PathLike, slot_name: str) -> str:
    return os.path.join(state_dir, LIMITS_DIR, component(slot_name, "container slot"))
