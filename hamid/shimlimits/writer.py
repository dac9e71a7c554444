"""Writing a container's limits file, atomically.

Owns putting :func:`encode`'s bytes at a path on the host so that a reader
(the shim, through the read-only mount) only ever sees the old file or the
whole new one: a fresh temporary name in the same directory (O_EXCL,
O_NOFOLLOW), mode 0644, fsync, rename over the target, fsync of the
directory. A symbolic link at the target is replaced, never followed; the
file's owner is whoever runs this (the daemon: root), which the shim checks.

And the file's live parts, :func:`write_hold_pids` (a GPU's list of
higher-priority processes, NVML pids, whose busy kernels hold this container's
launches back), :func:`write_share` (the sharing correction of the
container's charge on a GPU, hamid/shimlimits/live.py) and
:func:`write_others_active` (another container on the GPU launched kernels
recently: policy default limits). They change while the
container runs, and a bind mount of one file keeps the inode it was given, so
they are written in place (one pwrite each), on a regular file of the expected
size and owner only.
"""

from __future__ import annotations

import os
import secrets
import stat

from hamid.errors import HamidError
from hamid.logs import get_logger
import struct

from hamid.shimlimits.codec import (ContainerLimits, encode, hold_pids_offset, limits_size, max_hold, others_offset,
                                    share_offset, share_range)

log = get_logger("shimlimits")

MODE = 0o644


def write_limits_file(path: str | os.PathLike[str], limits: ContainerLimits, *, durable: bool = True) -> None:
    """``durable`` False: neither the file nor its directory is fsynced (still atomic for a reader: the
    old file or the whole new one); for a caller that restores the file after a crash itself (the
    node core: from the ledger at start-up)."""
    data = encode(limits)
    path = os.fspath(path)
    parent, name = os.path.split(os.path.abspath(path))
    if not name:
        raise HamidError(f"limits file {path!r}: expected a file name, not a directory")
    try:
        dfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise HamidError(f"limits file {path}: cannot open its directory {parent}: {e.strerror}") from e
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    try:
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, MODE,
                         dir_fd=dfd)
        except OSError as e:
            raise HamidError(f"limits file {path}: cannot create {tmp} in {parent}: {e.strerror}") from e
        try:
            os.fchmod(fd, MODE)  # whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if durable:
                os.fsync(fd)
        except OSError as e:
            os.close(fd)
            os.unlink(tmp, dir_fd=dfd)
            raise HamidError(f"limits file {path}: writing {tmp}: {e.strerror}") from e
        os.close(fd)
        try:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as e:
            os.unlink(tmp, dir_fd=dfd)
            raise HamidError(f"limits file {path}: cannot put it in place: {e.strerror}") from e
        if durable:
            os.fsync(dfd)
    finally:
        os.close(dfd)
    log.debug("limits file written", path=path, devices=len(limits.devices), region=limits.region_path)


def write_hold_pids(path: str | os.PathLike[str], device: int, pids: list[int] | tuple[int, ...]) -> None:
    """Replace device ``device``'s hold list in the limits file at ``path`` (in place)."""
    n = max_hold()
    pids = sorted({int(p) for p in pids})
    if len(pids) > n or any(not 0 < p < 2**31 for p in pids):
        raise HamidError(f"hold pids {pids}: at most {n} pids, each 1..2147483647")
    _pwrite_live(path, struct.pack(f"<{n}i", *(pids + [0] * (n - len(pids)))), hold_pids_offset(device),
                 "the hold list")


def write_share(path: str | os.PathLike[str], device: int, share_milli: int) -> None:
    """Set device ``device``'s sharing correction (1/1000; 0: none) in the limits file at ``path`` (in place)."""
    lo, hi = share_range()
    if isinstance(share_milli, bool) or not isinstance(share_milli, int) or not (
            share_milli == 0 or lo <= share_milli <= hi):
        raise HamidError(f"share_milli={share_milli!r}: expected 0 (none) or {lo}..{hi}")
    _pwrite_live(path, struct.pack("<I", share_milli), share_offset(device), "the sharing correction")


def write_others_active(path: str | os.PathLike[str], device: int, active: bool) -> None:
    """Say in device ``device``'s live part whether another container on that GPU launched kernels within the
    window (policy default limits while it does), in place."""
    if not isinstance(active, bool):
        raise HamidError(f"others_active={active!r}: expected True or False")
    _pwrite_live(path, struct.pack("<I", int(active)), others_offset(device), "others_active")


def _pwrite_live(path: str | os.PathLike[str], data: bytes, offset: int, what: str) -> None:
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        raise HamidError(f"limits file {path}: cannot open it to update {what}: {e.strerror}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != limits_size() or st.st_uid != os.geteuid():
            raise HamidError(f"limits file {path}: not a limits file of ours (a regular file of {limits_size()} "
                             f"bytes owned by uid {os.geteuid()}); {what} not written")
        if os.pwrite(fd, data, offset) != len(data):
            raise HamidError(f"limits file {path}: short write of {what}")
    finally:
        os.close(fd)
