"""localapi: the daemon's unix-socket API for the CLI and the runtime hook.

HTTP/1.1 with JSON bodies (at most 256 KiB) over a unix socket in the state
directory (``hamid.sock``, mode 0600). :mod:`.server` is the face the daemon
serves with hypercorn; :mod:`.client` is the synchronous client the CLI and
the runtime hook use. Routes (all under ``/v1``):

- ``GET /status``: node, device backend, GPUs with capacity and use
- ``GET /reservations``: every reservation
- ``POST /containers``: ``{"id", "env", "user", "details", "deadline"}`` -> a
  Docker container admitted: ``{"ours", "reservation", "edits"}``
- ``POST /reservations``: ``{"kind", "owner"?, "request", "details", "deadline"?}`` -> place and admit
- ``POST /reservations/commit``: ``{"kind", "owner", "decision"}`` -> re-check and commit
- ``PATCH /reservations?owner=KEY``: ``{"state"}`` -> a checked state change
- ``DELETE /reservations?owner=KEY``: release (idempotent)

409: the ledger refused (``reasons`` says why); 410: the request's deadline
passed before the daemon got to it, nothing was committed; 413: body too large.
"""

from ..node.layout import SOCKET_NAME

__all__ = ["SOCKET_NAME"]
