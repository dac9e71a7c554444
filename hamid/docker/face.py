"""The Docker face: container creates, release markers drained as they appear; runc liveness.

Creates: ``DIR/docker.sock`` (mode 0600, root only) answers ``POST /v1/create``
from the compiled ``hamid-runtime-admit`` (contrib/docker/hamid-runtime-admit.c) for
a container asking for GPUs: ``{"bundle", "id", "runc_root", "hook",
"deadline"}``. The daemon itself reads and edits the bundle's ``config.json``
(:func:`hamid.docker.bundle.prepare_bundle`), so a container start costs no
Python start-up. 200 ``{"ours": bool}``; 409 (no room: with ``elsewhere``,
the message starts with where in the gossiped view the same request fits
now) or 400 with
``{"error"}``, which the client shows in ``docker run``'s output; 410 when the
request's deadline passed before the daemon got to it (nothing committed: the
client then runs the Python runtime, which works without the daemon).

The poststop hook drops ``released/<id>`` (see :mod:`hamid.node.released`).
An inotify watch on that directory wakes this face (an idle daemon does not
wake at all); where no watch can be had, it polls every
``releasePollInterval``. With a watch it still looks every
``reconcileInterval``, a net for anything a watch missed.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import trio

from ..dirwatch import DirWatch
from ..errors import HamidError
from ..logs import get_logger
from ..node import released
from ..node.callers import container_details
from ..node.layout import RELEASED_DIR
from ..node.service import NodeService, container_answer, refusal
from ..request.model import Defaults, Request
from .liveness import docker_alive, docker_started

log = get_logger("docker")

MAX_BODY = 64 * 1024  # a create names a bundle, an id and two paths: a few hundred bytes


class DockerFace:
    name = "docker"

    def __init__(self, node: NodeService, *, poll_interval: float, net_interval: float,
                 start_grace: float, socket_path: str | None = None, defaults: Defaults = Defaults(),
                 elsewhere: Callable[[Request], str] | None = None) -> None:
        """``elsewhere(request)``: where else the request fits now, in one line (the
        daemon's gossiped view, :mod:`hamid.placement.elsewhere`); called in a
        worker thread when a create is refused for lack of room."""
        self.node = node
        self.elsewhere = elsewhere
        self.socket_path = socket_path
        self.defaults = defaults
        self.poll_interval = poll_interval
        self.net_interval = net_interval
        self.owner_liveness = {"docker": docker_alive(start_grace)}
        self._state_dir = node.state_dir

    # --- creates -----------------------------------------------------------------------

    def _create(self, body: dict) -> bool:
        """Prepare one bundle (blocking; the node service's threads)."""
        from .bundle import prepare_bundle

        for k in ("bundle", "id", "runc_root", "hook"):
            if not isinstance(body.get(k), str) or not body[k]:
                raise HamidError(f"{k}: a non-empty string is required")
        deadline = body.get("deadline")
        if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, (int, float))):
            raise HamidError(f"deadline: expected seconds since the epoch, got {deadline!r}")
        def admit(cid: str, env: list, user: tuple, details: dict) -> dict:
            return container_answer(self.node.admit_container_blocking(
                cid, env, user=user, details=container_details(details, cid), defaults=self.defaults,
                deadline=deadline, elsewhere=self.elsewhere))

        return prepare_bundle(body["bundle"], body["id"], runc_root=body["runc_root"], hook=body["hook"],
                              state_dir=self._state_dir, admit=admit, release=self.node.release_blocking)

    def app(self):
        import json

        from starlette.applications import Starlette

        from ..serving import BodyTooLarge, read_body
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        async def create(req):
            try:
                raw = await read_body(req, MAX_BODY)
            except BodyTooLarge as e:
                return JSONResponse({"error": str(e)}, 413)
            try:
                body = json.loads(raw)
                if not isinstance(body, dict):
                    raise ValueError
            except ValueError:
                return JSONResponse({"error": "request body must be a JSON object"}, 400)
            cid = str(body.get("id"))[:12]
            try:
                ours = await self.node.run_blocking(self._create, body)
            except HamidError as e:  # every refusal is logged with its reason, as docker run shows it
                log.warning("container refused", id=cid, reason=refusal(e))
                return JSONResponse({"error": refusal(e)}, e.http_status)
            except Exception as e:  # a bug: say so, and log it whole
                log.exception("create failed", bundle=body.get("bundle"))
                return JSONResponse({"error": f"internal error in the daemon: {e!r}"}, 500)
            return JSONResponse({"ours": ours})

        return Starlette(routes=[Route("/v1/create", create, methods=["POST"])])

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if self.socket_path:
                from ..serving import serve_asgi

                await nursery.start(lambda task_status: serve_asgi(self.app(), f"unix:{self.socket_path}",
                                                                   what="the Docker face", task_status=task_status))
                os.chmod(self.socket_path, 0o600)
            await nursery.start(self._drain)
            nursery.start_soon(self._follow_starts)
            task_status.started()

    async def _follow_starts(self) -> None:
        """``allocated`` -> ``running`` once runc has started the container's
        process (a started container's ``exec.fifo`` is gone,
        :func:`docker_started`), looked at every second at most as often as
        markers are polled: a state shown a second late costs nothing, a
        ledger read per 0.2 s would. Only those rows are read (a node's pods are not)."""
        while True:
            await trio.sleep(max(self.poll_interval, 1.0))
            for r in await self.node.in_state("allocated", kind="docker"):
                if docker_started(r):
                    try:
                        await self.node.set_state(r.owner, "running")
                    except HamidError as e:  # released meanwhile: nothing to follow
                        log.debug("not marked running", owner=r.owner, error=str(e))

    async def _drain(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
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
