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

from ..errors import HamidError


class SpecError(HamidError):
    pass


def load(bundle: str) -> dict:
    path = os.path.join(bundle, "config.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            spec = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        raise SpecError(f"cannot read {path}: {e}") from None
    if not isinstance(spec, dict):
        raise SpecError(f"{path} is not a JSON object")
    return spec


def save(bundle: str, spec: dict) -> None:
    path = os.path.join(bundle, "config.json")
    tmp = os.path.join(bundle, ".config.json.hamid-tmp")
    mode = os.stat(path).st_mode & 0o777
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _process(spec: dict) -> dict:
    proc = spec.get("process") or {}
    if not isinstance(proc, dict):
        raise SpecError("config.json: process must be an object")
    return proc


def env_list(spec: dict) -> list[str]:
    env = _process(spec).get("env") or []
    if not isinstance(env, list) or not all(isinstance(e, str) for e in env):
        raise SpecError("config.json: process.env must be a list of NAME=value strings")
    return list(env)


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


def add_devices(spec: dict, nodes: list[dict]) -> None:
    """CDI ``deviceNodes`` entries as OCI ``linux.devices``, each with its cgroup rule."""
    linux = spec.setdefault("linux", {})
    paths = {n["path"] for n in nodes}
    devices = [d for d in linux.get("devices") or [] if d.get("path") not in paths]
    devices.extend({"path": n["path"], "type": n.get("type", "c"), "major": n["major"], "minor": n["minor"],
                    "fileMode": n.get("fileMode", 0o666), "uid": n.get("uid", 0), "gid": n.get("gid", 0)}
                   for n in nodes)
    linux["devices"] = devices
    rules = linux.setdefault("resources", {}).setdefault("devices", [])
    for n in nodes:
        rules.append({"allow": True, "type": n.get("type", "c"), "major": n["major"], "minor": n["minor"],
                      "access": n.get("permissions", "rwm")})


def apply_edits(spec: dict, edits) -> None:
    """Write a container's edits (CDI ``containerEdits``: a dict, or a
    :class:`hamid.node.edits.ContainerEdits`) into ``spec``: env, mounts,
    device nodes with their cgroup rules, hooks."""
    cdi = edits.to_cdi() if hasattr(edits, "to_cdi") else edits
    set_env(spec, dict(e.split("=", 1) for e in cdi.get("env") or ()))
    for m in cdi.get("mounts") or ():
        add_mount(spec, m["containerPath"], m["hostPath"], readonly="ro" in (m.get("options") or ()))
    add_devices(spec, list(cdi.get("deviceNodes") or ()))
    for h in cdi.get("hooks") or ():
        entry = {"path": h["path"], "args": list(h.get("args") or ())}
        if h.get("timeout") is not None:
            entry["timeout"] = h["timeout"]
        spec.setdefault("hooks", {}).setdefault(h["hookName"], []).append(entry)


def add_poststop(spec: dict, path: str, args: list[str]) -> None:
    hooks = spec.setdefault("hooks", {})
    hooks.setdefault("poststop", []).append({"path": path, "args": args, "timeout": 60})


def rootfs(spec: dict, bundle: str) -> str:
    root = (spec.get("root") or {}).get("path") or "rootfs"
    return root if os.path.isabs(root) else os.path.join(bundle, root)


def user(spec: dict) -> tuple[int, int]:
    u = _process(spec).get("user") or {}
    if not isinstance(u, dict):
        raise SpecError("config.json: process.user must be an object")
    out = []
    for k in ("uid", "gid"):
        v = u.get(k, 0)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**32:
            raise SpecError(f"config.json: process.user.{k} must be an integer from 0 to 4294967295, got {v!r}")
        out.append(v)
    return out[0], out[1]
