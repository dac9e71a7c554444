"""A container's region directory on a tmpfs of its own, so a tenant cannot fill the node's disk.

The region directory is the one host directory a container gets read-write
(its processes share the shim's region file there). On the state
directory's file system a tenant could write until the node's disk is
full; so the node mounts a small tmpfs on each region directory
(:data:`SIZE_BYTES`, nosuid, nodev, noexec) before the container starts and
unmounts it before the directory is removed. The region file is about
530 KB (1,024 process slots of 512 bytes); :data:`SIZE_BYTES` leaves room
for a larger region of a later shim. Needs CAP_SYS_ADMIN (the daemon and
the runtime run as root); in a pod, the state directory's mount must
propagate to the host (the chart sets ``mountPropagation: Bidirectional``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

from ..errors import HamidError

SIZE_BYTES = 4 << 20
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


class RegionMountError(HamidError):
    """The region directory's tmpfs could not be mounted."""


def is_mounted(path: str) -> bool:
    """Whether a file system is mounted exactly at ``path``."""
    try:
        return os.stat(path).st_dev != os.stat(os.path.dirname(path.rstrip("/"))).st_dev
    except FileNotFoundError:
        return False


def mount(path: str) -> None:
    """A fresh tmpfs at ``path`` (an existing directory of ours), unless one is there already."""
    if is_mounted(path):
        return
    opts = f"size={SIZE_BYTES},mode=0700".encode()
    if _libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts) != 0:
        err = ctypes.get_errno()
        raise RegionMountError(f"cannot mount a {SIZE_BYTES >> 20} MiB tmpfs on the region directory {path}: "
                               f"{os.strerror(err)} (the daemon needs CAP_SYS_ADMIN; set regionTmpfs: false to "
                               "keep region directories on the state directory's disk)")


def unmount(path: str) -> None:
    """Detach the tmpfs at ``path`` if one is there (none is fine)."""
    if not is_mounted(path):
        return
    if _libc.umount2(path.encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            raise RegionMountError(f"cannot unmount the region directory {path}: {os.strerror(err)}")
