"""The web face: the page, its live stream and the what-if box on ``webListen``.

Routes (served with :func:`hamid.serving.serve_asgi`, the stack every face uses):

- ``GET /``: the page; ``GET /static/<file>``: its CSS and JavaScript (no
  other asset exists; nothing is fetched from elsewhere; a Content Security
  Policy of ``'self'`` says so to the browser too);
- ``GET /api/state``: the page's document (:mod:`.snapshot`) once;
- ``GET /api/events``: the same document as server-sent events, sent again
  whenever it changes;
- ``POST /api/whatif``: the what-if box (:mod:`.whatif`), JSON
  ``{"text": ...}`` in, ``hamid plan``'s JSON out;
- ``GET|POST /login``: the token form (only with ``webTokenFile``).

Idle cost: nothing runs while nobody looks. While at least one live stream
is open, one watcher task looks every ``WATCH_INTERVAL_S`` at cheap change
marks (the ledger's change stamp, the gossip members' states and capacity
versions, the leader) and, when one moved or every ``USAGE_INTERVAL_S`` for
the tenants' live use, rebuilds the document in a worker thread; a new
document goes to every stream at once. A commit on this node wakes it at
once (the node service's change events). Other nodes' tenants are asked of
them (``remote_status``) only while someone looks, and again only when
their capacity document changed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import aclosing
from importlib import resources
from typing import Any

import trio

from ..logs import get_logger
from ..node.service import NodeService
from ..placement.view import NodeView
from . import snapshot
from .guard import COOKIE, MAX_BODY, STREAM_MAX_S, ConnectionCap, Guard
from .tenants import local_tenants
from .whatif import WhatIfError, answer

log = get_logger("web")

WATCH_INTERVAL_S = 0.5  # how often the marks are looked at: updates reach the page well within 2 s
USAGE_INTERVAL_S = 2.0  # live use (shim regions) changes without a commit: re-read this often while watched
REMOTE_FETCHES = 8  # other nodes' statuses asked at once: a 100-node view fills in a few round trips
REMOTE_TIMEOUT_S = 5.0  # one node's status; a silent node is shown without tenants, asked again on change
WHATIF_THREADS = 2  # what-ifs planned at once (CPU): a crowd clicking cannot take the daemon's cores
HEARTBEAT_S = 15.0  # a comment line on a quiet stream, so proxies and the browser keep it
ASSETS = ("index.html", "login.html", "app.js", "app.css")
_TYPES = {"html": "text/html; charset=utf-8", "js": "text/javascript; charset=utf-8",
          "css": "text/css; charset=utf-8"}
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
_HEADERS = {"content-security-policy": _CSP, "x-content-type-options": "nosniff",
            "referrer-policy": "no-referrer", "x-frame-options": "DENY"}


def load_assets() -> dict[str, bytes]:
    pkg = resources.files(__package__) / "static"
    return {name: (pkg / name).read_bytes() for name in ASSETS}


class Hub:
    """The current document and the watcher that keeps it fresh while streams are open."""

    def __init__(self, gather: Callable[[], Any], marks: Callable[[], object]) -> None:
        self.gather = gather  # async () -> dict: a fresh document
        self.marks = marks  # () -> anything comparable, cheap, in trio's thread
        self.data: bytes = b""
        self.version = 0
        self.watchers = 0
        self.rebuilds = 0  # documents built (tests: nobody looking builds none)
        self._changed = trio.Event()
        self._poke = trio.Event()
        self._running = False
        self.nursery: trio.Nursery | None = None

    def poke(self) -> None:
        """Something changed on this node: look now (a no-op while nobody looks)."""
        self._poke.set()

    async def current(self) -> bytes:
        if not self.watchers or not self.data:
            await self.refresh()
        return self.data

    async def refresh(self) -> None:
        doc = await self.gather()
        self.rebuilds += 1
        data = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
        if data != self.data:
            self.data = data
            self.version += 1
            self._changed.set()
            self._changed = trio.Event()

    async def _watch(self) -> None:
        try:
            last_marks: object = object()
            last_full = -1e9
            while self.watchers:
                marks = self.marks()
                now = trio.current_time()
                if marks != last_marks or now - last_full >= USAGE_INTERVAL_S:
                    try:
                        await self.refresh()
                    except Exception:  # a bad read must not end the stream; the next look retries
                        log.exception("web view: the document could not be built")
                    last_marks, last_full = marks, now
                with trio.move_on_after(WATCH_INTERVAL_S):
                    await self._poke.wait()
                self._poke = trio.Event()
        finally:
            self._running = False

    async def stream(self):
        """Yield each new document (the current one first) until cancelled."""
        self.watchers += 1
        try:
            if not self._running and self.nursery is not None:
                self._running = True  # now: a second stream arriving before it runs must not start another
                self.nursery.start_soon(self._watch)
            if not self.data:  # the watcher just started builds the first document
                await self._changed.wait()
            sent = 0
            while True:
                if self.version != sent:
                    sent = self.version
                    yield self.data
                    continue
                waiting = self._changed
                with trio.move_on_after(HEARTBEAT_S):
                    await waiting.wait()
                    continue
                yield None  # a heartbeat
        finally:
            self.watchers -= 1


class WebFace:
    name = "web"

    def __init__(self, node: NodeService, listen: str, *, settings, cluster: Callable[[], dict] | None = None,
                 marks: Callable[[], object] | None = None, leader: Callable[[], dict | None] | None = None,
                 containers_root: str | None = None, token: str | None = None, max_connections: int = 32,
                 request_timeout: float = 10.0, live_views: Callable[[], list[NodeView]] | None = None,
                 remote_status: Callable[[str, str], Any] | None = None) -> None:
        """``cluster``: the gossiped cluster document (None without gossip);
        ``marks``: cheap change marks (see the module); ``live_views``: the
        node views ``hamid plan --live`` plans on; ``settings``: this node's
        settings (the what-if's defaults and policies); ``remote_status(node,
        peer address)``: another node's status document (async; the daemon
        asks it through the peer API), for the other nodes' tenants."""
        self.node = node
        self.listen = listen
        self.settings = settings
        self.cluster = cluster
        self.leader = leader
        self.live_views = live_views
        self.guard = Guard(token)
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.assets = load_assets()
        self.regions = None
        if containers_root:
            from ..shimregion.collector import ShimRegionCollector

            self.regions = ShimRegionCollector(containers_root, budget_s=0.5)
        self._rows: dict = {}  # per member and capacity version: its rows (snapshot.build's cache)
        self.remote_status = remote_status
        self._remote: dict[str, tuple[int, list[dict]]] = {}  # node -> (capacity version, its tenants)
        self._fetching: set[str] = set()
        self._failed: dict[str, int] = {}  # node -> capacity version whose ask failed (not asked again until it moves)
        self._fetch_limit = trio.CapacityLimiter(REMOTE_FETCHES)
        self._read_limit = trio.CapacityLimiter(1)  # ledger and region reads: one at a time
        self._plan_limit = trio.CapacityLimiter(WHATIF_THREADS)
        self.hub = Hub(self._gather, marks or (lambda: None))
        node.subscribe(lambda event, key: self.hub.poke())
        self.bound: list[str] = []

    # --- the document --------------------------------------------------------------

    def _read_node(self):
        """Blocking: this node's reservations, GPU views, status and tenants."""
        door = self.node.door()
        view = door.view()
        res = door.reservations()
        tenants = local_tenants(self.node.name, res, self.regions, {g.uuid for g in view.gpus})
        status = None if self.cluster is not None else door.status(self.node.backend_label)
        return {g.uuid: g for g in view.gpus}, tenants, status

    def _remote_tenants(self, cluster: dict, fetch: bool) -> tuple[list[dict], list[str]]:
        """Other nodes' tenants as last fetched, and the nodes whose tenants
        cannot be had (no peer API). With ``fetch``, a node whose capacity
        document is newer than its fetched tenants is asked again in the
        background (the watcher is poked when the answer is in)."""
        out: list[dict] = []
        unknown: list[str] = []
        live = set()
        for m in cluster["members"]:
            cap = m.get("capacity")
            if m.get("self") or not cap or m["state"] not in ("alive", "suspect"):
                continue
            live.add(m["name"])
            got = self._remote.get(m["name"])
            if got is not None:
                out.extend(got[1])
            peer = cap.get("peer")
            if self.remote_status is None or not peer or m["name"] in self._failed:
                unknown.append(m["name"])
            if self.remote_status is None or not peer:
                continue
            if fetch and (got is None or got[0] != cap["version"]) and m["name"] not in self._fetching \
                    and self._failed.get(m["name"]) != cap["version"] and self.hub.nursery is not None:
                self._fetching.add(m["name"])
                self.hub.nursery.start_soon(self._fetch, m["name"], peer, cap["version"])
        for gone in set(self._remote) - live:
            del self._remote[gone]
        self._failed = {k: v for k, v in self._failed.items() if k in live}
        return out, unknown

    async def _fetch(self, node: str, peer: str, version: int) -> None:
        try:
            async with self._fetch_limit:
                with trio.move_on_after(REMOTE_TIMEOUT_S):
                    if self.remote_status is None:
                        return
                    status = await self.remote_status(node, peer)
                    from .tenants import tenants_from_status

                    self._remote[node] = (version, tenants_from_status(node, status))
                    self._failed.pop(node, None)
                    self.hub.poke()
                    return
            raise TimeoutError(f"no answer in {REMOTE_TIMEOUT_S} s")
        except Exception as e:  # unreachable, refused: its tenants stay as last seen; asked again on change
            log.info("web view: could not read a node's tenants", node=node, error=str(e))
            if node not in self._failed:
                self.hub.poke()
            self._failed[node] = version
        finally:
            self._fetching.discard(node)

    async def _gather(self, fetch: bool = True) -> dict:
        # a thread of the face's own: the node service's threads stay free for creates and commits
        gpus, tenants, status = await trio.to_thread.run_sync(self._read_node, limiter=self._read_limit)
        cluster = self.cluster() if self.cluster is not None else None
        unknown: list[str] = []
        if cluster is not None:
            remote, unknown = self._remote_tenants(cluster, fetch)
            tenants = tenants + sorted(remote, key=lambda t: (t["node"], t["namespace"], t["name"], t["owner"]))
        return snapshot.build(node=self.node.name, cluster=cluster, status=status, view_gpus=gpus,
                              tenants=tenants, leader=self.leader() if self.leader else None,
                              backend=self.node.backend_label, cache=self._rows, tenants_unknown=unknown)

    def _views(self) -> list[NodeView]:
        if self.live_views is not None:
            return self.live_views()
        return [self.node.door().view()]

    # --- HTTP ---------------------------------------------------------------------

    def app(self):
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
        from starlette.routing import Route

        guard = self.guard

        def page(name: str, status: int = 200) -> Response:
            ext = name.rsplit(".", 1)[1]
            cache = "no-cache" if ext == "html" else "max-age=300"
            return Response(self.assets[name], status, media_type=_TYPES[ext],
                            headers={**_HEADERS, "cache-control": cache})

        def need_auth(handler, *, api: bool):
            async def wrapped(req: Request):
                if not guard.allowed(req.headers, req.cookies):
                    if api:
                        return JSONResponse({"error": "a token is needed: Authorization: Bearer <token>, or log "
                                                      "in at /login"}, 401, headers=_HEADERS)
                    return RedirectResponse("/login", 303, headers=_HEADERS)
                return await handler(req)
            return wrapped

        def deadline(handler):
            async def wrapped(req: Request):
                with trio.move_on_after(self.request_timeout):
                    return await handler(req)
                return JSONResponse({"error": f"the request took over {self.request_timeout} s "
                                              "(webRequestTimeout)"}, 503, headers=_HEADERS)
            return wrapped

        async def body(req: Request) -> bytes:
            from ..serving import BodyTooLarge, read_body

            try:
                return await read_body(req, MAX_BODY)
            except BodyTooLarge:
                raise _TooLarge() from None

        def login_page(status: int, message: str) -> Response:
            """The login form with why the last try failed above it (a fixed text: nothing the caller sent)."""
            html = self.assets["login.html"].replace(
                b"<!--message-->", f'<p class="error" id="login-error" role="alert">{message}</p>'.encode())
            return Response(html, status, media_type=_TYPES["html"], headers={**_HEADERS, "cache-control": "no-cache"})

        async def index(req: Request):
            return page("index.html")

        async def asset(req: Request):
            name = req.path_params["name"]
            if name not in self.assets or name.endswith(".html"):
                return Response("not found\n", 404, media_type="text/plain", headers=_HEADERS)
            return page(name)

        async def login_form(req: Request):
            if guard.open:
                return RedirectResponse("/", 303, headers=_HEADERS)
            return page("login.html")

        async def login(req: Request):
            if guard.open:
                return RedirectResponse("/", 303, headers=_HEADERS)
            try:
                raw = await body(req)
            except _TooLarge:
                return login_page(413, f"The form was over {MAX_BODY} bytes; type the token alone.")
            from urllib.parse import parse_qs

            token = (parse_qs(raw.decode("utf-8", "replace")).get("token") or [""])[0].strip()
            if not guard.token_ok(token):
                log.warning("web view: a wrong token was typed in", client=req.client.host if req.client else None)
                return login_page(401, "Wrong token: it is not the one in this daemon's webTokenFile. "
                                       "Nothing was logged in; try again.")
            resp = RedirectResponse("/", 303, headers=_HEADERS)
            resp.set_cookie(COOKIE, guard.session_cookie(), httponly=True, samesite="strict", path="/")
            return resp

        async def state(req: Request):
            return Response(await self.hub.current(), media_type="application/json",
                            headers={**_HEADERS, "cache-control": "no-store"})

        async def events(req: Request):
            async def gen():
                # no cancel scope around a yield (trio forbids it): the lifetime is checked between sends
                end = trio.current_time() + STREAM_MAX_S
                yield b"retry: 1000\n\n"
                async with aclosing(self.hub.stream()) as docs:
                    async for data in docs:
                        yield b"data: " + data + b"\n\n" if data is not None else b": still here\n\n"
                        if trio.current_time() > end:
                            return
            return StreamingResponse(gen(), media_type="text/event-stream",
                                     headers={**_HEADERS, "cache-control": "no-store", "x-accel-buffering": "no"})

        async def whatif(req: Request):
            try:
                raw = await body(req)
            except _TooLarge:
                return JSONResponse({"error": f"request body over {MAX_BODY} bytes"}, 413, headers=_HEADERS)
            try:
                text = json.loads(raw).get("text")
            except (ValueError, AttributeError):
                text = None
            if not isinstance(text, str):
                return JSONResponse({"error": 'expected JSON {"text": "<what to place>"}'}, 400, headers=_HEADERS)
            views = self._views()
            try:
                # pure CPU: abandoned (left to finish) if the request's deadline passes first
                result = await trio.to_thread.run_sync(answer, text, views, self.settings,
                                                       limiter=self._plan_limit, abandon_on_cancel=True)
            except WhatIfError as e:
                return JSONResponse({"error": str(e)}, 400, headers=_HEADERS)
            return JSONResponse({"results": result, "nodes": len(views)}, headers={**_HEADERS,
                                                                                  "cache-control": "no-store"})

        app = Starlette(routes=[
            Route("/", deadline(need_auth(index, api=False)), methods=["GET"]),
            Route("/static/{name}", deadline(asset), methods=["GET"]),
            Route("/login", deadline(login_form), methods=["GET"]),
            Route("/login", deadline(login), methods=["POST"]),
            Route("/api/state", deadline(need_auth(state, api=True)), methods=["GET"]),
            Route("/api/events", need_auth(events, api=True), methods=["GET"]),
            Route("/api/whatif", deadline(need_auth(whatif, api=True)), methods=["POST"]),
        ])
        return ConnectionCap(app, self.max_connections)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        from ..serving import serve_asgi

        async with trio.open_nursery() as nursery:
            self.hub.nursery = nursery
            self.bound = await nursery.start(lambda task_status: serve_asgi(
                self.app(), self.listen, what="the web view (webListen)", task_status=task_status))
            log.info("web view serving", listen=self.listen, bound=self.bound,
                     token=not self.guard.open)
            await self._gather(fetch=False)  # once, thrown away: the first visitor does not pay for imports and caches
            task_status.started(self.bound)


class _TooLarge(Exception):
    pass
