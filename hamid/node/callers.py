"""What a caller outside the node may put into a reservation.

A reservation's ``details`` also carry the node's own bookkeeping (its faces'
device-group keys and files), which release acts on. A
caller on the network (the peer API, the leader) or on the local API may set
only the few keys below, each checked here; anything else is refused with the
key named, so nothing a caller sends ever becomes a path the node deletes.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import HamidError
from ..ledger import Details

PLACED_BY = ("gate", "extender")
_ATTEMPT = re.compile(r"^[0-9a-f]{32}$")
ACCEPTED = ("placed_by", "attempt")


class DetailsError(HamidError):
    """A caller sent reservation details it may not set."""


CONTAINER_KEYS = ("id", "runc_root", "bundle", "name")


def container_details(d: Any, cid: str) -> Details:
    """What the Docker runtime records beside a container it admits (through the
    daemon's local API, its Docker face, or with no daemon): its id, the runc
    root and bundle (absolute paths, read for liveness only) and its name."""
    d = d or {}
    if not isinstance(d, dict) or set(d) - set(CONTAINER_KEYS):
        raise DetailsError(f"details: accepted keys for a container: {', '.join(CONTAINER_KEYS)}")
    for k in ("runc_root", "bundle"):
        v = d.get(k)
        if v is not None and (not isinstance(v, str) or not v.startswith("/") or "\0" in v or len(v) > 4096):
            raise DetailsError(f"details.{k}: expected an absolute path")
    if d.get("id", cid) != cid:
        raise DetailsError("details.id: must be the container's id")
    name = d.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > 256):
        raise DetailsError("details.name: expected the container's name (a string of at most 256 characters)")
    return Details(container_id=cid, runc_root=d.get("runc_root") or "", bundle=d.get("bundle") or "",
                   display_name=name or "")


def caller_details(d: Any) -> Details:
    """The details a remote caller sent, checked; empty for None."""
    if d is None:
        return Details()
    if not isinstance(d, dict):
        raise DetailsError(f"details: expected a map, got {type(d).__name__}")
    out: dict[str, str] = {}
    for k, v in d.items():
        if k == "placed_by":
            if v not in PLACED_BY:
                raise DetailsError(f"details.placed_by: bad value {str(v)[:40]!r}; accepted: {', '.join(PLACED_BY)}")
        elif k == "attempt":
            if not isinstance(v, str) or not _ATTEMPT.match(v):
                raise DetailsError(f"details.attempt: bad value {str(v)[:40]!r}; accepted: 32 lower-case hex digits")
        else:
            raise DetailsError(f"details: key {str(k)[:40]!r} may not be set by a caller; accepted: "
                               f"{', '.join(ACCEPTED)}")
        out[k] = v
    return Details(placed_by=out.get("placed_by", ""), attempt=out.get("attempt", ""))
