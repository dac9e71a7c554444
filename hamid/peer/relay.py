"""The peer API's listener in ``hamid front``: frames opened as nobody, relayed to the daemon.

The peer port takes bytes from anyone who reaches it. Here, in the
unprivileged front, each request is read against ``peerMaxBodyBytes``,
opened with the gossip keyring (AES-GCM) and decoded (CBOR with a depth
limit, the request's schema) by :func:`hamid.peer.frames.decode_request`; a
frame that fails is answered here (401 or 400) and never reaches the daemon.
What passes is re-encoded by this process (a plain frame: the same request
map, our own encoding) and posted to the daemon's ``frontDir/peer.sock``,
where :class:`hamid.peer.server.PeerFace` checks it again, then the sender's
signature, the replay window, the leader, and answers. The daemon's answer is
checked as a client checks one and sealed to the caller here.

The daemon keeps what needs it: the ledger, the gossiped identities a
signature is checked against, the leader's name and the replay cache (one
home for each; the front holds no state).
"""

from __future__ import annotations

import cbor2
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from ..keyring import Keyring
from ..logs import Throttle, get_logger
from ..serving import BodyTooLarge, ConnectionCount, read_body
from . import frames
from .server import FRAME_TYPE, PATH

log = get_logger("peer")

SOCKET = "peer.sock"
UPSTREAM_TIMEOUT_S = 25.0  # under the listener's 30 s request deadline; a commit waits on the ledger at most ~20 s


def relay_app(daemon_socket: str, keyring: Keyring | None, *, max_body_bytes: int,
              connections: ConnectionCount) -> Starlette:
    """``POST /v1/peer`` for callers on the network, answered by the daemon on ``daemon_socket``.
    ``keyring`` None: plain frames (``peerInsecure``), passed on as they are checked."""
    outside = frames.Sealer(keyring)
    inside = frames.Sealer(None)  # the unix socket only frontGroup reaches: frames go plain
    client = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=daemon_socket), base_url="http://hamid",
                               timeout=httpx.Timeout(UPSTREAM_TIMEOUT_S), trust_env=False)
    drop_log = Throttle(10.0)

    async def handle(req: Request) -> Response:
        try:
            frame = await read_body(req, max_body_bytes)
        except BodyTooLarge:
            return PlainTextResponse(f"too-large: request body over {max_body_bytes} bytes (peerMaxBodyBytes)\n",
                                     status_code=413)
        try:
            msg = frames.decode_request(outside, frame)
        except frames.FrameError as e:
            result = "unauthenticated" if e.reason == "key" else "bad-request"
            now, held = drop_log.ready()  # a stranger must not be able to flood the log
            if now:
                log.warning("peer request dropped", reason=e.reason, detail=e.detail,
                            client=req.client.host if req.client else None, similar_not_logged=held)
            return PlainTextResponse(f"{result}: {e.detail}\n", status_code=401 if e.reason == "key" else 400)
        if keyring is not None:  # it holds the key: no longer counted against its address
            connections.authenticated(req.client)
        rid = msg["id"]
        try:
            r = await client.post(PATH, content=inside.seal(cbor2.dumps(msg), frames.AAD_REQUEST),
                                  headers={"content-type": FRAME_TYPE})
            if r.headers.get("content-type") != FRAME_TYPE:  # refused before an answer (a signature): its words
                return PlainTextResponse(r.text[:4096], status_code=r.status_code)
            answer = frames.decode_answer(inside, r.content, rid)
        except (httpx.HTTPError, frames.FrameError) as e:
            log.warning("the daemon did not answer a peer call", method=msg["m"], error=str(e)[:200])
            return Response(frames.encode_answer(outside, rid, error=frames.BUSY,
                                                 message=f"node {msg['to']}: its daemon is not answering"),
                            status_code=503, media_type=FRAME_TYPE)
        if answer["ok"]:
            sealed = frames.encode_answer(outside, rid, result=answer["result"])
        else:
            sealed = frames.encode_answer(outside, rid, error=answer["error"], message=answer["message"],
                                          reasons=answer["reasons"])
        return Response(sealed, status_code=r.status_code, media_type=FRAME_TYPE)

    return Starlette(routes=[Route(PATH, handle, methods=["POST"])])
