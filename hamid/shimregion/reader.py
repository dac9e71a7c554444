"""Read-only access to one container's shim region, through cffi.

Owns: locating the region header (hamid_region.h, the same file the shim is
compiled from), turning its HAMID_CDEF block into a cffi cdef, opening a
region file safely (no-follow, non-blocking, a regular file of an accepted
owner, within a size cap: the directory is the container's, so whatever sits
there may be hostile), copying it with one pread (not a mapping: the
container can truncate its file, and a truncated mapping kills the reader
with SIGBUS), validating magic / ABI version / struct size, and returning a
plain snapshot (per-device and per-process usage). Must not write to the
file, take its lock, or judge liveness of pids (they live in the container's
pid namespace, not ours).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import cffi

_HERE = Path(__file__).resolve().parent
_HEADER_CANDIDATES = (
    Path(__file__).parent / "hamid_region.h",  # packaged copy (a symlink in the source tree)
    _HERE.parent.parent / "shim" / "include" / "hamid_region.h",  # source checkout
)


# A region is one struct hamid_region (about 0.5 MiB); a later ABI may grow it,
# never by this much. Larger files are refused without being read.
MAX_REGION_BYTES = 16 << 20
_OPEN_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY


class RegionError(Exception):
    """A region file that is missing, too small, or not one we can read."""


class RegionRefused(RegionError):
    """A file in a region's place that is not one to open: a symbolic link, a
    FIFO, a device, a directory, a file of another owner, a hard link or an
    oversized file. ``reason`` is a short word for logs and metrics."""

    def __init__(self, path: str, reason: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.reason = reason


def header_path() -> Path:
    for p in _HEADER_CANDIDATES:
        if p.is_file():
            return p
    raise RegionError(f"hamid_region.h not found (looked in {', '.join(map(str, _HEADER_CANDIDATES))})")


def cdef_source(text: str) -> str:
    m = re.search(r"/\* HAMID_CDEF_BEGIN \*/(.*?)/\* HAMID_CDEF_END \*/", text, re.S)
    if not m:
        raise RegionError("hamid_region.h has no HAMID_CDEF_BEGIN/END block")
    return m.group(1)


@lru_cache(maxsize=1)
def _ffi() -> cffi.FFI:
    ffi = cffi.FFI()
    ffi.cdef(cdef_source(header_path().read_text()))
    return ffi


def _consts() -> dict[str, int]:
    ffi = _ffi()
    lib = ffi.dlopen(None)
    names = ("HAMID_REGION_MAGIC", "HAMID_REGION_ABI_VERSION", "HAMID_MAX_DEVICES", "HAMID_MAX_PROCS")
    return {n: int(getattr(lib, n)) for n in names}


def region_struct_size() -> int:
    return _ffi().sizeof("struct hamid_region")


@dataclass(frozen=True)
class DeviceUsage:
    index: int
    uuid: str
    limit_bytes: int
    used_bytes: int
    peak_used_bytes: int
    oom_count: int
    sm_limit_percent: int
    context_bytes: int
    gpu_time_ns: int
    throttle_ns: int
    launches: int
    last_kernel_realtime_ns: int
    schedule_ns: int  # the limiter's schedule (CLOCK_MONOTONIC): with time slots, where queued work ends


@dataclass(frozen=True)
class ProcessUsage:
    slot: int
    pid: int
    start_time: int
    used_bytes: dict[int, int] = field(default_factory=dict)
    context_bytes: dict[int, int] = field(default_factory=dict)
    # the pid NVML, called in the container, lists it by: the host's pid where the driver ignores pid
    # namespaces, its own where the driver translates (580 does); 0 = not known (or an ABI 1 file)
    nvml_pid: int = 0


@dataclass(frozen=True)
class RegionSnapshot:
    path: str
    abi_version: int
    struct_size: int
    created_realtime_ns: int
    generation: int
    reclaimed_procs: int
    devices: list[DeviceUsage]
    processes: list[ProcessUsage]

    def device(self, index: int) -> DeviceUsage | None:
        for d in self.devices:
            if d.index == index:
                return d
        return None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return f"mode {stat.filemode(mode)}"


def open_region(path: str | os.PathLike[str], *, dir_fd: int | None = None,
                owners: frozenset[int] | None = None) -> int:
    """Open a region file for reading without trusting what sits at `path`.

    No-follow and non-blocking: a symbolic link is refused (ELOOP) and a FIFO
    cannot hang the caller. The open file must be a regular file with one
    link, at most MAX_REGION_BYTES, and (when `owners` is given) owned by one
    of those uids. `path` is relative to `dir_fd` when that is given. Returns
    the descriptor; the caller closes it.
    """
    try:
        # look before opening: opening a device node (a container with CAP_MKNOD can
        # make one) may act on the device; the fstat below catches a swap in between
        lst = os.stat(path, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(lst.st_mode):
            raise RegionRefused(str(path), "symlink", "a symbolic link, not a region file")
        if not stat.S_ISREG(lst.st_mode):
            raise RegionRefused(str(path), "type", f"{_kind(lst.st_mode)}, not a region file")
        fd = os.open(path, _OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise RegionRefused(str(path), "symlink", "a symbolic link, not a region file") from None
        if e.errno in (errno.ENXIO, errno.EWOULDBLOCK):
            raise RegionRefused(str(path), "type", "a socket or device, not a region file") from None
        raise RegionError(f"{path}: {e.strerror}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (lst.st_dev, lst.st_ino):
            raise RegionRefused(str(path), "type", f"{_kind(st.st_mode)} (replaced while opened), not a region file")
        if owners is not None and st.st_uid not in owners:
            raise RegionRefused(str(path), "owner", f"owned by uid {st.st_uid}; accepted owners: "
                                f"{', '.join(map(str, sorted(owners)))}")
        if st.st_nlink != 1:
            raise RegionRefused(str(path), "links", f"{st.st_nlink} hard links; a region file has one")
        if st.st_size > MAX_REGION_BYTES:
            raise RegionRefused(str(path), "size", f"{st.st_size} bytes, over the cap of {MAX_REGION_BYTES}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_region(path: str | os.PathLike[str], *, dir_fd: int | None = None,
                owners: frozenset[int] | None = None) -> RegionSnapshot:
    """Copy the region at `path` (see open_region) and return what it holds."""
    fd = open_region(path, dir_fd=dir_fd, owners=owners)
    try:
        return read_region_fd(fd, str(path))
    finally:
        os.close(fd)


def read_region_fd(fd: int, path: str) -> RegionSnapshot:
    """Copy the region open on `fd` (one pread) and return what it holds."""
    ffi = _ffi()
    c = _consts()
    size = region_struct_size()
    try:
        st = os.fstat(fd)
        if st.st_size < size:
            raise RegionError(f"{path}: {st.st_size} bytes, a region needs {size}")
        buf = bytearray(os.pread(fd, size, 0))
    except OSError as e:
        raise RegionError(f"{path}: {e.strerror}") from e
    if len(buf) < size:  # truncated between fstat and pread
        raise RegionError(f"{path}: {len(buf)} bytes, a region needs {size}")
    r = ffi.from_buffer("struct hamid_region *", buf)
    try:
        if r.magic != c["HAMID_REGION_MAGIC"]:
            raise RegionError(f"{path}: bad magic {r.magic:#x} (not initialised, or not a hamid region)")
        if r.abi_version < 1 or r.struct_size < size:
            raise RegionError(
                f"{path}: ABI {r.abi_version} with struct_size {r.struct_size}; this reader needs ABI >= 1 "
                f"and struct_size >= {size}"
            )
        ndev = min(int(r.device_count), c["HAMID_MAX_DEVICES"])
        devices = []
        for i in range(c["HAMID_MAX_DEVICES"]):
            d = r.devices[i]
            if i >= ndev and not (d.flags & 1) and not d.used_bytes:
                continue
            devices.append(
                DeviceUsage(
                    index=i,
                    uuid=ffi.string(d.uuid).decode(errors="replace") if d.flags & 1 else "",
                    limit_bytes=int(d.limit_bytes),
                    used_bytes=int(d.used_bytes),
                    peak_used_bytes=int(d.peak_used_bytes),
                    oom_count=int(d.oom_count),
                    sm_limit_percent=int(d.sm_limit),
                    context_bytes=int(d.context_bytes),
                    gpu_time_ns=int(d.gpu_time_ns),
                    throttle_ns=int(d.throttle_ns),
                    launches=int(d.launches),
                    last_kernel_realtime_ns=int(d.last_kernel_realtime_ns),
                    schedule_ns=int(d.tat_ns),
                )
            )
        procs = []
        hw = min(int(r.proc_high_water), c["HAMID_MAX_PROCS"])
        for s in range(hw):
            p = r.procs[s]
            if p.pid <= 0:
                continue
            procs.append(
                ProcessUsage(
                    slot=s,
                    pid=int(p.pid),
                    start_time=int(p.start_time),
                    used_bytes={i: int(p.used[i]) for i in range(c["HAMID_MAX_DEVICES"]) if p.used[i]},
                    context_bytes={i: int(p.context[i]) for i in range(c["HAMID_MAX_DEVICES"]) if p.context[i]},
                    nvml_pid=int(p.nvml_pid) if r.abi_version >= 2 else 0,
                )
            )
        snap = RegionSnapshot(
            path=str(path),
            abi_version=int(r.abi_version),
            struct_size=int(r.struct_size),
            created_realtime_ns=int(r.created_realtime_ns),
            generation=int(r.generation),
            reclaimed_procs=int(r.reclaimed_procs),
            devices=devices,
            processes=procs,
        )
        return snap
    finally:
        ffi.release(r)
