"""What a container gets: CDI's ``containerEdits``, as plain data.

``realize`` produces these; each face delivers them its own way: the Docker
runtime applies them to the bundle's ``config.json``, the device plugin turns
them into its ``Allocate`` answer or a CDI spec. Field names follow the CDI
specification (v1.1): ``env`` as ``NAME=value`` strings, ``deviceNodes``,
``mounts`` and ``hooks``. Order is kept: it is part of what a runtime sees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DeviceNode:
    path: str  # inside the container
    host_path: str
    major: int
    minor: int
    file_mode: int = 0o666
    type: str = "c"
    permissions: str = "rwm"
    uid: int = 0
    gid: int = 0

    def to_cdi(self) -> dict[str, Any]:
        return {"path": self.path, "hostPath": self.host_path, "type": self.type, "major": self.major,
                "minor": self.minor, "fileMode": self.file_mode, "permissions": self.permissions,
                "uid": self.uid, "gid": self.gid}

    @classmethod
    def from_cdi(cls, d: dict[str, Any]) -> "DeviceNode":
        return cls(path=d["path"], host_path=d.get("hostPath", d["path"]), major=int(d["major"]),
                   minor=int(d["minor"]), file_mode=int(d.get("fileMode", 0o666)), type=d.get("type", "c"),
                   permissions=d.get("permissions", "rwm"), uid=int(d.get("uid", 0)), gid=int(d.get("gid", 0)))


@dataclass(frozen=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ("rbind", "nosuid", "nodev", "ro")
    type: str = "bind"

    @property
    def readonly(self) -> bool:
        return "ro" in self.options

    def to_cdi(self) -> dict[str, Any]:
        return {"hostPath": self.host_path, "containerPath": self.container_path, "type": self.type,
                "options": list(self.options)}

    @classmethod
    def from_cdi(cls, d: dict[str, Any]) -> "Mount":
        return cls(host_path=d["hostPath"], container_path=d["containerPath"],
                   options=tuple(d.get("options") or ()), type=d.get("type", "bind"))


@dataclass(frozen=True)
class Hook:
    hook_name: str  # an OCI hook point: createRuntime, poststop, ...
    path: str
    args: tuple[str, ...] = ()
    timeout: int | None = None

    def to_cdi(self) -> dict[str, Any]:
        d: dict[str, Any] = {"hookName": self.hook_name, "path": self.path, "args": list(self.args)}
        if self.timeout is not None:
            d["timeout"] = self.timeout
        return d

    @classmethod
    def from_cdi(cls, d: dict[str, Any]) -> "Hook":
        return cls(hook_name=d["hookName"], path=d["path"], args=tuple(d.get("args") or ()),
                   timeout=d.get("timeout"))


@dataclass(frozen=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = field(default=())

    def to_cdi(self) -> dict[str, Any]:
        return {"env": list(self.env), "deviceNodes": [n.to_cdi() for n in self.device_nodes],
                "mounts": [m.to_cdi() for m in self.mounts], "hooks": [h.to_cdi() for h in self.hooks]}

    @classmethod
    def from_cdi(cls, d: dict[str, Any]) -> "ContainerEdits":
        return cls(env=tuple(d.get("env") or ()),
                   device_nodes=tuple(DeviceNode.from_cdi(x) for x in d.get("deviceNodes") or ()),
                   mounts=tuple(Mount.from_cdi(x) for x in d.get("mounts") or ()),
                   hooks=tuple(Hook.from_cdi(x) for x in d.get("hooks") or ()))
