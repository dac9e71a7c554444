"""Released containers: the poststop hook's markers and draining them.

The poststop hook must be fast and must not fail (runc does not retry it,
runc #4363), so it only creates an empty file ``released/<container id>`` in
the state directory (the sh launcher does that without starting Python).
Whoever touches the ledger next drains the markers before anything else
(:meth:`hamid.node.core.NodeCore.drain_released`): the daemon's Docker face
as a marker appears, and every admission, in the daemon or in the runtime
itself when no daemon runs. Draining releases the reservation (MIG instances
destroyed and directories removed before the row goes), then deletes the
marker; every step is idempotent, so a crash midway is finished by the next
drain. The markers are named by container id; only Docker writes them.
"""

from __future__ import annotations

import os
import re

from ..errors import HamidError
from .layout import RELEASED_DIR

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


def clear(state_dir: str, cid: str) -> None:
    """Remove a marker once its release is done (already gone is fine)."""
    try:
        os.unlink(os.path.join(state_dir, RELEASED_DIR, check_id(cid)))
    except FileNotFoundError:
        pass
