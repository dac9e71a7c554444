"""The Docker face: release markers drained as they appear; runc liveness.

The poststop hook drops ``released/<id>`` (see :mod:`hamid.node.released`).
An inotify watch on that directory wakes this face (an idle daemon does not
wake at all); where no watch can be had, it polls every
``releasePollInterval``. With a watch it still looks every
``reconcileInterval``, a net for anything a watch missed.
"""

from __future__ import annotations

import os

import trio

from ..logs import get_logger
from ..node import released
from ..node.layout import RELEASED_DIR
from ..node.service import NodeService
from ..dirwatch import DirWatch
from .liveness import docker_alive

log = get_logger("docker")


class DockerFace:
    name = "docker"

    def __init__(self, node: NodeService, *, poll_interval: float, net_interval: float,
                 start_grace: float) -> None:
        self.node = node
        self.poll_interval = poll_interval
        self.net_interval = net_interval
        self.owner_liveness = {"docker": docker_alive(start_grace)}
        self._state_dir = str(node.core.state_dir)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        rdir = os.path.join(self._state_dir, RELEASED_DIR)
        watch: DirWatch | None = None
        polling = False
        started = False
        try:
            while True:
                if polling:
                    await trio.sleep(self.poll_interval)
                elif watch is None or watch.broken:  # (re)open, then look at once: a marker may predate it
                    if watch is not None:
                        watch.close()
                    try:
                        os.makedirs(rdir, mode=0o700, exist_ok=True)
                    except OSError as e:  # the state dir itself is gone or unwritable: look again later
                        log.warning("cannot create the release markers' directory", path=rdir, error=e.strerror)
                        watch = None
                        if not started:
                            started = True
                            task_status.started()
                        await trio.sleep(self.net_interval)
                        continue
                    watch = DirWatch.open(rdir)
                    polling = watch is None
                else:
                    with trio.move_on_after(self.net_interval):
                        await watch.wait()
                if released.pending(self._state_dir):
                    await self.node.drain_released()
                if not started:
                    started = True
                    task_status.started()
        finally:
            if watch is not None:
                watch.close()
