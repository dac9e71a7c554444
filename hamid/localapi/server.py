"""The local API: the node service behind a root-only unix socket.

An ASGI app (starlette, served by hypercorn on trio) for the CLI and the
Docker runtime. Each route is a thin door into
:class:`hamid.node.service.NodeService`; request bodies are capped at
``MAX_BODY`` bytes. The Docker runtime makes one call per container create
(``POST /v1/containers``): the daemon parses the container's ``HAMI_*``
variables, admits it and answers with the container's edits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..errors import HamidError
from ..logs import get_logger
from ..serving import BodyTooLarge, read_body
from ..node.callers import caller_details, container_details
from ..node.identity import KINDS, Owner
from ..node.service import Abandoned, LedgerConflict, NodeService, container_answer, refusal
from ..placement import Decision
from ..placement.reasons import refusal_headline
from ..request.model import Defaults, Request

log = get_logger("localapi")

MAX_BODY = 256 * 1024  # a container's whole environment fits many times over


def _error(status: int, message: str, reasons=(), headline: str | None = None) -> JSONResponse:
    doc = {"error": message, "reasons": list(reasons)}
    if headline:  # a refusal's kind (the reasons' kinds do not survive JSON)
        doc["headline"] = headline
    return JSONResponse(doc, status_code=status)


async def _body(req: HttpRequest) -> dict[str, Any]:
    buf = await read_body(req, MAX_BODY)  # BodyTooLarge: 413
    import json

    try:
        body = json.loads(buf)
    except ValueError:
        raise HamidError("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise HamidError("request body must be a JSON object")
    return body


def _kind(body: dict) -> str:
    kind = body.get("kind")
    if kind not in KINDS:
        raise HamidError(f"kind: bad value {kind!r}; accepted: {', '.join(KINDS)}")
    return kind


def _deadline(body: dict) -> float | None:
    d = body.get("deadline")
    if d is None:
        return None
    if isinstance(d, bool) or not isinstance(d, (int, float)):
        raise HamidError(f"deadline: expected seconds since the epoch, got {d!r}")
    return float(d)


def _user(body: dict) -> tuple[int, int]:
    u = body.get("user", [0, 0])
    if (not isinstance(u, list) or len(u) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**32 for x in u)):
        raise HamidError(f"user: expected [uid, gid], got {u!r}")
    return u[0], u[1]


class LocalApiFace:
    """Serves the app on ``socket_path`` (mode 0600) until cancelled."""

    name = "localapi"

    def __init__(self, node: NodeService, socket_path: str, *, defaults: Defaults,
                 cluster: Callable[[], dict] | None = None,
                 elsewhere: Callable[[Request], str] | None = None) -> None:
        """``elsewhere``: as the Docker face's (a refused container is told where it fits)."""
        self.node = node
        self.socket_path = socket_path
        self.defaults = defaults
        self.cluster = cluster
        self.elsewhere = elsewhere

    def app(self) -> Starlette:
        node = self.node

        def guarded(handler):
            async def wrapped(req: HttpRequest):
                try:
                    return await handler(req)
                except HamidError as e:  # its status is its own (HamidError.http_status)
                    if req.url.path == "/v1/containers" and not isinstance(e, (Abandoned, BodyTooLarge)):
                        # the Python runtime's admission: logged as the Docker face's
                        log.warning("container refused", reason=refusal(e))
                    reasons = getattr(e, "reasons", ())
                    # a refusal's kind rides beside the reasons, whose kinds do not survive JSON
                    headline = refusal_headline(reasons) if isinstance(e, LedgerConflict) else None
                    return _error(e.http_status, str(e), reasons, headline)
                except Exception as e:  # a bug: say so, in JSON, and log it whole
                    log.exception("local API handler failed", path=req.url.path)
                    return _error(500, f"internal error in the daemon: {e!r}")
            return wrapped

        async def status(req: HttpRequest):
            return JSONResponse(await node.status())

        async def list_reservations(req: HttpRequest):
            return JSONResponse([r.to_dict() for r in await node.reservations()])

        async def reserve(req: HttpRequest):
            body = await _body(req)
            kind = _kind(body)
            request = Request.from_dict(body.get("request") or {})
            owner = Owner.from_dict(body["owner"]) if body.get("owner") else Owner.from_key(request.owner)
            if owner.kind != kind:
                raise HamidError(f"owner {owner.key} is not of kind {kind}")
            got = await node.admit(owner, request, user=_user(body), details=caller_details(body.get("details")),
                                   deadline=_deadline(body))
            return JSONResponse(got.reservation.to_dict())

        async def container(req: HttpRequest):
            body = await _body(req)
            cid, env = body.get("id"), body.get("env")
            if not isinstance(cid, str) or not isinstance(env, list) or not all(isinstance(e, str) for e in env):
                raise HamidError("expected {id: <container id>, env: [NAME=value, ...]}")
            details = body.get("details") or {}
            if body.get("name") and isinstance(details, dict):  # older runtimes sent the name beside the details
                details = {**details, "name": body["name"]}
            got = await node.admit_container(cid, env, user=_user(body), details=container_details(details, cid),
                                             defaults=self.defaults, deadline=_deadline(body), elsewhere=self.elsewhere)
            return JSONResponse(container_answer(got))

        async def commit(req: HttpRequest):
            body = await _body(req)
            kind = _kind(body)
            raw = body.get("owner")
            owner = Owner.from_dict(raw) if isinstance(raw, dict) else Owner.from_key(str(raw or ""))
            if owner.kind != kind:
                raise HamidError(f"owner {owner.key} is not of kind {kind}")
            try:
                decision = Decision.from_dict(body["decision"])
            except (KeyError, TypeError, ValueError) as e:
                raise HamidError(f"decision: malformed ({e!r})") from None
            # checked here (a RequestError names the field): the ledger stores only a parsed request
            request = Request.from_dict(body["request"]) if body.get("request") else None
            res = await node.commit(owner, decision, request=request,
                                    details=caller_details(body.get("details")), deadline=_deadline(body))
            return JSONResponse(res.to_dict())

        async def cluster_view(req: HttpRequest):
            if self.cluster is None:
                return _error(404, "gossip is not enabled on this daemon (set gossipListen or --gossip-listen)")
            return JSONResponse(self.cluster())

        def _owner(req: HttpRequest) -> str:
            owner = req.query_params.get("owner")
            if not owner:
                raise HamidError("query parameter owner is required")
            return owner

        async def set_state(req: HttpRequest):
            key = _owner(req)
            body = await _body(req)
            state = body.get("state")
            if not isinstance(state, str):
                raise HamidError("state: expected one of allocated, running")
            return JSONResponse((await node.set_state(key, state)).to_dict())

        async def release(req: HttpRequest):
            res = await node.release(_owner(req))
            return JSONResponse({"released": res is not None, "reservation": res.to_dict() if res else None})

        return Starlette(routes=[
            Route("/v1/status", guarded(status), methods=["GET"]),
            Route("/v1/cluster", guarded(cluster_view), methods=["GET"]),
            Route("/v1/reservations", guarded(list_reservations), methods=["GET"]),
            Route("/v1/reservations", guarded(reserve), methods=["POST"]),
            Route("/v1/containers", guarded(container), methods=["POST"]),
            Route("/v1/reservations/commit", guarded(commit), methods=["POST"]),
            Route("/v1/reservations", guarded(set_state), methods=["PATCH"]),
            Route("/v1/reservations", guarded(release), methods=["DELETE"]),
        ])

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        import os

        from ..serving import serve_asgi

        async with trio.open_nursery() as nursery:
            await nursery.start(serve_asgi, self.app(), f"unix:{self.socket_path}")
            os.chmod(self.socket_path, 0o600)
            task_status.started()
