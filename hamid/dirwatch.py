"""Waking when a file appears in a directory (Linux inotify through ctypes).

The daemon used to look for poststop markers five times a second; each look
is cheap, but on a virtual machine each wake-up of an idle Python process
costs a few hundred microseconds, so the polls alone were a quarter of a
percent of a core. With a watch the daemon sleeps until a marker arrives.

``DirWatch.open(path)`` returns a watch, or None where inotify cannot be used
(not Linux, no watches left); ``await watch.wait()`` returns once something
was created in or moved into the directory since the previous call, or the
directory itself went away (then ``broken`` is set and the caller opens a
new watch). It owns one inotify descriptor and touches no files.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct

import trio

from .logs import get_logger

log = get_logger("dirwatch")

IN_CREATE = 0x00000100
IN_MOVED_TO = 0x00000080
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_IGNORED = 0x00008000
IN_Q_OVERFLOW = 0x00004000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)

_libc = None


def _lib():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


class DirWatch:
    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path
        self.broken = False

    @classmethod
    def open(cls, path: str) -> "DirWatch | None":
        try:
            libc = _lib()
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            log.warning("inotify unavailable; polling instead", error=os.strerror(ctypes.get_errno()))
            return None
        wd = libc.inotify_add_watch(fd, os.fsencode(path),
                                    IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF | IN_MOVE_SELF)
        if wd < 0:
            err = ctypes.get_errno()
            os.close(fd)
            log.warning("cannot watch directory; polling instead", path=path, error=os.strerror(err))
            return None
        return cls(fd, path)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _read(self) -> bool:
        """Consume the queued events; True if there were any."""
        got = False
        while True:
            try:
                buf = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return got
            if not buf:
                return got
            got = True
            off = 0
            while off + _EVENT.size <= len(buf):
                _wd, mask, _cookie, n = _EVENT.unpack_from(buf, off)
                off += _EVENT.size + n
                if mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                    self.broken = True

    async def wait(self) -> None:
        while not self._read():
            await trio.lowlevel.wait_readable(self.fd)
