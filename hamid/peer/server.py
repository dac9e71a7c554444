"""The peer API's server face: :class:`PeerFace` answers sealed requests over HTTP.

One route, ``POST /v1/peer``, served by hypercorn on trio (starlette app).
Each request is bounded in size, opened with the keyring, checked for
freshness (:mod:`.replay`), then handed to the node service, whose ledger
re-checks a commit in one transaction. Answers are sealed to the request
(:mod:`.frames`). What cannot be opened gets a plain 401 naming why, and
nothing else: a caller without a key learns nothing about the node.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ..errors import HamidError
from ..keyring import Keyring
from ..logs import Throttle, get_logger
from ..serving import BodyTooLarge, ConnectionCount, read_body
from ..node.callers import DetailsError, caller_details
from ..node.layout import LayoutError, component
from ..node.identity import Owner
from ..node.service import LedgerConflict
from ..placement import Decision
from . import frames
from ..nodekey import verify
from ..request.model import Request, RequestError
from ..netaddr import format_address, is_loopback, is_wildcard, parse_address
from .replay import ReplayGuard, Refused
from .stats import PeerCollector, PeerStats

log = get_logger("peer")

PATH = "/v1/peer"
FRAME_TYPE = "application/x-hamid-peer"
_STATUS = {frames.REFUSED: 409, frames.BAD_REQUEST: 400, frames.STALE: 400, frames.REPLAY: 400,
           frames.WRONG_NODE: 400, frames.BUSY: 503, frames.INTERNAL: 500, frames.FORBIDDEN: 403}


class PeerConfigError(HamidError):
    """The peer API cannot start as configured."""


def _optional_map(args: dict, key: str) -> dict | None:
    v = args.get(key)
    if v is not None and type(v) is not dict:
        raise frames.FrameError("schema", f"{key!r} must be a map or null")
    return v


class PeerFace:
    """The peer API as a face of the node: ``run`` serves until cancelled.

    ``node`` has async ``commit(owner, decision, request=, details=)``,
    ``commit_many([(owner, decision, request, details)])``, ``release(key)``
    and ``status()`` and a ``name``. ``keyring`` None is
    refused unless ``insecure`` (then frames are plain and anyone who can
    reach ``listen`` may commit and release: loopback tests only)."""

    name = "peer"

    def __init__(self, node: Any, keyring: Keyring | None, listen: str, *, insecure: bool = False,
                 window_s: float = 30.0, max_body_bytes: int = 256 * 1024, max_ids: int = 65536,
                 stats: PeerStats | None = None, identities: Callable[[str], str | None] | None = None,
                 leader: Callable[[], str | None] | None = None,
                 confirm_leader: Callable[[str], Awaitable[str | None]] | None = None,
                 unix_group: int | None = None) -> None:
        """``identities(node)``: the public key ``node`` gossips (None: unknown);
        set, every request must carry its sender's signature, a commit records
        its sender as the reservation's placer and a release is accepted only
        from that placer. ``leader()``: the node the current leader runs on; set,
        only that node may commit. ``confirm_leader(sender)``: asked when a commit
        comes from another node than ``leader()`` names, the leader's node read
        afresh from the Lease (right after a leader change this node's view lags
        the new leader by up to a retry period; its first commits must not be
        refused for that). Both unset (tests, no gossip): any key holder may call.

        ``listen`` ``unix:PATH``: the requests ``hamid front`` relays (:mod:`hamid.peer.relay`),
        already opened with the keyring there and re-encoded, arrive as plain frames on
        this socket (mode 0660, group ``unix_group``); the sender's signature, the
        replay window and everything after are checked here as for a TCP listener."""
        from ..cborcheck import check_cbor2

        check_cbor2()  # frames are CBOR with a depth limit: an old cbor2 would drop every one silently
        self.node = node
        self.unix_group = unix_group
        if listen.startswith("unix:"):
            if keyring is not None:
                raise PeerConfigError("a peer API on a unix socket takes the frames hamid front opened: no keyring")
            self.listen = listen
        else:
            host, port = parse_address(listen, "peerListen")
            if keyring is None and not insecure:
                raise PeerConfigError("the peer API needs the gossip keyring to authenticate peers: set "
                                      "gossipKeyFile, or peerInsecure: true to run it unauthenticated "
                                      "(anyone who reaches peerListen could then commit and release)")
            if keyring is None:
                log.warning("peer API without a key: requests are neither encrypted nor authenticated",
                            listen=listen, loopback=is_loopback(host))
            self.listen = format_address(host, port)
        self.sealer = frames.Sealer(keyring)
        self.guard = ReplayGuard(window_s, max_ids)
        self.max_body_bytes = max_body_bytes
        self.stats = stats or PeerStats()
        self.identities = identities
        self.leader = leader
        self.confirm_leader = confirm_leader
        self.bound: str | None = None  # HOST:PORT actually bound (port 0 resolved), once serving
        self._drop_log = Throttle(10.0)
        self.connections = ConnectionCount()  # the listener's connections, by source until authenticated

    @classmethod
    def from_config(cls, node: Any, config: Any, keyring: Keyring | None, *,
                    identities: Callable[[str], str | None] | None = None,
                    leader: Callable[[], str | None] | None = None,
                    confirm_leader: Callable[[str], Awaitable[str | None]] | None = None) -> "PeerFace":
        """The face as the ``peer*`` keys of ``config`` say (``peerListen`` must be set);
        ``keyring`` is the one loaded from ``gossipKeyFile``."""
        return cls(node, keyring, config.peerListen, insecure=config.peerInsecure,
                   window_s=config.peerReplayWindow, max_body_bytes=config.peerMaxBodyBytes,
                   max_ids=config.peerReplayCacheSize, identities=identities, leader=leader,
                   confirm_leader=confirm_leader)

    def collector(self) -> PeerCollector:
        return PeerCollector(self.stats)

    # --- one request -------------------------------------------------------

    async def _handle(self, req: HttpRequest) -> Response:
        try:
            frame = await read_body(req, self.max_body_bytes)
        except BodyTooLarge:
            self.stats.note("unknown", "too-large")
            return PlainTextResponse(f"too-large: request body over {self.max_body_bytes} bytes "
                                     "(peerMaxBodyBytes)\n", status_code=413)
        try:
            msg = frames.decode_request(self.sealer, frame)
        except frames.FrameError as e:
            result = "unauthenticated" if e.reason == "key" else "bad-request"
            self.stats.note("unknown", result)
            now, held = self._drop_log.ready()  # a stranger must not be able to flood the log
            if now:
                log.warning("peer request dropped", reason=e.reason, detail=e.detail,
                            client=req.client.host if req.client else None, similar_not_logged=held)
            return PlainTextResponse(f"{result}: {e.detail}\n", status_code=401 if e.reason == "key" else 400)
        method, rid = msg["m"], msg["id"]
        if self.identities is not None:
            why = self._unsigned(msg)
            if why is not None:
                self.stats.note(method, "unauthenticated")
                now, held = self._drop_log.ready()
                if now:
                    log.warning("peer request dropped", reason="identity", detail=why, similar_not_logged=held)
                return PlainTextResponse(f"unauthenticated: {why}\n", status_code=401)
        # opened with the keyring (and signed by its sender, where identities are checked): this
        # connection no longer counts against its source's share of the listener
        self.connections.authenticated(req.client)
        try:
            self.guard.admit(rid, msg["ts"])
            if msg["to"] != self.node.name:
                raise Refused(frames.WRONG_NODE, f"this is node {self.node.name!r}, the request is for "
                                                 f"{msg['to']!r}")
            result = await self._dispatch(method, msg["args"], msg["from"])
        except Refused as e:
            return self._error(msg, e.kind, str(e))
        except LedgerConflict as e:
            return self._error(msg, frames.REFUSED, str(e), e.reasons)
        except frames.FrameError as e:
            return self._error(msg, frames.BAD_REQUEST, e.detail)
        except HamidError as e:
            return self._error(msg, frames.BAD_REQUEST, str(e))
        except Exception as e:  # a bug: answer it, and log it whole
            log.exception("peer handler failed", method=method)
            return self._error(msg, frames.INTERNAL, f"internal error on node {self.node.name}: {e!r}")
        self.stats.note(method, "ok")
        return Response(frames.encode_answer(self.sealer, rid, result=result), media_type=FRAME_TYPE)

    def _error(self, msg: dict, kind: str, message: str, reasons=()) -> Response:
        self.stats.note(msg["m"], kind)
        log.info("peer request refused", method=msg["m"], sender=msg["from"], kind=kind, message=message)
        return Response(frames.encode_answer(self.sealer, msg["id"], error=kind, message=message,
                                             reasons=tuple(reasons)),
                        status_code=_STATUS[kind], media_type=FRAME_TYPE)

    def _unsigned(self, msg: dict) -> str | None:
        """Why ``msg`` is not signed by the node it names as sender, or None."""
        sender = msg["from"]
        pk = self.identities(sender) if sender and self.identities is not None else None
        if pk is None:
            return f"no gossiped identity for sender {sender!r}: not a live member of this cluster"
        sig = msg.get("sig")
        if sig is None:
            return f"request from {sender!r} is not signed"
        if not verify(pk, sig, frames.signed_bytes(msg)):
            return f"signature does not match the identity {sender!r} gossips"
        return None

    async def _dispatch(self, method: str, args: dict, sender: str) -> Any:
        if method == "status":
            return await self.node.status()
        if method == "release":
            key = args.get("key")
            if type(key) is not str or not 0 < len(key) <= 512:
                raise frames.FrameError("schema", "release: 'key' must be a non-empty string")
            if self.identities is not None:
                held = await self.node.get(key)
                if held is not None and (held.kind != "pod" or held.details.placer != sender):
                    raise Refused(frames.FORBIDDEN, f"{key} was not placed by node {sender!r}; only its placer "
                                                    "may release it through the peer API")
            res = await self.node.release(key)
            if res is not None:
                log.info("released for a peer", key=key)
            return {"released": res is not None, "reservation": res.to_dict() if res is not None else None}
        if method == "commit_many":
            return await self._commit_many(args, sender)
        owner, decision, request, details = self._commit_args(args, "commit")
        await self._leader_only(sender)
        res = await self.node.commit(owner, decision, request=request, details=self._placed_by(details, sender))
        log.info("committed for a peer", owner=owner.key, node=decision.node)
        return res.to_dict()

    def _commit_args(self, args: Any, what: str):
        """(owner, decision, request, details) of one commit's arguments, checked; FrameError names what is wrong."""
        if type(args) is not dict:
            raise frames.FrameError("schema", f"{what}: expected a map")
        owner_d, decision_d = args.get("owner"), args.get("decision")
        if type(owner_d) is not dict or type(decision_d) is not dict:
            raise frames.FrameError("schema", f"{what}: 'owner' and 'decision' maps are required")
        try:
            owner = Owner.from_dict(owner_d)
        except Exception as e:
            raise frames.FrameError("schema", f"{what}: malformed owner ({e!r})") from None
        try:
            decision = Decision.from_dict(decision_d)
        except Exception as e:
            raise frames.FrameError("schema", f"{what}: malformed decision ({e!r})") from None
        try:
            details = caller_details(args.get("details"))
            for c in decision.containers:  # the node derives file names from these
                component(c.name, "container name")
        except (DetailsError, LayoutError) as e:
            raise frames.FrameError("schema", f"{what}: {e}") from None
        try:
            request = Request.from_dict(got) if (got := _optional_map(args, "request")) else None
        except RequestError as e:
            raise frames.FrameError("schema", f"{what}: {e}") from None
        return owner, decision, request, details

    async def _leader_only(self, sender: str) -> None:
        if self.leader is not None:
            lead = self.leader()
            if lead != sender and self.confirm_leader is not None:
                lead = await self.confirm_leader(sender)
            if lead != sender:
                raise Refused(frames.FORBIDDEN, f"node {sender!r} is not the leader (this node sees "
                                                f"{lead or 'no leader'}); only the leader commits placements")

    def _placed_by(self, details, sender: str):
        """``details`` with the node's own record of who placed it (only it may release it), where
        senders are authenticated."""
        return details if self.identities is None else replace(details, placer=sender)

    async def _commit_many(self, args: dict, sender: str) -> dict:
        """Several commits in one request and one ledger transaction; a verdict for each, in order.
        A malformed item is refused alone (``bad-request``), as is one the ledger refuses
        (``refused``, with its reasons); the others are committed."""
        items = args.get("items")
        if type(items) is not list or not 1 <= len(items) <= frames.MAX_BATCH:
            got = f"{len(items)} items" if type(items) is list else f"a {type(items).__name__}"
            raise frames.FrameError("schema", f"commit_many: 'items' must be a list of 1 to {frames.MAX_BATCH} "
                                              f"commits; got {got}")
        await self._leader_only(sender)
        verdicts: list[dict | None] = [None] * len(items)
        todo, where = [], []
        for i, item in enumerate(items):
            try:
                owner, decision, request, details = self._commit_args(item, f"commit_many item {i}")
            except frames.FrameError as e:
                verdicts[i] = {"ok": False, "error": frames.BAD_REQUEST, "message": e.detail, "reasons": []}
                continue
            todo.append((owner, decision, request, self._placed_by(details, sender)))
            where.append(i)
        got = await self.node.commit_many(todo) if todo else []
        for i, out in zip(where, got):
            if isinstance(out, LedgerConflict):
                verdicts[i] = {"ok": False, "error": frames.REFUSED, "message": str(out), "reasons": list(out.reasons)}
            else:
                verdicts[i] = {"ok": True, "reservation": out.to_dict()}
        log.info("committed for a peer", owners=len(todo), refused=sum(1 for v in verdicts if v and not v["ok"]))
        return {"results": verdicts}

    # --- serving -----------------------------------------------------------

    def app(self) -> Starlette:
        return Starlette(routes=[Route(PATH, self._handle, methods=["POST"])])

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        from ..serving import ListenError, serve_asgi

        try:
            async with trio.open_nursery() as nursery:
                try:
                    binds = await nursery.start(lambda task_status: serve_asgi(
                        self.app(), self.listen, what="peerListen", counts=self.connections,
                        unix_group=self.unix_group, task_status=task_status))
                except ListenError as e:
                    raise PeerConfigError(str(e)) from None
                if self.listen.startswith("unix:"):
                    self.bound = self.listen
                else:
                    host, port = parse_address(binds[0].split("://", 1)[1], "bound address")
                    self.bound = format_address(host, port)
                log.info("peer API serving", listen=self.bound, authenticated=self.sealer.secure)
                task_status.started(self.bound)
        finally:
            self.bound = None


def advertised(listen: str, advertise: str | None) -> str:
    """The address peers dial: ``advertise``, else ``listen`` when it is concrete."""
    if advertise:
        parse_address(advertise, "peerAdvertise")
        return advertise
    host, _ = parse_address(listen, "peerListen")
    if is_wildcard(host):
        raise PeerConfigError(f"peerListen {listen} is a wildcard address, which peers cannot dial: "
                              "set peerAdvertise to this node's HOST:PORT")
    return listen
