"""Ports for the tests' daemons to listen on (on sys.path for every test through tests/conftest.py, and for
the benches that import the harnesses).

A port from bind(0) is in the kernel's ephemeral range, so any process's outgoing connection may take it as
its source port before the daemon meant to listen there binds it ("Address already in use": seen in CI,
a gossip daemon of the web-view test). These come from below or above that range, from a slice of it of
their own per pytest-xdist worker (two workers never hand out the same port), each checked bindable; the
ports of one call are held until all are chosen, and none is handed out twice by one process.
"""

from __future__ import annotations

import os
import random
import socket

SLICE = 1500  # ports per xdist worker: a test starts at most a few dozen daemons, several ports each
_given: set[int] = set()
# Ports handed out by any test process on this machine, one file each naming its process: two suites at once
# (CI beside a developer's make test) have workers of the same names, so the same slices; a port another live
# process holds is skipped, one whose process is gone is taken back.
CLAIMS = "/tmp/hamid-test-ports"


def _claim(port: int) -> bool:
    """Whether ``port`` is now this process's (no other live test process has it)."""
    os.makedirs(CLAIMS, mode=0o1777, exist_ok=True)
    path = os.path.join(CLAIMS, str(port))
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                with open(path) as f:
                    owner = int(f.read().strip() or 0)
            except (OSError, ValueError):
                owner = 0
            if owner == os.getpid():
                return True
            if owner > 0 and _alive(owner):
                return False
            try:
                os.unlink(path)  # its process is gone (or the file is torn): the port is free to claim again
            except FileNotFoundError:
                pass
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ephemeral() -> range:
    try:
        lo, hi = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        return range(lo, hi + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


def _pool() -> list[int]:
    eph = _ephemeral()
    ports = [p for p in range(10000, 65536) if p not in eph]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    n = int(worker[2:]) if worker[2:].isdigit() else 0
    slices = max(1, len(ports) // SLICE)
    mine = ports[(n % slices) * SLICE:(n % slices + 1) * SLICE]
    return [p for p in mine if p not in _given]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports, free now, outside the ephemeral range, this worker's own."""
    pool = _pool()
    random.shuffle(pool)
    held: list[socket.socket] = []
    try:
        for port in pool:
            if len(held) == n:
                break
            if not _claim(port):
                continue
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        if len(held) < n:
            raise RuntimeError(f"only {len(held)} free ports in this worker's slice outside {_ephemeral()}")
        got = [s.getsockname()[1] for s in held]
        _given.update(got)
        return got
    finally:
        for s in held:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def listening_ports(pid: int) -> set[int]:
    """TCP ports a process listens on (its socket inodes against /proc/net/tcp)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports
