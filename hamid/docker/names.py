"""A Docker container's name (``docker run --name``), found from its OCI bundle.

runc's ``config.json`` carries no container name; Docker keeps it in
``<data-root>/containers/<id>/config.v2.json`` (``"Name": "/myjob"``), written
at ``docker create``, before the runtime is called. The bundle names that
directory without our knowing Docker's data root: Docker bind-mounts
``<data-root>/containers/<id>/hostname`` at ``/etc/hostname`` (whatever the
storage driver). The name is for display only (``hamid status``, logs,
``hamid inspect``); the reservation's identity stays the container id, so a
lookup that fails (another engine, a moved file) costs the name, nothing else:
the caller shows the short id.

Trust: the spec comes from dockerd (root); the file read is checked to sit in
a directory named after this container's id, owned by root, a regular file of
at most :data:`MAX_BYTES`, and the name must match Docker's own rule for
names, so nothing a container sends can make us read elsewhere or print
something odd.
"""

from __future__ import annotations

import json
import os
import re
import stat

MAX_BYTES = 4 << 20  # config.v2.json holds the container's config; a few KiB, 4 MiB is far above any seen
# Docker's rule for container names (daemon/names: validContainerNamePattern)
NAME_RE = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,254}")


def docker_name(spec: dict, cid: str) -> str | None:
    """The container's name without Docker's leading '/', or None when it cannot be known."""
    for m in spec.get("mounts") or ():
        if not isinstance(m, dict) or m.get("destination") != "/etc/hostname":
            continue
        src = m.get("source")
        if not isinstance(src, str) or os.path.basename(src) != "hostname":
            return None
        folder = os.path.dirname(src)
        if os.path.basename(folder) != cid:
            return None
        return _read_name(os.path.join(folder, "config.v2.json"))
    return None


def _read_name(path: str) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_size > MAX_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            doc = json.loads(f.read(MAX_BYTES + 1))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    name = doc.get("Name") if isinstance(doc, dict) else None
    if not isinstance(name, str):
        return None
    name = name.removeprefix("/")
    return name if NAME_RE.fullmatch(name) else None
