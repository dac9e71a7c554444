"""Looking into a container's root filesystem without leaving it.

The runtime runs as root on a rootfs the user controls. hamid never writes
into it (runc creates mount points itself, resolving them inside the rootfs),
but it refuses a container whose paths that hamid mounts over go through a
symbolic link: such a link could point at the host (compare NVIDIA's
CVE-2024-0132), and mounting "through" it would change the host's files.
"""

from __future__ import annotations

import os
import stat

from ..errors import HamidError


class UnsafeRootfs(HamidError):
    pass


def check_path(rootfs: str, container_path: str) -> None:
    """Refuse if any existing component of ``container_path`` is a symlink."""
    parts = [p for p in container_path.split("/") if p]
    cur = rootfs
    for i, part in enumerate(parts):
        if part in (".", ".."):
            raise UnsafeRootfs(f"refusing path {container_path!r}: it contains {part!r}")
        cur = os.path.join(cur, part)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return  # runc will create the rest inside the rootfs
        if stat.S_ISLNK(st.st_mode):
            shown = "/" + "/".join(parts[: i + 1])
            raise UnsafeRootfs(f"the container's {shown} is a symbolic link (to {os.readlink(cur)!r}); "
                               f"hamid will not mount {container_path} through it")
