"""The stream between the daemon's gossip and ``hamid front``'s gossip listener (``frontDir/gossip.sock``).

With ``frontDir`` the front runs the gossip transport (listener, outbound
links, the keyring): every byte from the network is read, opened and
decoded there, as nobody. The daemon keeps the membership and talks to the
transport over one unix stream, served by the daemon (mode 0660,
``frontGroup``) and dialled by the front. Each message is a 4-byte
big-endian length and a CBOR map, checked on arrival against the table
below; a message over its direction's limit, not CBOR or not one of these
ends the connection (the two ends are one release, so a bad message is a
bug or a stranger, not a peer to be lenient with).

Front to daemon: ``msg`` (one gossip frame the front opened and checked,
checked again here with :func:`~hamid.gossip.codec.check_frame`) and
``stats`` (the transport's counters, totals since the front started).
Daemon to front: ``hello`` (this node's name and gossip address, first on
every connection), ``send``, ``now`` (dial afresh: the leave notice) and
``forget`` (close the link to a dead member's address). This module does
no I/O beyond reading and writing one stream.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import cbor2
import trio

from .codec import MAX_DEPTH, U63, FrameRejected, check_frame

SOCKET = "gossip.sock"
HEADER = struct.Struct(">I")
# what the daemon reads: one frame the front decoded (at most gossipMaxFrameBytes of CBOR, re-encoded no longer
# than it came: cbor2 writes the shortest forms) and its envelope
ENVELOPE_BYTES = 1024
STAT_NAMES = ("bytes_sent", "bytes_received", "frames_sent", "frames_received")
DROP_REASONS = ("size", "key", "decode", "version", "schema", "queue", "fault", "idle", "relay")


class RelayBroken(Exception):
    """The other end sent something this end does not take, or went away."""


# what ends one connection between the daemon and the front (then the front dials again)
LINK_ERRORS = (RelayBroken, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, OSError)


@dataclass(frozen=True)
class FrontStats:
    """The front transport's counters (totals since it started)."""
    counters: dict[str, int]
    dropped: dict[str, int]


def _uint(x: Any) -> bool:
    return type(x) is int and 0 <= x < U63


def _addr(x: Any) -> bool:
    return type(x) is str and 0 < len(x) <= 256


def check_from_front(msg: Any) -> dict | FrontStats:
    """A message the front sent: a gossip frame (checked as the codec checks one) or its counters."""
    if type(msg) is not dict:
        raise RelayBroken(f"message is a {type(msg).__name__}, not a map")
    k = msg.get("k")
    if k == "msg":
        try:
            return check_frame(msg.get("m"))
        except FrameRejected as e:
            raise RelayBroken(f"frame the front relayed fails its check: {e}") from None
    if k == "stats":
        c, d = msg.get("c"), msg.get("d")
        if (type(c) is dict and set(c) == set(STAT_NAMES) and all(_uint(v) for v in c.values())
                and type(d) is dict and set(d) <= set(DROP_REASONS) and all(_uint(v) for v in d.values())):
            return FrontStats(dict(c), dict(d))
        raise RelayBroken("stats message malformed")
    raise RelayBroken(f"unknown message kind {k!r} from the front; accepted: msg, stats")


def check_from_daemon(msg: Any) -> dict:
    """A message the daemon sent: ``hello``, ``send``, ``now`` or ``forget``."""
    if type(msg) is not dict:
        raise RelayBroken(f"message is a {type(msg).__name__}, not a map")
    k = msg.get("k")
    if k == "hello" and _addr(msg.get("n")) and _addr(msg.get("a")):
        return msg
    if k in ("send", "now") and _addr(msg.get("to")) and type(msg.get("m")) is dict:
        return msg
    if k == "forget" and _addr(msg.get("to")):
        return msg
    raise RelayBroken(f"message {k!r} from the daemon malformed or unknown; accepted: hello, send, now, forget")


def encode(msg: dict) -> bytes:
    body = cbor2.dumps(msg)
    return HEADER.pack(len(body)) + body


class Reader:
    """Length-prefixed CBOR maps from one stream, each at most ``limit`` bytes."""

    def __init__(self, stream: trio.abc.ReceiveStream, limit: int) -> None:
        self.stream = stream
        self.limit = limit
        self.buf = bytearray()

    async def _fill(self, n: int) -> None:
        while len(self.buf) < n:
            chunk = await self.stream.receive_some(65536)
            if not chunk:
                raise RelayBroken("connection closed")
            self.buf += chunk

    async def next(self) -> Any:
        await self._fill(HEADER.size)
        (size,) = HEADER.unpack_from(self.buf)
        if size > self.limit:
            raise RelayBroken(f"message of {size} bytes over the limit of {self.limit}")
        await self._fill(HEADER.size + size)
        body = bytes(self.buf[HEADER.size:HEADER.size + size])
        del self.buf[:HEADER.size + size]
        try:
            return cbor2.loads(body, max_depth=MAX_DEPTH + 2)
        except Exception as e:  # cbor2 raises several types on bad input
            raise RelayBroken(f"message is not CBOR ({type(e).__name__})") from None
