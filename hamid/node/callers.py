"""What a caller outside the node may put into a reservation.

A reservation's ``details`` also carry the node's own bookkeeping (its faces'
slot names and files, the ledger's time slots), which release acts on. A
caller on the network (the peer API, the leader) or on the local API may set
only the few keys below, each checked here; anything else is refused with the
key named, so nothing a caller sends ever becomes a path the node deletes.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import HamidError

PLACED_BY = ("gate", "extender")
_ATTEMPT = re.compile(r"^[0-9a-f]{32}$")
ACCEPTED = ("placed_by", "attempt")


class DetailsError(HamidError):
    """A caller sent reservation details it may not set."""


def caller_details(d: Any) -> dict[str, str]:
    """The details a remote caller sent, checked; {} for None."""
    if d is None:
        return {}
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
    return out
