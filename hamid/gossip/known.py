"""The members this node knew, kept in its state directory so that a restart finds the group again.

What it owns: the file ``gossip-members.json`` in the state directory (a JSON
list of ``{"name", "addr", "pk"}``, 0600, replaced in one step) and its
limits. A seed that had no ``--join`` used to come back alone for good after
a restart: the others kept it as ``left`` and nobody dialled it. With this
file it dials the members it knew (:meth:`Membership.remember`), and their
identity keys stay pinned across its restart (:mod:`hamid.gossip.identity`).
The file is this node's own record, never a peer's: what is in it was
already checked when it was learnt, and it is checked again when read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..atomicfile import replace_file
from ..logs import get_logger
from ..nodekey import valid_public_key
from .transport import split_addr

log = get_logger("gossip")

FILE_NAME = "gossip-members.json"
MAX_BYTES = 16 << 20  # ~16,000 members of ~200 bytes each, with room: a larger file is not ours


def _entry(e: object) -> tuple[str, str, str | None] | None:
    if type(e) is not dict:
        return None
    name, addr, pk = e.get("name"), e.get("addr"), e.get("pk")
    if type(name) is not str or not 0 < len(name) <= 256 or type(addr) is not str or len(addr) > 256:
        return None
    try:
        split_addr(addr)
    except ValueError:
        return None
    if pk is not None and not valid_public_key(pk):
        return None
    return name, addr, pk


def load(state_dir: str | os.PathLike) -> list[tuple[str, str, str | None]]:
    """(name, address, key) of the members known at the last save; [] when there is no file. A file that
    cannot be read or parsed is logged and ignored (the node then needs a seed, as on its first start)."""
    path = Path(state_dir) / FILE_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return []
    except OSError as e:
        log.error("cannot read the members this node knew; it needs a seed to rejoin", path=str(path),
                  error=e.strerror)
        return []
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    try:
        if len(raw) > MAX_BYTES:
            raise ValueError(f"over {MAX_BYTES} bytes")
        items = json.loads(raw)
        if type(items) is not list:
            raise ValueError("not a list")
    except ValueError as e:
        log.error("the file of members this node knew is malformed; ignored (it needs a seed to rejoin)",
                  path=str(path), error=str(e)[:200])
        return []
    return [e for e in map(_entry, items) if e is not None]


def save(state_dir: str | os.PathLike, known: list[tuple[str, str, str | None]]) -> None:
    """Replace the file with ``known`` (written beside it, synced, renamed over it)."""
    path = Path(state_dir) / FILE_NAME
    replace_file(path, json.dumps([{"name": n, "addr": a, "pk": pk} for n, a, pk in sorted(known)]).encode(), 0o600)
