"""What a face is: a door into the node service that the daemon starts.

A face is an object with a ``name`` and ``async run(task_status=...)`` that
calls ``task_status.started()`` once it serves and runs until cancelled. It
may also offer:

- ``collector()``: a Prometheus collector of its own metrics, registered with
  the daemon's registry before any face starts;
- ``owner_liveness``: a mapping from an owner kind (``docker``, ``pod``) to a
  check that says whether a reservation's owner still exists; the node's
  reconciler releases only what some face proves gone.

Faces depend on the node core, never on each other; the daemon composes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import trio

from .core import Liveness


class Face(Protocol):
    name: str

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None: ...


def collector_of(face: Face) -> Any | None:
    fn = getattr(face, "collector", None)
    return fn() if callable(fn) else None


def liveness_of(face: Face) -> Mapping[str, Liveness]:
    return getattr(face, "owner_liveness", None) or {}
