"""The ASGI app behind the unix socket (served by hypercorn on trio).

Ledger calls block on SQLite, so each runs in a worker thread; the trio loop
never waits on the disk.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse
from starlette.routing import Route

from ..errors import HamidError
from ..ledger import Ledger, LedgerConflict
from ..ledger.report import status_document
from ..logs import get_logger
from ..placement import Decision
from ..request.model import Request

log = get_logger("localapi")

KINDS = ("docker", "pod")


def _error(status: int, message: str, reasons=()) -> JSONResponse:
    return JSONResponse({"error": message, "reasons": list(reasons)}, status_code=status)


async def _body(req: HttpRequest) -> dict[str, Any]:
    try:
        body = await req.json()
    except Exception:
        raise HamidError("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise HamidError("request body must be a JSON object")
    return body


def _kind(body: dict) -> str:
    kind = body.get("kind")
    if kind not in KINDS:
        raise HamidError(f"kind: bad value {kind!r}; accepted: {', '.join(KINDS)}")
    return kind


def build_app(ledger: Ledger, backend_label: str, node_policy: str,
              on_commit: Callable[[str], None] | None = None,
              cluster: Callable[[], dict] | None = None,
              before_reserve: Callable[[], object] | None = None) -> Starlette:
    """``on_commit(result)`` is told "ok" or "conflict" for each commit (metrics);
    ``before_reserve()`` runs (in a thread) before each placement, so releases
    that are already due are finished first."""
    note = on_commit or (lambda _r: None)
    prepare = before_reserve or (lambda: None)

    async def run(fn, *args, **kw):
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kw))

    def guarded(handler):
        async def wrapped(req: HttpRequest):
            try:
                return await handler(req)
            except LedgerConflict as e:
                note("conflict")
                return _error(409, str(e), e.reasons)
            except HamidError as e:
                return _error(400, str(e))
            except Exception as e:  # a bug: say so, in JSON, and log it whole
                log.exception("local API handler failed", path=req.url.path)
                return _error(500, f"internal error in the daemon: {e!r}")
        return wrapped

    async def status(req: HttpRequest):
        view = await run(ledger.view)
        res = await run(ledger.list)
        return JSONResponse(status_document(view, res, backend_label))

    async def list_reservations(req: HttpRequest):
        return JSONResponse([r.to_dict() for r in await run(ledger.list)])

    async def reserve(req: HttpRequest):
        body = await _body(req)
        kind = _kind(body)
        request = Request.from_dict(body.get("request") or {})
        await run(prepare)
        res = await run(ledger.reserve, request, kind=kind, node_policy=node_policy,
                        details=body.get("details") or {})
        note("ok")
        log.info("reserved", owner=res.owner, kind=kind,
                 devices=[d.to_dict() for c in res.decision.containers for d in c.devices])
        return JSONResponse(res.to_dict())

    async def commit(req: HttpRequest):
        body = await _body(req)
        kind = _kind(body)
        owner = body.get("owner")
        if not isinstance(owner, str) or not owner:
            raise HamidError("owner: a non-empty string is required")
        try:
            decision = Decision.from_dict(body["decision"])
        except (KeyError, TypeError, ValueError) as e:
            raise HamidError(f"decision: malformed ({e!r})") from None
        res = await run(ledger.commit, owner, decision, kind=kind, request=body.get("request") or {},
                        details=body.get("details") or {})
        note("ok")
        return JSONResponse(res.to_dict())

    async def cluster_view(req: HttpRequest):
        if cluster is None:
            return _error(404, "gossip is not enabled on this daemon (set gossipListen or --gossip-listen)")
        return JSONResponse(cluster())

    def _owner(req: HttpRequest) -> str:
        owner = req.query_params.get("owner")
        if not owner:
            raise HamidError("query parameter owner is required")
        return owner

    async def update(req: HttpRequest):
        owner = _owner(req)
        body = await _body(req)
        res = await run(ledger.update, owner, state=body.get("state"), mig=body.get("mig"),
                        details=body.get("details"))
        return JSONResponse(res.to_dict())

    async def release(req: HttpRequest):
        owner = _owner(req)
        res = await run(ledger.release, owner)
        if res is not None:
            log.info("released", owner=owner)
        return JSONResponse({"released": res is not None, "reservation": res.to_dict() if res else None})

    routes = [
        Route("/v1/status", guarded(status), methods=["GET"]),
        Route("/v1/cluster", guarded(cluster_view), methods=["GET"]),
        Route("/v1/reservations", guarded(list_reservations), methods=["GET"]),
        Route("/v1/reservations", guarded(reserve), methods=["POST"]),
        Route("/v1/reservations/commit", guarded(commit), methods=["POST"]),
        Route("/v1/reservations", guarded(update), methods=["PATCH"]),
        Route("/v1/reservations", guarded(release), methods=["DELETE"]),
    ]
    return Starlette(routes=routes)
