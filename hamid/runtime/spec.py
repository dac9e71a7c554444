"""Edits to an OCI ``config.json``: env, mounts, device nodes, hooks.

:func:`apply_edits` writes a container's CDI-shaped edits (from
:func:`hamid.node.realize.realize`) into the spec. Edits replace what they
name (an env variable set twice keeps ours), and the file is rewritten
atomically (temporary name in the bundle, fsync, rename), so runc never reads
half a spec.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import HamidError
from ..node.edits import ContainerEdits, DeviceNode


class SpecError(HamidError):
    pass


def load(bundle: str) -> dict:
    path = Path(bundle) / "config.json"
    try:
        with open(path) as f:
            spec = json.load(f)
    except (OSError, ValueError) as e:
        raise SpecError(f"cannot read {path}: {e}") from None
    if not isinstance(spec, dict):
        raise SpecError(f"{path} is not a JSON object")
    return spec


def save(bundle: str, spec: dict) -> None:
    path = Path(bundle) / "config.json"
    tmp = path.with_name(".config.json.hamid-tmp")
    mode = os.stat(path).st_mode & 0o777
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def env_list(spec: dict) -> list[str]:
    return list((spec.get("process") or {}).get("env") or [])


def set_env(spec: dict, values: dict[str, str]) -> None:
    proc = spec.setdefault("process", {})
    env = [e for e in proc.get("env") or [] if e.partition("=")[0] not in values]
    env.extend(f"{k}={v}" for k, v in values.items())
    proc["env"] = env


def add_mount(spec: dict, destination: str, source: str, readonly: bool) -> None:
    mounts = [m for m in spec.get("mounts") or [] if m.get("destination") != destination]
    opts = ["rbind", "nosuid", "nodev", "ro" if readonly else "rw"]
    mounts.append({"destination": destination, "type": "bind", "source": source, "options": opts})
    spec["mounts"] = mounts


def add_devices(spec: dict, nodes: list[DeviceNode]) -> None:
    linux = spec.setdefault("linux", {})
    devices = [d for d in linux.get("devices") or [] if d.get("path") not in {n.path for n in nodes}]
    devices.extend({"path": n.path, "type": n.type, "major": n.major, "minor": n.minor,
                    "fileMode": n.file_mode, "uid": n.uid, "gid": n.gid} for n in nodes)
    linux["devices"] = devices
    rules = linux.setdefault("resources", {}).setdefault("devices", [])
    for n in nodes:
        rules.append({"allow": True, "type": n.type, "major": n.major, "minor": n.minor, "access": n.permissions})


def apply_edits(spec: dict, edits: ContainerEdits) -> None:
    """Write ``edits`` (env, mounts, device nodes with their cgroup rules, hooks) into ``spec``."""
    set_env(spec, edits.env_map())
    for m in edits.mounts:
        add_mount(spec, m.container_path, m.host_path, readonly=m.readonly)
    add_devices(spec, list(edits.device_nodes))
    for h in edits.hooks:
        hooks = spec.setdefault("hooks", {})
        entry = {"path": h.path, "args": list(h.args)}
        if h.timeout is not None:
            entry["timeout"] = h.timeout
        hooks.setdefault(h.hook_name, []).append(entry)


def add_poststop(spec: dict, path: str, args: list[str]) -> None:
    hooks = spec.setdefault("hooks", {})
    hooks.setdefault("poststop", []).append({"path": path, "args": args, "timeout": 60})


def rootfs(spec: dict, bundle: str) -> str:
    root = (spec.get("root") or {}).get("path") or "rootfs"
    return root if os.path.isabs(root) else os.path.join(bundle, root)


def user(spec: dict) -> tuple[int, int]:
    u = (spec.get("process") or {}).get("user") or {}
    return int(u.get("uid", 0)), int(u.get("gid", 0))
