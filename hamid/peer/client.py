"""The peer API's client: :class:`PeerClient` asks another node to commit,
release or report, and trusts only answers sealed to its own request.

Every call makes a fresh request id and timestamp, so a retry after a lost
answer is a new request (commit and release are idempotent on the node, so
retrying is safe). An answer is accepted only if it opens with a key of our
keyring under the request's id: a server without the key, or a recorded
answer to an earlier request, is :class:`PeerUnauthenticated`.
"""

from __future__ import annotations

from typing import Any

import httpx

from ..keyring import Keyring
from ..logs import get_logger
from . import frames
from ..netaddr import parse_address
from .errors import (PeerError, PeerProtocolError, PeerRefused, PeerUnauthenticated, PeerUnknownMethod,
                     PeerUnreachable)
from .server import FRAME_TYPE, PATH

log = get_logger("peer")


class PeerClient:
    """Use as ``async with PeerClient(keyring) as c: await c.commit(addr, ...)``.

    ``keyring`` None needs ``insecure=True`` (plain frames; only a server in
    insecure mode answers them). ``timeout_s`` bounds connecting and each
    read; ``max_answer_bytes`` bounds what a peer can make us buffer."""

    def __init__(self, keyring: Keyring | None, *, insecure: bool = False, name: str = "",
                 timeout_s: float = 5.0, max_answer_bytes: int = 16 * 1024 * 1024, identity=None) -> None:
        """``identity``: this node's :class:`~hamid.nodekey.NodeIdentity`; every
        request is then signed with it (what a daemon's peers require)."""
        if keyring is None and not insecure:
            raise ValueError("PeerClient needs the gossip keyring, or insecure=True to send plain frames")
        self.sealer = frames.Sealer(keyring)
        self.max_batch = frames.MAX_BATCH  # commits one commit_many may carry (what a batching caller reads)
        self.name = name
        self.identity = identity
        self.max_answer_bytes = max_answer_bytes
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), trust_env=False)

    @classmethod
    def from_config(cls, config: Any, keyring: Keyring | None, *, name: str = "", identity=None) -> "PeerClient":
        """A client as the ``peer*`` keys of ``config`` say (timeout, insecure mode)."""
        return cls(keyring, insecure=config.peerInsecure, name=name, timeout_s=config.peerTimeout,
                   identity=identity)

    async def __aenter__(self) -> "PeerClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # --- the calls ---------------------------------------------------

    async def commit(self, address: str, owner: Any, decision: Any, *, request: dict | None = None,
                     details: dict | None = None) -> dict:
        """Commit ``decision`` for ``owner`` (an ``Owner``) on the node at
        ``address``; the reservation as a dict. :class:`PeerRefused` (with the
        ledger's reasons) when it does not fit there."""
        args = {"owner": owner.to_dict(), "decision": decision.to_dict(), "request": request, "details": details}
        return await self.call(address, "commit", args, to=decision.node)

    async def commit_many(self, address: str, node: str, items: list[dict]) -> list[dict | PeerError]:
        """Commit several decisions on ``node`` (at ``address``) in one request and one ledger
        transaction there. ``items``: ``{"owner": Owner, "decision": Decision, "request": dict |
        None, "details": dict | None}``, at most :data:`~.frames.MAX_BATCH`. One verdict per item,
        in order: the reservation as a dict, or the item's own refusal as an exception *value*
        (:class:`PeerRefused` with the ledger's reasons, :class:`PeerProtocolError` for an item
        the node could not read); the others are committed whatever one item's verdict. What
        fails the whole request is raised as :meth:`call` raises it, and
        :class:`PeerUnknownMethod` from a node too old to know the verb (nothing was applied
        there: send the commits one by one)."""
        if not 1 <= len(items) <= frames.MAX_BATCH:
            raise ValueError(f"commit_many: {len(items)} items; accepted: 1 to {frames.MAX_BATCH}")
        args = {"items": [{"owner": it["owner"].to_dict(), "decision": it["decision"].to_dict(),
                           "request": it.get("request"), "details": it.get("details")} for it in items]}
        got = await self.call(address, "commit_many", args, to=node)
        results = got.get("results") if type(got) is dict else None
        if type(results) is not list or len(results) != len(items) or not all(type(r) is dict for r in results):
            raise PeerProtocolError(f"peer {address} answered commit_many without one verdict per item",
                                    "answer", address=address)
        out: list[dict | PeerError] = []
        for r in results:
            if r.get("ok") is True and type(r.get("reservation")) is dict:
                out.append(r["reservation"])
            elif r.get("error") == frames.REFUSED:
                out.append(PeerRefused(str(r.get("message")), [str(x) for x in r.get("reasons") or ()],
                                       address=address))
            else:
                out.append(PeerProtocolError(f"peer {address} refused a commit of the batch "
                                             f"({r.get('error')}): {r.get('message')}", str(r.get("error")),
                                             address=address))
        return out

    async def release(self, address: str, key: str, *, node: str) -> dict:
        """Release the reservation ``key`` (``Owner.key``) on ``node`` (the peer at
        ``address`` refuses unless it is that node); ``{"released": bool,
        "reservation": dict | None}``. Idempotent."""
        return await self.call(address, "release", {"key": key}, to=node)

    async def status(self, address: str, *, node: str) -> dict:
        """The node's status document (as ``hamid status -o json`` prints it)."""
        return await self.call(address, "status", {}, to=node)

    # --- one round trip ----------------------------------------------------

    async def call(self, address: str, method: str, args: dict, *, to: str) -> Any:
        host, port = parse_address(address, "peer address")
        url = f"http://[{host}]:{port}{PATH}" if ":" in host else f"http://{host}:{port}{PATH}"
        msg = frames.new_request(method, args, sender=self.name, to=to)
        body = frames.encode_request(self.sealer, msg, self.identity)
        status, ctype, answer = await self._post(address, url, body)
        if ctype != FRAME_TYPE:
            # plain text, not a frame: the server's own claim, which nobody can verify
            text = answer[:300].decode("utf-8", "replace").strip()
            if status == 401:
                raise PeerUnauthenticated(f"peer {address} could not authenticate this request ({text}): "
                                          "the two nodes share no key of the gossip keyring", address=address)
            if status == 400 and text.startswith(f"bad-request: method {method!r};"):
                raise PeerUnknownMethod(f"peer {address} does not know the {method} request (an older hamid): "
                                        f"{text}", address=address)
            kind = "too-large" if status == 413 else frames.BAD_REQUEST if status == 400 else "answer"
            raise PeerProtocolError(f"peer {address} refused the request (HTTP {status}): {text}", kind,
                                    address=address)
        try:
            got = frames.decode_answer(self.sealer, answer, msg["id"])
        except frames.FrameError as e:
            if e.reason == "key":
                raise PeerUnauthenticated(f"the answer from {address} (HTTP {status}) is not sealed for this "
                                          f"request by a key of our keyring ({e.detail}): the server is not "
                                          "a key holder", address=address) from None
            raise PeerProtocolError(f"unreadable answer from {address} (HTTP {status}): {e.detail}",
                                    "answer", address=address) from None
        if got["ok"]:
            return got["result"]
        if got["error"] == frames.REFUSED:
            raise PeerRefused(got["message"], got["reasons"], address=address)
        raise PeerProtocolError(f"peer {address} refused the {method} request ({got['error']}): {got['message']}",
                                got["error"], address=address)

    async def _post(self, address: str, url: str, body: bytes) -> tuple[int, str, bytes]:
        try:
            async with self._http.stream("POST", url, content=body,
                                         headers={"content-type": FRAME_TYPE}) as resp:
                buf = bytearray()
                async for chunk in resp.aiter_bytes():
                    buf += chunk
                    if len(buf) > self.max_answer_bytes:
                        raise PeerProtocolError(f"answer from {address} is over {self.max_answer_bytes} bytes",
                                                "answer", address=address)
                ctype = resp.headers.get("content-type", "").split(";")[0].strip()
                return resp.status_code, ctype, bytes(buf)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise PeerUnreachable(f"cannot reach peer {address}: {e or type(e).__name__}",
                                  address=address) from None
        except httpx.HTTPError as e:  # sent, but the answer did not arrive whole
            raise PeerUnreachable(f"no complete answer from peer {address} ({type(e).__name__}: {e}); the "
                                  "request may have been applied, and retrying is safe", address=address,
                                  maybe_applied=True) from None
