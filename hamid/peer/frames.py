"""The peer API's wire format: sealed CBOR requests and answers.

A request is one HTTP ``POST /v1/peer`` whose body is a frame; the answer's
body is a frame too. A frame is ``[1][12-byte nonce][AES-GCM ciphertext+tag]``
sealed with the first key of the gossip keyring (every key is tried when
opening, so keys rotate as for gossip), or ``[0][plain CBOR]`` in insecure
mode. The associated data binds each frame to its role:

- request: ``hamid-peer/1 request``
- answer:  ``hamid-peer/1 answer`` + the request's 16-byte id

so a gossip frame is never a peer request, a request is never an answer, and
an answer opens only as the answer to the request it was made for: a recorded
answer cannot be passed off as the answer to a new request, and only a key
holder can make an answer at all (the client's half of mutual authentication).

Request plaintext: ``{"v": 1, "id": 16 bytes, "ts": unix seconds, "m":
method, "from": caller name, "to": the node it is for, "args": map, "sig":
64 bytes}``. ``sig`` is the sender's Ed25519 signature over the rest
(:func:`signed_bytes`), with the key whose public half the sender gossips
(:mod:`hamid.nodekey`): the keyring proves membership, the signature which
member.
``commit_many``'s args are ``{"items": [commit args, ...]}`` (1 to :data:`MAX_BATCH`), its
result ``{"results": [verdict, ...]}`` in the same order, each ``{"ok": true, "reservation":
...}`` or ``{"ok": false, "error": kind, "message": text, "reasons": [text]}``: one item refused
does not refuse the others.
Answer plaintext: ``{"v": 1, "re": request id, "ok": true, "result": ...}`` or
``{"v": 1, "re": id, "ok": false, "error": kind, "message": text, "reasons":
[text]}``. This module does no I/O.
"""

from __future__ import annotations

import os
import time
from typing import Any

import cbor2
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..keyring import Keyring

VERSION = 1
SEALED, PLAIN = 1, 0
NONCE = 12
ID_BYTES = 16
MAX_DEPTH = 32
AAD_REQUEST = b"hamid-peer/1 request"
AAD_ANSWER = b"hamid-peer/1 answer"
METHODS = ("commit", "commit_many", "release", "status")
# Placements one commit_many request may carry. 64: a leader's pass sends each node the burst binpack gave
# it (a few to a few dozen pods), 64 commits of one-container pods are ~60-120 KiB of CBOR, within the
# default peerMaxBodyBytes (256 KiB), and the node's ledger holds its write lock for all of them at once
# (~0.1 ms of checking each), so a larger batch would only lengthen that lock for other writers.
MAX_BATCH = 64
# error kinds an answer may carry
REFUSED, BAD_REQUEST, STALE, REPLAY, WRONG_NODE, BUSY, INTERNAL, FORBIDDEN = (
    "refused", "bad-request", "stale", "replay", "wrong-node", "busy", "internal", "forbidden")
ERROR_KINDS = (REFUSED, BAD_REQUEST, STALE, REPLAY, WRONG_NODE, BUSY, INTERNAL, FORBIDDEN)


class FrameError(Exception):
    """A frame that cannot be used; ``reason`` is one of ``key`` (no key of
    ours opens it, or sealed/plain does not match our mode), ``decode`` (not
    CBOR), ``schema`` (wrong version or fields)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Sealer:
    """Seals and opens peer frames with a keyring's keys, or plain frames
    when ``keyring`` is None (insecure mode, which the caller must allow)."""

    def __init__(self, keyring: Keyring | None) -> None:
        self.keyring = keyring
        self._generation = -1
        self._aes_cache: list[AESGCM] = []

    @property
    def _aes(self) -> list[AESGCM]:
        """The keyring's keys as ciphers, rebuilt when the keyring was reloaded."""
        if self.keyring is None:
            return []
        if self._generation != self.keyring.generation:
            self._aes_cache = [AESGCM(k) for k in self.keyring.keys]
            self._generation = self.keyring.generation
        return self._aes_cache

    @property
    def secure(self) -> bool:
        return self.keyring is not None

    def seal(self, plain: bytes, aad: bytes) -> bytes:
        if not self._aes:
            return bytes([PLAIN]) + plain
        nonce = os.urandom(NONCE)
        return bytes([SEALED]) + nonce + self._aes[0].encrypt(nonce, plain, aad)

    def open(self, frame: bytes, aad: bytes) -> bytes:
        if not frame:
            raise FrameError("key", "empty frame")
        if not self._aes:
            if frame[0] != PLAIN:
                raise FrameError("key", "sealed frame, but this side has no key (insecure mode)")
            return frame[1:]
        if frame[0] != SEALED:
            raise FrameError("key", "plain frame, but this side requires frames sealed with the gossip keyring")
        if len(frame) < 1 + NONCE + 16:
            raise FrameError("key", f"sealed frame of {len(frame)} bytes is too short")
        nonce, body = frame[1:1 + NONCE], frame[1 + NONCE:]
        for aes in self._aes:
            try:
                return aes.decrypt(nonce, body, aad)
            except InvalidTag:
                continue
        raise FrameError("key", "no key of this keyring opens the frame")


def _loads(body: bytes) -> Any:
    try:
        return cbor2.loads(body, max_depth=MAX_DEPTH)
    except Exception as e:  # cbor2 raises several types on bad input
        raise FrameError("decode", f"not CBOR ({type(e).__name__})") from None


def _text(x: Any, limit: int = 256) -> bool:
    return type(x) is str and 0 < len(x) <= limit


def new_request(method: str, args: dict, *, sender: str = "", to: str | None = None,
                now: float | None = None) -> dict:
    if method not in METHODS:
        raise ValueError(f"method {method!r}; accepted: {', '.join(METHODS)}")
    return {"v": VERSION, "id": os.urandom(ID_BYTES), "ts": time.time() if now is None else now,
            "m": method, "from": sender, "to": to, "args": args}


def signed_bytes(msg: dict) -> bytes:
    """What a request's signature covers: the request without its ``sig``, in canonical CBOR."""
    return cbor2.dumps({k: v for k, v in msg.items() if k != "sig"}, canonical=True)


def encode_request(sealer: Sealer, msg: dict, identity=None) -> bytes:
    """The sealed frame; with ``identity`` (a :class:`hamid.nodekey.NodeIdentity`)
    the request carries the sender's signature in ``sig``."""
    if identity is not None:
        msg = {**msg, "sig": identity.sign(signed_bytes(msg))}
    return sealer.seal(cbor2.dumps(msg), AAD_REQUEST)


def decode_request(sealer: Sealer, frame: bytes) -> dict:
    """The checked request; raises :class:`FrameError`."""
    msg = _loads(sealer.open(frame, AAD_REQUEST))
    if type(msg) is not dict:
        raise FrameError("schema", "request is not a map")
    if msg.get("v") != VERSION:
        raise FrameError("schema", f"version {msg.get('v')!r}; this node speaks {VERSION}")
    rid = msg.get("id")
    if type(rid) is not bytes or len(rid) != ID_BYTES:
        raise FrameError("schema", f"request id must be {ID_BYTES} bytes")
    ts = msg.get("ts")
    if type(ts) not in (int, float) or ts != ts:
        raise FrameError("schema", "request timestamp 'ts' missing or not a number")
    if msg.get("m") not in METHODS:
        raise FrameError("schema", f"method {msg.get('m')!r}; accepted: {', '.join(METHODS)}")
    if type(msg.get("from")) is not str or len(msg["from"]) > 256:
        raise FrameError("schema", "'from' must be a string of at most 256 characters")
    if not _text(msg.get("to")):
        raise FrameError("schema", "'to' must name the node the request is for")
    if "sig" in msg and (type(msg["sig"]) is not bytes or len(msg["sig"]) != 64):
        raise FrameError("schema", "'sig' must be a 64-byte Ed25519 signature")
    if type(msg.get("args")) is not dict:
        raise FrameError("schema", "'args' must be a map")
    return msg


def answer_aad(request_id: bytes) -> bytes:
    return AAD_ANSWER + request_id


def encode_answer(sealer: Sealer, request_id: bytes, *, result: Any = None, error: str | None = None,
                  message: str = "", reasons: tuple[str, ...] | list[str] = ()) -> bytes:
    if error is None:
        msg = {"v": VERSION, "re": request_id, "ok": True, "result": result}
    else:
        msg = {"v": VERSION, "re": request_id, "ok": False, "error": error, "message": message,
               "reasons": list(reasons)}
    return sealer.seal(cbor2.dumps(msg), answer_aad(request_id))


def decode_answer(sealer: Sealer, frame: bytes, request_id: bytes) -> dict:
    """The checked answer to the request ``request_id``; raises :class:`FrameError`."""
    msg = _loads(sealer.open(frame, answer_aad(request_id)))
    if type(msg) is not dict or msg.get("v") != VERSION:
        raise FrameError("schema", "answer is not a version-1 map")
    if msg.get("re") != request_id:
        raise FrameError("key", "answer is for another request")
    if msg.get("ok") is True:
        return msg
    if msg.get("ok") is not False or msg.get("error") not in ERROR_KINDS or type(msg.get("message")) is not str:
        raise FrameError("schema", "error answer without a known 'error' kind and a 'message'")
    reasons = msg.get("reasons")
    if type(reasons) is not list or not all(type(r) is str for r in reasons):
        raise FrameError("schema", "error answer: 'reasons' must be a list of strings")
    return msg
