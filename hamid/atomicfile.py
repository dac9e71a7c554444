"""Files that appear whole: written beside their place, synced, renamed over it.

One home for the pattern every state file, key and CDI spec uses, so that a crash leaves either the old file or
the new one, never a torn one, and a link planted at the temporary name is never followed.
"""

from __future__ import annotations

import os


def replace_file(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> None:
    """``data`` at ``path`` with ``mode``, in one step (the temporary file is ``path`` + ``.tmp``)."""
    tmp = os.fspath(path) + ".tmp"
    try:
        os.unlink(tmp)  # a leftover of a crash, or something planted: O_EXCL below refuses to reuse it
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
