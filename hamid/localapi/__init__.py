"""localapi: the daemon's unix-socket API for the CLI and the runtime hook.

HTTP/1.1 with JSON bodies over a unix socket in the state directory
(``hamid.sock``, mode 0600). :mod:`.server` is the ASGI app the daemon serves
with hypercorn; :mod:`.client` is the synchronous client the CLI and the
runtime hook use. Routes (all under ``/v1``):

- ``GET /status``: node, device backend, GPUs with capacity and use
- ``GET /reservations``: every reservation
- ``POST /reservations``: ``{"kind", "request", "details"}`` -> place and commit
- ``POST /reservations/commit``: ``{"kind", "owner", "decision"}`` -> re-check and commit
- ``PATCH /reservations?owner=O``: ``{"state", "mig", "details"}``
- ``DELETE /reservations?owner=O``: release (idempotent)
"""

SOCKET_NAME = "hamid.sock"
