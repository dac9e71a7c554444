"""Frames between daemons over trio-websocket links.

The protocol above sees a datagram service: ``send(addr, msg)`` never blocks
and may lose a frame (a full queue, a dead peer), exactly what SWIM expects of
UDP. Underneath, one websocket per peer address carries frames both ways: an
outbound link is dialled on first use; an inbound connection becomes the link
for its sender's advertised address once one authenticated frame arrived on
it, so a pair of daemons usually shares one TCP connection. Each link has a
bounded queue and one writer task; a send that stalls longer than the connect
timeout closes the link.

Every received frame goes through :class:`~hamid.gossip.codec.Codec`; a frame
that fails is dropped and counted by reason, and the connection stays up
(trio-websocket itself closes a connection that sends a message over the size
limit, code 1009, counted as ``size``). Nothing a peer sends can raise out of
the reader.

Test hook: :class:`Faults` (loss probability and delay, applied to each
outgoing frame); the service reads it from ``HAMID_GOSSIP_FAULTS``
(``loss=0.1,delay=0.05``) so tests can inject them into real daemons.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import trio
from trio_websocket import (ConnectionClosed, WebSocketConnection, WebSocketRequest, WebSocketServer,
                            connect_websocket)

from ..logs import get_logger
from ..serving import CappedListener, ConnectionCount, CountedStream, ListenError, connection_cap
from .codec import VERSION, Codec, FrameRejected
from ..keyring import OVERHEAD
from .stats import Stats

log = get_logger("gossip.transport")

RESOURCE = "/gossip/1"
LINK_QUEUE = 256  # frames waiting per peer before new ones are dropped
CLOSE_WAIT = 1.0
# An inbound connection must present one frame that opens with the keyring within this many
# connect timeouts, or it is closed: a peer sends its first frame at once, a stranger holds a
# file descriptor for at most this long.
FIRST_FRAME_TIMEOUTS = 2
# A link on which nothing arrived for this long is closed (a live peer probes or gossips several
# times a second; a closed link is dialled again on the next send).
LINK_IDLE_S = 120.0
# Inbound connections at once; more are closed as they are accepted. Links are per peer and idle ones
# close, so even a 15,000-node cluster keeps far fewer; the cap bounds what a flood can hold
# (about 16 KB of memory and one descriptor each).
MAX_INBOUND = 4096
# Inbound connections one source (address, IPv6 /64) may hold before their first frame opens with the
# keyring (then they no longer count against it): a peer sends that frame at once, so even a host running
# many daemons (a test cluster on one machine, several nodes behind one NAT) rarely has more than a few
# pending; a stranger from one address holds at most this many for FIRST_FRAME_TIMEOUTS each.
PER_SOURCE = 64


@dataclass(frozen=True)
class Faults:
    loss: float = 0.0
    delay: float = 0.0
    jitter: float = 0.0

    @classmethod
    def parse(cls, text: str | None) -> "Faults | None":
        if not text:
            return None
        kw = {}
        for item in text.split(","):
            k, _, v = item.partition("=")
            if k.strip() not in ("loss", "delay", "jitter"):
                raise ValueError(f"HAMID_GOSSIP_FAULTS: unknown item {item!r}; accepted: loss=P,delay=S,jitter=S")
            kw[k.strip()] = float(v)
        return cls(**kw)


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"bad address {addr!r}; expected HOST:PORT")
    return host.strip("[]"), int(port)


class _Link:
    __slots__ = ("addr", "ws", "send", "recv", "scope", "inbound")

    def __init__(self, addr: str, ws: WebSocketConnection | None) -> None:
        self.addr = addr
        self.ws = ws
        self.inbound = ws is not None
        self.send, self.recv = trio.open_memory_channel(LINK_QUEUE)
        self.scope = trio.CancelScope()


class Transport:
    def __init__(self, name: str, addr: str, codec: Codec, stats: Stats, *, connect_timeout: float,
                 on_message: Callable[[dict], None], faults: Faults | None = None) -> None:
        self.name = name
        self.addr = addr
        self.codec = codec
        self.stats = stats
        self.connect_timeout = connect_timeout
        self.on_message = on_message
        self.faults = faults
        self.links: dict[str, _Link] = {}
        self._nursery: trio.Nursery | None = None
        self._ws_limit = codec.max_frame_bytes + OVERHEAD + 16
        self.port: int | None = None
        self.connections = ConnectionCount()  # inbound connections open now, and refused at the cap

    async def serve(self, host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:  # bound before the nursery opens: a port in use is one line naming the fix, not a group
            bound = await trio.open_tcp_listeners(port, host=host)
        except OSError as e:
            raise ListenError(f"cannot listen on gossipListen {host}:{port}: {e.strerror or e}; pick another "
                              "address with --gossip-listen HOST:PORT (gossipListen in the config file)") from None
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            # every connection counted from its TCP accept (a stranger that never completes the
            # websocket handshake holds a descriptor too), at most MAX_INBOUND (less where the
            # process's descriptor limit is lower)
            cap = connection_cap(MAX_INBOUND, share=4)
            listeners = [CappedListener(lst, cap, self.connections, per_source=PER_SOURCE) for lst in bound]
            server = WebSocketServer(self._accept, listeners, handler_nursery=nursery,
                                     max_message_size=self._ws_limit, connect_timeout=self.connect_timeout,
                                     disconnect_timeout=CLOSE_WAIT)
            await nursery.start(server.run)
            self.port = listeners[0].socket.getsockname()[1]
            task_status.started(self.port)

    # --- sending -----------------------------------------------------------

    def send(self, addr: str, msg: dict) -> None:
        """Queue ``msg`` for ``addr``; never blocks, may drop."""
        if self._nursery is None or addr == self.addr:
            return
        msg["v"], msg["f"], msg["a"] = VERSION, self.name, self.addr
        frame = self.codec.encode(msg)
        f = self.faults
        if f is not None:
            if f.loss and random.random() < f.loss:
                self.stats.dropped["fault"] += 1
                return
            if f.delay or f.jitter:
                self._nursery.start_soon(self._send_later, addr, frame, f.delay + random.random() * f.jitter)
                return
        self._enqueue(addr, frame)

    async def send_now(self, addr: str, msg: dict) -> None:
        """Dial ``addr`` on a fresh connection and send one frame (the leave
        notice at shutdown, when the link writers are already cancelled)."""
        msg["v"], msg["f"], msg["a"] = VERSION, self.name, self.addr
        frame = self.codec.encode(msg)
        try:
            host, port = split_addr(addr)
            with trio.move_on_after(self.connect_timeout):
                async with trio.open_nursery() as n:
                    ws = await connect_websocket(n, host, port, RESOURCE, use_ssl=False,
                                                 max_message_size=self._ws_limit)
                    await ws.send_message(frame)
                    self.stats.bytes_sent += len(frame)
                    await self._close(ws)
        except Exception as e:
            log.debug("gossip leave notice not sent", peer=addr, error=repr(e))

    async def _send_later(self, addr: str, frame: bytes, delay: float) -> None:
        await trio.sleep(delay)
        self._enqueue(addr, frame)

    def _enqueue(self, addr: str, frame: bytes) -> None:
        link = self.links.get(addr)
        if link is None:
            link = self.links[addr] = _Link(addr, None)
            self._nursery.start_soon(self._writer, link)
        try:
            link.send.send_nowait(frame)
        except trio.WouldBlock:
            self.stats.dropped["queue"] += 1

    def forget(self, addr: str) -> None:
        """Close the link to ``addr`` (a member declared dead)."""
        link = self.links.pop(addr, None)
        if link is not None:
            link.scope.cancel()
            if link.ws is not None and self._nursery is not None:
                self._nursery.start_soon(self._close, link.ws)

    async def _close(self, ws: WebSocketConnection) -> None:
        with trio.move_on_after(CLOSE_WAIT):
            try:
                await ws.aclose()
            except Exception:
                pass

    async def _writer(self, link: _Link) -> None:
        with link.scope:
            try:
                if link.ws is None:
                    host, port = split_addr(link.addr)
                    with trio.fail_after(self.connect_timeout):
                        link.ws = await connect_websocket(self._nursery, host, port, RESOURCE, use_ssl=False,
                                                          max_message_size=self._ws_limit)
                    self._nursery.start_soon(self._reader, link.ws, link)
                ws = link.ws
                async for frame in link.recv:
                    with trio.fail_after(self.connect_timeout):
                        await ws.send_message(frame)
                    self.stats.bytes_sent += len(frame)
                    self.stats.frames_sent += 1
            except (trio.TooSlowError, ConnectionClosed, OSError, ValueError) as e:
                log.debug("gossip link down", peer=link.addr, error=repr(e))
            except Exception as e:  # a handshake rejected, a protocol error: the link is gone either way
                log.debug("gossip link failed", peer=link.addr, error=repr(e))
        if self.links.get(link.addr) is link:
            del self.links[link.addr]
        if link.ws is not None:
            await self._close(link.ws)

    # --- receiving ---------------------------------------------------------

    async def _accept(self, request: WebSocketRequest) -> None:
        try:
            ws = await request.accept()
        except Exception:
            return
        await self._reader(ws, None)

    async def _reader(self, ws: WebSocketConnection, link: _Link | None) -> None:
        trusted = link is not None  # an inbound connection is trusted once one frame opened with the keyring
        try:
            while True:
                with trio.move_on_after(LINK_IDLE_S if trusted else FIRST_FRAME_TIMEOUTS * self.connect_timeout) as idle:
                    frame = await ws.get_message()
                if idle.cancelled_caught:
                    self.stats.dropped["idle"] += 1
                    log.debug("gossip connection idle; closed", trusted=trusted)
                    await self._close(ws)
                    return
                self.stats.bytes_received += len(frame)
                self.stats.frames_received += 1
                try:
                    msg = self.codec.decode(frame)
                except FrameRejected as e:
                    self.stats.dropped[e.reason] += 1
                    log.debug("gossip frame dropped", reason=str(e))
                    continue
                if not trusted and link is None:  # an inbound stranger proved it holds the key
                    # trio-websocket names no public handle on the stream under it (ours, counted)
                    stream = getattr(ws, "_stream", None)
                    if isinstance(stream, CountedStream):
                        stream.uncount_source()
                trusted = True
                if link is None and msg["f"] != self.name:
                    have = self.links.get(msg["a"])
                    if have is None:
                        link = self.links[msg["a"]] = _Link(msg["a"], ws)
                        self._nursery.start_soon(self._writer, link)
                try:
                    self.on_message(msg)
                except Exception:  # a bug handling one frame must not take the link down
                    log.exception("gossip message handler failed", type=msg.get("t"))
        except ConnectionClosed as e:
            if e.reason is not None and e.reason.code == 1009:
                self.stats.dropped["size"] += 1
        except Exception as e:
            log.debug("gossip reader stopped", error=repr(e))
        finally:
            if link is not None and link.ws is ws:
                link.scope.cancel()
                if self.links.get(link.addr) is link:
                    del self.links[link.addr]
