"""The daemon's end of gossip when ``hamid front`` holds the network: :class:`RelayTransport`.

It keeps :class:`~hamid.gossip.transport.Transport`'s contract for the
membership (``send`` never blocks and may drop, ``forget``, ``send_now``,
``on_message``) but owns no TCP socket: it serves ``frontDir/gossip.sock``
(mode 0660, ``frontGroup``) and the front, which listens on ``gossipListen``,
dials the peers and opens every frame with the keyring as nobody, dials it.
One front connection at a time (a new one, after the front restarted,
replaces the old); what the front relays is checked again here
(:mod:`.relaywire`), and anything else ends the connection. While no front is
connected, frames to send are dropped and counted (``relay``), as a link
that is down drops them. The front's counters arrive on the same stream and
are added to this node's :class:`~hamid.gossip.stats.Stats`.
"""

from __future__ import annotations

import math
import os
import socket
from collections.abc import Callable

import trio

from ..cborcheck import check_cbor2
from ..logs import get_logger
from ..serving import ListenError
from .relaywire import ENVELOPE_BYTES, LINK_ERRORS, STAT_NAMES, FrontStats, Reader, check_from_front, encode
from .stats import Stats

log = get_logger("gossip.relay")

QUEUE = 1024  # messages to the front waiting to be written, before new ones are dropped (a link's queue is 256)


class RelayTransport:
    def __init__(self, name: str, addr: str, path: str, stats: Stats, *, group: int | None, connect_timeout: float,
                 max_frame_bytes: int, on_message: Callable[[dict], None]) -> None:
        check_cbor2()  # the stream is CBOR with a depth limit
        self.name = name
        self.addr = addr
        self.path = path
        self.group = group
        self.stats = stats
        self.connect_timeout = connect_timeout
        self.limit = max_frame_bytes + ENVELOPE_BYTES
        self.on_message = on_message
        self.port: int | None = None
        self._stream: trio.SocketStream | None = None
        self._scope: trio.CancelScope | None = None  # the connection being served
        self._queue_in, self._queue_out = trio.open_memory_channel[bytes](QUEUE)
        self._write_lock = trio.Lock()

    async def serve(self, host: str, port: int, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Serve the front's socket; ``host``/``port`` are the front's (gossipListen), reported as bound."""
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            old = os.umask(0o077)  # nobody but root can connect until the group is set
            try:
                await sock.bind(self.path)
            finally:
                os.umask(old)
            if self.group is not None:
                os.chown(self.path, -1, self.group)
                os.chmod(self.path, 0o660)
            sock.listen(16)
        except OSError as e:
            sock.close()
            raise ListenError(f"cannot serve the front's gossip socket {self.path}: {e.strerror or e}") from None
        self.port = port
        try:
            listener = trio.SocketListener(sock)
            async with trio.open_nursery() as nursery:
                task_status.started(port)
                while True:  # not trio.serve_listeners: it closes a stream when its handler is cancelled
                    try:
                        stream = await listener.accept()
                    except OSError as e:  # out of descriptors: the front dials again
                        log.warning("gossip front socket accept failed", error=e.strerror)
                        await trio.sleep(0.1)
                        continue
                    nursery.start_soon(self._handle, stream)
        finally:
            try:
                os.unlink(self.path)
            except OSError:
                pass

    # --- the membership's side ------------------------------------------------

    def _put(self, msg: dict) -> None:
        if self._stream is None:
            self.stats.dropped["relay"] += 1
            return
        try:
            self._queue_in.send_nowait(encode(msg))
        except trio.WouldBlock:
            self.stats.dropped["queue"] += 1

    def send(self, addr: str, msg: dict) -> None:
        """Queue ``msg`` for ``addr`` through the front; never blocks, may drop."""
        if addr != self.addr:
            self._put({"k": "send", "to": addr, "m": msg})

    def forget(self, addr: str) -> None:
        if self._stream is not None:
            self._put({"k": "forget", "to": addr})

    async def send_now(self, addr: str, msg: dict) -> None:
        """The leave notice at shutdown: written at once (the writer may be cancelled already)."""
        stream = self._stream
        if stream is None:
            return
        with trio.move_on_after(self.connect_timeout):
            try:
                async with self._write_lock:
                    await stream.send_all(encode({"k": "now", "to": addr, "m": msg}))
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
                log.debug("gossip leave notice not relayed", peer=addr, error=repr(e))

    async def aclose(self) -> None:
        """Close the front's connection, kept open through cancellation for the leave notice."""
        stream, self._stream = self._stream, None
        if stream is not None:
            await trio.aclose_forcefully(stream)

    # --- one front connection -------------------------------------------------

    async def _handle(self, stream: trio.SocketStream) -> None:
        if self._scope is not None:  # a restarted front: the old connection is gone or going
            self._scope.cancel()
            log.info("gossip front reconnected; the previous connection is closed")
        else:
            log.info("gossip front connected")
        while True:  # what was queued for the previous connection is stale
            try:
                self._queue_out.receive_nowait()
            except trio.WouldBlock:
                break
        self._stream = stream
        try:
            with trio.CancelScope() as scope:
                self._scope = scope
                async with self._write_lock:
                    await stream.send_all(encode({"k": "hello", "n": self.name, "a": self.addr}))
                broken: Exception | None = None
                async with trio.open_nursery() as nursery:  # errors caught in here: a nursery would group them
                    nursery.start_soon(self._writer, stream, nursery.cancel_scope)
                    try:
                        await self._reader(Reader(stream, self.limit))
                    except LINK_ERRORS as e:
                        broken = e
                        nursery.cancel_scope.cancel()
                if broken is not None:
                    raise broken
        except LINK_ERRORS as e:
            log.warning("gossip front connection closed", reason=str(e) or type(e).__name__)
        finally:
            if self._scope is not None and self._scope is scope:
                self._scope = None
            # cancelled from outside (the daemon stopping): kept open for the leave notice; aclose() ends it
            stopping = trio.current_effective_deadline() == -math.inf and self._stream is stream
            if not stopping:
                if self._stream is stream:
                    self._stream = None
                await trio.aclose_forcefully(stream)

    async def _reader(self, reader: Reader) -> None:
        last = FrontStats({k: 0 for k in STAT_NAMES}, {})  # the front's totals, as of its last report
        while True:
            got = check_from_front(await reader.next())
            if isinstance(got, FrontStats):
                last = self._add_stats(last, got)
                continue
            try:
                self.on_message(got)
            except Exception:  # a bug handling one frame must not take the front's connection down
                log.exception("gossip message handler failed", type=got.get("t"))

    async def _writer(self, stream: trio.SocketStream, scope: trio.CancelScope) -> None:
        try:
            async for data in self._queue_out:
                with trio.fail_after(self.connect_timeout):  # a front that stops reading is not waited for
                    async with self._write_lock:
                        await stream.send_all(data)
        except (trio.TooSlowError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as e:
            log.warning("gossip front not reading; connection closed", error=repr(e))
            scope.cancel()

    def _add_stats(self, last: FrontStats, now: FrontStats) -> FrontStats:
        s = self.stats
        for k in STAT_NAMES:
            setattr(s, k, getattr(s, k) + max(0, now.counters[k] - last.counters[k]))
        for k, v in now.dropped.items():
            s.dropped[k] += max(0, v - last.dropped.get(k, 0))
        return now
