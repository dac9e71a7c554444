"""Gossip's network side in ``hamid front``: :class:`GossipFront`.

It runs the :class:`~hamid.gossip.transport.Transport` (the listener on
``gossipListen``, the outbound links, the keyring that opens every frame),
so every byte a peer or a stranger sends is read and decoded in this
unprivileged process; a frame that fails is dropped and counted here and the
daemon never sees it. It dials the daemon's ``frontDir/gossip.sock``
(:mod:`.relaywire`), learns the node's name and gossip address from the
daemon's ``hello``, hands it each frame that passed and sends the frames the
daemon's membership asks for. While the daemon is away, frames that arrive
are dropped (``relay``) and the socket is dialled again every
:data:`RETRY_S`. Its counters go back to the daemon every
:data:`STATS_INTERVAL_S`, so ``/metrics`` keeps one set of gossip counters.
"""

from __future__ import annotations

import trio

from ..keyring import Keyring
from ..logs import get_logger
from .codec import Codec
from .params import GossipParams
from .relaywire import DROP_REASONS, ENVELOPE_BYTES, HEADER, LINK_ERRORS, STAT_NAMES, Reader, RelayBroken, check_from_daemon, encode
from .stats import Stats
from .transport import Faults, Transport, split_addr

log = get_logger("gossip.front")

RETRY_S = 0.5  # the daemon's socket dialled again this often while it is away (a restart takes seconds)
STATS_INTERVAL_S = 1.0
QUEUE = 1024  # frames for the daemon waiting to be written, before new ones are dropped


class GossipFront:
    name = "gossip"

    def __init__(self, listen: str, daemon_socket: str, keyring: Keyring | None, params: GossipParams,
                 faults: Faults | None = None) -> None:
        self.host, self.port = split_addr(listen)
        self.daemon_socket = daemon_socket
        self.params = params
        self.stats = Stats()
        # the daemon's messages: frames its membership built (answers are split to the frame limit), trusted
        # as the daemon is, bounded all the same
        self.limit = 16 * params.max_frame_bytes + ENVELOPE_BYTES
        self.transport = Transport("", listen, Codec(keyring, params.max_frame_bytes), self.stats,
                                   connect_timeout=params.connect_timeout, on_message=self._on_message,
                                   faults=faults)
        self._up_in, self._up_out = trio.open_memory_channel[bytes](QUEUE)  # encoded for the daemon
        self._ready = False  # a daemon connected and said hello
        self._nursery: trio.Nursery | None = None
        self._leaving = 0  # leave notices being dialled

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            port = await nursery.start(self.transport.serve, self.host, self.port)
            log.info("gossip listening for the daemon", port=port, daemon=self.daemon_socket)
            nursery.start_soon(self._daemon_loop)
            task_status.started(port)

    def _on_message(self, msg: dict) -> None:
        if not self._ready:
            self.stats.dropped["relay"] += 1
            return
        data = encode({"k": "msg", "m": msg})
        # our encoding can be longer than the frame was (cbor2 writes every float in 8 bytes): over the
        # daemon's limit it would end the connection, so it is dropped here as too large
        if len(data) - HEADER.size > self.params.max_frame_bytes + ENVELOPE_BYTES:
            self.stats.dropped["size"] += 1
            return
        try:
            self._up_in.send_nowait(data)
        except trio.WouldBlock:
            self.stats.dropped["queue"] += 1

    async def _daemon_loop(self) -> None:
        said = False
        while True:
            try:
                stream = await trio.open_unix_socket(self.daemon_socket)
            except OSError as e:
                if not said:
                    log.info("gossip waits for the daemon", socket=self.daemon_socket, error=e.strerror)
                    said = True
                await trio.sleep(RETRY_S)
                continue
            said = False
            try:
                await self._serve_daemon(stream)
            except LINK_ERRORS as e:
                log.warning("gossip connection to the daemon closed", reason=str(e) or type(e).__name__)
            finally:
                self._ready = False
                await trio.aclose_forcefully(stream)
                while True:  # frames for a daemon that is gone
                    try:
                        self._up_out.receive_nowait()
                    except trio.WouldBlock:
                        break
            await trio.sleep(RETRY_S)

    async def _serve_daemon(self, stream: trio.SocketStream) -> None:
        reader = Reader(stream, self.limit)
        with trio.fail_after(self.params.connect_timeout * 4):
            hello = check_from_daemon(await reader.next())
        if hello["k"] != "hello":
            raise RelayBroken(f"the daemon's first message is {hello['k']!r}, not hello")
        self.transport.name, self.transport.addr = hello["n"], hello["a"]
        self._ready = True
        log.info("gossip relayed for the daemon", node=hello["n"], addr=hello["a"])
        broken: Exception | None = None
        async with trio.open_nursery() as nursery:  # errors caught in here: a nursery would wrap them in a group
            nursery.start_soon(self._uplink, stream, nursery.cancel_scope)
            try:
                await self._downlink(reader)
            except LINK_ERRORS as e:
                broken = e
                nursery.cancel_scope.cancel()
        if broken is not None:
            raise broken

    async def _downlink(self, reader: Reader) -> None:
        while True:
            m = check_from_daemon(await reader.next())
            k = m["k"]
            if k == "send":
                self.transport.send(m["to"], m["m"])
            elif k == "now":  # the leave notice: the daemon closes the connection right after, the dial goes on
                assert self._nursery is not None
                self._nursery.start_soon(self._send_now, m["to"], m["m"])
            elif k == "forget":
                self.transport.forget(m["to"])
            else:
                raise RelayBroken("a second hello from the daemon")

    async def _send_now(self, addr: str, msg: dict) -> None:
        self._leaving += 1
        try:
            await self.transport.send_now(addr, msg)
        finally:
            self._leaving -= 1

    async def drain(self) -> None:
        """Until the daemon has gone and its leave notices are out: a pod's containers get SIGTERM
        together, and the daemon's last words go out through this process."""
        while self._ready or self._leaving:
            await trio.sleep(0.05)

    def _stats_message(self) -> dict:
        s = self.stats
        return {"k": "stats", "c": {k: getattr(s, k) for k in STAT_NAMES},
                "d": {k: s.dropped[k] for k in DROP_REASONS if s.dropped[k]}}

    async def _uplink(self, stream: trio.SocketStream, scope: trio.CancelScope) -> None:
        """Frames for the daemon as they come, and the counters every STATS_INTERVAL_S whatever the traffic."""
        next_stats = trio.current_time()
        try:
            while True:
                out = None
                with trio.move_on_at(next_stats):
                    out = await self._up_out.receive()
                if out is None:
                    out = encode(self._stats_message())
                    next_stats = trio.current_time() + STATS_INTERVAL_S
                with trio.fail_after(self.params.connect_timeout):  # a daemon that stops reading is let go
                    await stream.send_all(out)
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            log.warning("the daemon is not reading gossip; reconnecting", error=repr(e))
            scope.cancel()
