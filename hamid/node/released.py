"""Released containers: the poststop hook's markers and draining them.

The poststop hook must be fast and must not fail (runc does not retry it,
runc #4363), so it only creates an empty file ``released/<container id>`` in
the state directory (the sh launcher does that without starting Python).
Whoever touches the ledger next drains the markers before anything else: the
daemon (at once, on a short poll, and before every reservation), or the
runtime itself when no daemon runs. Draining releases the reservation,
destroys the MIG instances made for it and removes the container's region
directory, then deletes the marker; every step is idempotent, so a crash
midway is finished by the next drain.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable

from ..errors import HamidError
from .layout import CONTAINERS_DIR, RELEASED_DIR

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def check_id(cid: str) -> str:
    if not _ID.match(cid):
        raise HamidError(f"bad container id {cid!r}: expected letters, digits, '_', '.', '-'")
    return cid


def mark(state_dir: str, cid: str) -> None:
    d = os.path.join(state_dir, RELEASED_DIR)
    os.makedirs(d, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(d, check_id(cid)), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    os.close(fd)


def pending(state_dir: str) -> list[str]:
    try:
        names = os.listdir(os.path.join(state_dir, RELEASED_DIR))
    except FileNotFoundError:
        return []
    return sorted(n for n in names if _ID.match(n))


def drain(state_dir: str, release: Callable[[str], dict | None],
          destroy_mig: Callable[[dict], object]) -> list[str]:
    """Finish every pending release; returns the container ids done."""
    done = []
    for cid in pending(state_dir):
        res = release(f"docker:{cid}")
        if res is not None:
            destroy_mig(res)
        shutil.rmtree(os.path.join(state_dir, CONTAINERS_DIR, cid), ignore_errors=True)
        try:
            os.unlink(os.path.join(state_dir, RELEASED_DIR, cid))
        except FileNotFoundError:
            pass
        done.append(cid)
    return done
