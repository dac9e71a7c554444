"""Gossip frames: CBOR messages with a version, a size limit and a schema.

A frame is one websocket binary message: a keyring-sealed (or, with no
keyring, ``[0]``-prefixed plain) CBOR map ``{"v": 1, "t": TYPE, "f": sender
name, "a": sender address, ...fields, "g": [updates]}``. ``g`` carries the
piggybacked membership and capacity updates. Every received frame is checked
in this order, and the first failure names the reason it is dropped:
``size`` (over the limit), ``key`` (no key of ours opens it, or it is plain
when we have keys, or sealed when we have none), ``decode`` (not CBOR),
``version`` (not a version we speak), ``schema`` (a missing or ill-typed
field, an unknown type). This module does no I/O.

Decoding relies on cbor2's ``max_depth`` (added in cbor2 5.9.0): with an
older cbor2 every ``loads`` raised TypeError, which the decoder counted as
"not CBOR", so every frame was dropped in silence. ``check_cbor2`` probes the
installed cbor2 once, and a Codec refuses to exist without a working depth
limit, so the daemon stops at start-up with a line saying what to install.
"""

from __future__ import annotations

from typing import Any

import cbor2

from ..cluster.capacity import doc_problem
from ..cborcheck import check_cbor2
from ..keyring import PLAIN, Keyring
from .identity import valid_proof

VERSION = 1
MAX_DEPTH = 12
U63 = 1 << 63

# member states as carried in push/pull entries
ALIVE, SUSPECT, DEAD, LEFT = 0, 1, 2, 3
STATE_NAMES = {ALIVE: "alive", SUSPECT: "suspect", DEAD: "dead", LEFT: "left"}




class FrameRejected(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def _uint(x) -> bool:
    return type(x) is int and 0 <= x < U63


def _str(x) -> bool:
    return type(x) is str and 0 < len(x) <= 256


def _bool(x) -> bool:
    return type(x) is bool


def _member_entry(x) -> bool:
    """[name, addr, incarnation, state, document version(, proof or None)]: the proof (hamid.gossip.identity)
    is the member's own signature over its alive or left statement at that incarnation."""
    return (type(x) is list and len(x) in (5, 6) and _str(x[0]) and _str(x[1]) and _uint(x[2])
            and x[3] in STATE_NAMES and type(x[3]) is int and _uint(x[4])
            and (len(x) == 5 or x[5] is None or valid_proof(x[5])))


def _members(x) -> bool:
    return type(x) is list and all(_member_entry(e) for e in x)


def _names(x) -> bool:
    return type(x) is list and len(x) <= 4096 and all(_str(e) for e in x)


def _doc(x) -> bool:
    return doc_problem(x) is None


def _docs(x) -> bool:
    return type(x) is list and all(_doc(d) for d in x)


# type -> {field: check}; every listed field is required (OPTIONAL: checked when present)
FRAMES: dict[str, dict[str, Any]] = {
    "ping": {"seq": _uint, "to": _str},
    "ack": {"seq": _uint},
    "nack": {"seq": _uint},
    "preq": {"seq": _uint, "to": _str, "ta": _str, "nack": _bool},
    "gossip": {},
    "pp": {"seq": _uint, "join": _bool, "reply": _bool, "m": _members},
    "capreq": {"names": _names},
    "caps": {"docs": _docs},
}
UPDATES: dict[str, dict[str, Any]] = {
    "alive": {"n": _str, "a": _str, "i": _uint, "cv": _uint},
    "suspect": {"n": _str, "i": _uint, "by": _str},
    "dead": {"n": _str, "i": _uint, "by": _str},
    "cap": {"n": _str, "v": _uint},  # a notice: the sender holds this version of n's document
}
OPTIONAL: dict[str, dict[str, Any]] = {
    "alive": {"p": valid_proof},  # n's own signature over its alive statement (hamid.gossip.identity)
    "dead": {"p": valid_proof},  # with by == n: n's own signature over its left statement
}


def _check(msg: Any, table: dict[str, dict[str, Any]], what: str) -> None:
    if type(msg) is not dict:
        raise FrameRejected("schema", f"{what} is not a map")
    t = msg.get("t")
    spec = table.get(t) if isinstance(t, str) else None
    if spec is None or not isinstance(t, str):
        raise FrameRejected("schema", f"{what} has unknown type {t!r}")
    for k, ok in spec.items():
        if k not in msg or not ok(msg[k]):
            raise FrameRejected("schema", f"{what} {t}: field {k!r} missing or malformed")
    for k, ok in OPTIONAL.get(t, {}).items() if table is UPDATES else ():
        if k in msg and not ok(msg[k]):
            raise FrameRejected("schema", f"{what} {t}: field {k!r} malformed")


def check_frame(msg: Any) -> dict:
    if type(msg) is not dict:
        raise FrameRejected("schema", "frame is not a map")
    if msg.get("v") != VERSION:
        raise FrameRejected("version", f"version {msg.get('v')!r}, this node speaks {VERSION}")
    _check(msg, FRAMES, "frame")
    if not (_str(msg.get("f")) and _str(msg.get("a"))):
        raise FrameRejected("schema", "frame: sender name 'f' or address 'a' missing")
    g = msg.get("g")
    if g is not None:
        if type(g) is not list or len(g) > 4096:
            raise FrameRejected("schema", "frame: 'g' is not a list of updates")
        for u in g:
            _check(u, UPDATES, "update")
    return msg


class Codec:
    """Encodes and decodes frames with an optional keyring."""

    def __init__(self, keyring: Keyring | None, max_frame_bytes: int) -> None:
        check_cbor2()
        self.keyring = keyring
        self.max_frame_bytes = max_frame_bytes

    def encode(self, msg: dict) -> bytes:
        body = cbor2.dumps(msg)
        if self.keyring is None:
            return bytes([PLAIN]) + body
        return self.keyring.seal(body)

    def decode(self, frame: bytes | str) -> dict:
        if isinstance(frame, str):
            raise FrameRejected("decode", "text message (frames are binary)")
        if len(frame) > self.max_frame_bytes:
            raise FrameRejected("size", f"{len(frame)} bytes > limit {self.max_frame_bytes}")
        if not frame:
            raise FrameRejected("decode", "empty frame")
        if self.keyring is None:
            if frame[0] != PLAIN:
                raise FrameRejected("key", "sealed frame but this node has no gossip key")
            body = frame[1:]
        else:
            opened = self.keyring.open(frame)
            if opened is None:
                raise FrameRejected("key", "no key in the keyring opens this frame")
            body = opened
        try:
            msg = cbor2.loads(body, max_depth=MAX_DEPTH)
        except Exception as e:  # cbor2 raises several types on hostile input
            raise FrameRejected("decode", f"not CBOR ({type(e).__name__})") from None
        return check_frame(msg)
