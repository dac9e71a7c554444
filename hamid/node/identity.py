"""Who a reservation belongs to: a stable identity, and a name for people.

A Kubernetes pod is identified by its UID and a Docker container by its id;
neither is ever reused, so a pod re-created under the same name is a new
owner and never inherits the old one's reservation. The name
(``namespace/name``, or the container's name) is kept beside the identity
for display only: nothing looks a reservation up by it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import HamidError

KINDS = ("docker", "pod", "claim")  # claim: a DRA ResourceClaim, by its UID

# Pod UIDs are RFC 4122 UUIDs; Docker ids are 64 hex digits (runc accepts a
# little more). One pattern covers both and keeps keys safe as file names.
_UID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class OwnerError(HamidError):
    """An owner identity is malformed; the message names the bad part."""


@dataclass(frozen=True)
class Owner:
    kind: str
    uid: str
    name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise OwnerError(f"owner kind: bad value {self.kind!r}; accepted: {', '.join(KINDS)}")
        if not isinstance(self.uid, str) or not _UID.match(self.uid):
            shown = self.uid if isinstance(self.uid, str) and len(self.uid) <= 80 else f"{str(self.uid)[:80]}..."
            raise OwnerError(f"owner uid: bad value {shown!r}; accepted: 1 to 128 letters, digits, '_', '.', '-' "
                             "(a pod UID or a container id)")
        if not isinstance(self.name, str) or len(self.name) > 512:
            raise OwnerError("owner name: at most 512 characters")

    @property
    def key(self) -> str:
        """The ledger's primary key: ``<kind>:<uid>``."""
        return f"{self.kind}:{self.uid}"

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "uid": self.uid, "name": self.name}

    @classmethod
    def from_dict(cls, d: Any) -> "Owner":
        if not isinstance(d, dict):
            raise OwnerError(f"owner: expected an object with kind, uid and name, got {type(d).__name__}")
        kind: Any = d.get("kind")  # whatever was stored: __post_init__ names what is wrong with it
        uid: Any = d.get("uid")
        return cls(kind=kind, uid=uid, name=d.get("name") or "")

    @classmethod
    def from_key(cls, key: str, name: str = "") -> "Owner":
        kind, sep, uid = key.partition(":")
        if not sep:
            raise OwnerError(f"owner key {key!r}: expected <kind>:<uid>")
        return cls(kind=kind, uid=uid, name=name)

    def __str__(self) -> str:
        return f"{self.key} ({self.name})" if self.name else self.key
