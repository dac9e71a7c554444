"""Does a Docker container still exist? Asked by the daemon's reconciler.

The runtime records runc's state root (``--root``) and the container id on
the reservation; runc keeps ``<root>/<id>/state.json`` from ``create`` until
``delete``. A reservation younger than the start grace period counts as
alive even without it: the runtime reserves before it execs runc. Within the
grace, a recorded bundle whose ``config.json`` is gone proves the container
gone: containerd deletes the bundle when runc's create fails and on ``docker
rm``, and the reservation was made from that very file, so a create that
failed does not hold its GPU room for the whole grace.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ..node.service import Reservation


def docker_alive(grace_s: float) -> Callable[[Reservation], bool]:
    def alive(r: Reservation) -> bool:
        root, cid = r.details.runc_root, r.details.container_id
        if not root or not cid:
            return True  # cannot prove it gone
        if os.path.exists(os.path.join(root, cid, "state.json")):
            return True
        bundle = r.details.bundle
        if bundle and not os.path.lexists(os.path.join(bundle, "config.json")):
            return False
        return time.time() - r.created < grace_s

    return alive


def docker_started(r: Reservation) -> bool:
    """Has runc started the container's process? runc keeps ``exec.fifo`` in
    the container's state directory from ``create`` until ``start`` opens it."""
    root, cid = r.details.runc_root, r.details.container_id
    if not root or not cid:
        return False
    base = os.path.join(root, cid)
    return os.path.exists(os.path.join(base, "state.json")) and not os.path.exists(os.path.join(base, "exec.fifo"))
