"""Which container a host process belongs to, from the host's own records.

Owns mapping host pids (as NVML reports them: the daemon sees the host's pid
namespace) to the containers this node started. A process belongs to a
container when the file at the limits file's fixed path inside containers
(hamid.node.layout.LIMITS_IN_CONTAINER, given by the caller), looked up through the process's own root
(/proc/<pid>/root, the kernel's view of its mount namespace), is that
container's limits file on the host: the same device and inode, which a bind
mount keeps. A container can mount only what it can reach and never reaches
another container's limits file, so it can neither make one of its processes
look like a neighbour's nor a neighbour's look like its own. The map is read
anew at every call, so a pid the kernel hands to another process belongs to
whoever holds it now. Nothing here reads a region (what a container writes).

The path inside is walked one component at a time, each symlink resolved in
the container's root: a container's root may rename its limits file's
directory away (a parent of a bind mount can be renamed) and leave at the
fixed path a symlink whose absolute target the kernel would resolve in the
daemon's root, i.e. a neighbour's file; while an image whose /usr/local is a
link (the runtime then mounted the file where the link leads) must still be
seen as its own.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping

MAX_LINKS = 40  # symlinks followed in one lookup (Linux's own limit)


def _ident(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:  # gone, or a process whose root we may not look into
        return None
    return st.st_dev, st.st_ino


def _ident_inside(root: str, inside: str) -> tuple[int, int] | None:
    """(device, inode) of ``inside`` under the directory ``root``, or None. Symlinks are followed as the
    container sees them (an absolute target from ``root``, ``..`` never above it: what the kernel's
    RESOLVE_IN_ROOT does), never into the daemon's own tree."""
    try:
        top = os.open(root, os.O_PATH | os.O_DIRECTORY)
    except OSError:
        return None
    stack = [top]  # the directories walked, ``root`` first: ``..`` goes back one, never past ``root``
    parts = [p for p in inside.split("/") if p]
    hops = 0
    try:
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            if part == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                continue
            fd = os.open(part, os.O_PATH | os.O_NOFOLLOW, dir_fd=stack[-1])
            if not stat.S_ISLNK(os.fstat(fd).st_mode):
                stack.append(fd)
                continue
            os.close(fd)
            hops += 1
            if hops > MAX_LINKS:
                return None
            target = os.readlink(part, dir_fd=stack[-1])
            if target.startswith("/"):
                while len(stack) > 1:
                    os.close(stack.pop())
            parts[:0] = [p for p in target.split("/") if p]
        st = os.fstat(stack[-1])
        return st.st_dev, st.st_ino
    except OSError:  # gone, a component missing, or a process whose root we may not look into
        return None
    finally:
        for fd in stack:
            os.close(fd)


def owners(pids: Iterable[int], files: Mapping[str, str], inside: str, *,
           proc: str = "/proc") -> dict[int, str | None]:
    """Each of ``pids`` (host pids) -> the key in ``files`` (key -> that container's limits file on the host)
    whose file the process sees at ``inside`` (the limits file's path in containers), or None: a process of no
    container of ours, or one gone."""
    by_ident: dict[tuple[int, int], str] = {}
    for key, path in files.items():
        ident = _ident(path)
        if ident is not None:
            by_ident[ident] = key
    out: dict[int, str | None] = {}
    for pid in pids:
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            continue
        ident = _ident_inside(f"{proc}/{pid}/root", inside)
        out[pid] = by_ident.get(ident) if ident is not None else None
    return out



def owned_by(pid: int, limits: str, inside: str, *, proc: str = "/proc") -> bool:
    """Whether the process is the container's whose limits file on the host is ``limits`` (owners, one pid)."""
    return owners((pid,), {limits: limits}, inside, proc=proc).get(pid) == limits

MAPS_MAX_BYTES = 16 << 20  # a process's list of mappings read at most (a torch process's is about 1 MB)


def maps_any(pid: int, idents: frozenset[tuple[int, int]], *, proc: str = "/proc") -> bool | None:
    """Whether the process has a file of ``idents`` ((st_dev, st_ino) as os.stat gives them) mapped, from the
    kernel's list of its mappings (/proc/<pid>/maps: each line's device and inode); None: gone, or a list
    we may not read. What the process cannot make the kernel say otherwise: a process with no shim (a
    static binary, a preload it escaped) has none of the installed shim files mapped."""
    try:
        with open(f"{proc}/{pid}/maps", "rb") as f:
            data = f.read(MAPS_MAX_BYTES)
    except OSError:
        return None
    # most lines are other files: look only at lines naming one of the inodes (a quick scan of the bytes)
    needles = {b" %d " % ino for _, ino in idents}
    if not any(n in data for n in needles):
        return False
    for line in data.splitlines():
        if not any(n in line for n in needles):
            continue
        parts = line.split(None, 5)
        if len(parts) < 6 or parts[4] == b"0":
            continue  # anonymous
        try:
            major, minor = (int(x, 16) for x in parts[3].split(b":"))
            ino = int(parts[4])
        except ValueError:
            continue
        if (os.makedev(major, minor), ino) in idents:
            return True
    return False


def file_idents(paths: Iterable[str | os.PathLike]) -> frozenset[tuple[int, int]]:
    """(st_dev, st_ino) of each of ``paths`` that exists."""
    out = set()
    for p in paths:
        ident = _ident(str(p))
        if ident is not None:
            out.add(ident)
    return frozenset(out)
