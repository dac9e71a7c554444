"""The atomic, versioned installer of libvgpu.so (see package docstring)."""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from pathlib import Path

_VERSIONED = re.compile(r"^libvgpu\.so\.(\d+\.\d+\.\d+[0-9A-Za-z.+-]*)$")
_CHUNK = 1 << 20


class ShimInstallError(Exception):
    """The shim could not be installed; the message says what and where."""


def shim_version_of(src: Path) -> str:
    """The version in the built file's name (libvgpu.so.<version>), following symlinks."""
    real = Path(os.path.realpath(src))
    m = _VERSIONED.match(real.name)
    if not m:
        raise ShimInstallError(f"{src}: expected a file named libvgpu.so.<version> (got {real.name!r})")
    return m.group(1)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _place(src: Path, dest: Path) -> bool:
    """Write src's bytes to a temporary name beside dest, fsync, then link it
    into place. Returns False when dest appeared meanwhile (someone else won)."""
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        with open(src, "rb") as f:
            while chunk := f.read(_CHUNK):
                view = memoryview(chunk)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
        os.fchmod(fd, 0o755)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        os.link(tmp, dest)  # never replaces an existing file, unlike rename
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
        _fsync_dir(dest.parent)


def _point_link(dest_dir: Path, link_name: str, target: str) -> None:
    link = dest_dir / link_name
    if link.is_symlink() and os.readlink(link) == target:
        return
    tmp = dest_dir / f".{link_name}.lnk-{os.getpid()}-{secrets.token_hex(4)}"
    os.symlink(target, tmp)
    os.replace(tmp, link)  # atomic swap of the symlink; the files it pointed at stay
    _fsync_dir(dest_dir)


def install_shim(src: str | os.PathLike[str], dest_dir: str | os.PathLike[str], link_name: str | None = "libvgpu.so") -> Path:
    """Install the built shim `src` into `dest_dir` and return the installed path.

    The file is named libvgpu.so.<version>. When a file of that name already
    holds the same bytes, nothing is written. When it holds other bytes (a
    rebuild with the same version), the new build goes to
    libvgpu.so.<version>+<sha12> instead: an installed file is never rewritten.
    `link_name` (if not None) is then pointed at the installed file, atomically.
    """
    src = Path(src)
    dest_dir = Path(dest_dir)
    if not Path(os.path.realpath(src)).is_file():
        raise ShimInstallError(f"{src}: no such file (build it with `make -C shim`)")
    version = shim_version_of(src)
    dest_dir.mkdir(parents=True, exist_ok=True)
    digest = _digest(src)
    candidates = [dest_dir / f"libvgpu.so.{version}", dest_dir / f"libvgpu.so.{version}+{digest[:12]}"]
    for dest in candidates:
        for _ in range(2):
            if dest.exists():
                if _digest(dest) == digest:
                    if link_name:
                        _point_link(dest_dir, link_name, dest.name)
                    return dest
                break  # same name, other bytes: try the next name
            if _place(src, dest):
                if link_name:
                    _point_link(dest_dir, link_name, dest.name)
                return dest
            # lost a race to another installer: look at what it wrote
    raise ShimInstallError(
        f"{dest_dir}: both {candidates[0].name} and {candidates[1].name} exist with other contents; refusing to overwrite"
    )
