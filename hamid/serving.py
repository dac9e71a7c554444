"""Serving an ASGI app with hypercorn on trio: the one helper every face uses.

``serve_asgi(app, bind)`` binds (``HOST:PORT`` or ``unix:PATH``), calls
``task_status.started(bound addresses)`` once listening and serves until
cancelled. An address that cannot be bound is a :class:`HamidError` naming
it, not a traceback. With ``certfile`` and ``keyfile`` (PEM files) it serves
HTTPS only (TLS 1.2 or later); with ``client_ca`` too, only clients that
present a certificate signed by that CA complete the handshake. A pair that
cannot be loaded is a :class:`HamidError` naming the files.

No caller can hold a listener: headers must be complete within
:data:`HEADER_DEADLINE_S` of the connection (or of the last answer), no read
may stall past :data:`READ_TIMEOUT_S`, a whole request must be answered
within its deadline (:data:`REQUEST_DEADLINE_S`; 408 otherwise), and a
listener holds at most :data:`MAX_CONNECTIONS` connections (the rest are
closed as they are accepted). hypercorn's own serve loop is replaced by one
that counts connections; its per-connection server is used as it is.
"""

from __future__ import annotations

import ssl

import trio
from hypercorn.config import Config as HyperConfig

from .errors import HamidError


class BodyTooLarge(HamidError):
    """A request body over its listener's limit (answer 413)."""

    http_status = 413


async def read_body(req, limit: int) -> bytes:
    """A starlette request's body, refused (:class:`BodyTooLarge`) when it passes
    ``limit`` bytes; an oversized body is never held: over
    :data:`DRAIN_MAX_BYTES` (by its Content-Length, or while streaming) it is
    cut at once, below that it is read and dropped so the answer arrives."""
    length = req.headers.get("content-length")
    if length is not None and (not length.isascii() or not length.isdigit()):
        raise BodyTooLarge(f"request body over {limit} bytes (Content-Length {length[:20]!r})")
    too_large = length is not None and int(length) > limit
    if too_large and int(length) > DRAIN_MAX_BYTES:
        raise BodyTooLarge(f"request body over {limit} bytes")
    buf = bytearray()
    seen = 0
    async for chunk in req.stream():
        seen += len(chunk)
        if too_large or seen > limit:  # read on and drop it (up to DRAIN_MAX_BYTES): nothing is kept
            too_large = True
            if seen > DRAIN_MAX_BYTES:
                break
            continue
        buf += chunk
    if too_large:
        raise BodyTooLarge(f"request body over {limit} bytes")
    return bytes(buf)


class ListenError(HamidError):
    """An address could not be bound (in use, not ours, malformed)."""


class TLSError(HamidError):
    """A certificate or key file could not be loaded."""


# Defaults every listener gets (each justified; a face may pass its own):
REQUEST_DEADLINE_S = 30.0  # a whole request from its headers' end to the answer: every verb answers in
                           # well under a second; the slowest (an extender bind, a Docker create waiting
                           # on the ledger) are bounded by their own 10-25 s deadlines
HEADER_DEADLINE_S = 5  # hypercorn's keep-alive timer runs from the connection's start (or the last
                       # answer) until a request's headers are complete: bounds idle and slow headers
DRAIN_MAX_BYTES = 4 << 20  # a body over its limit but under this is read and dropped before the 413, so the
                           # client reads the answer instead of a connection reset; larger ones are cut at once
READ_TIMEOUT_S = 10  # no byte for this long while a request is read: the connection is closed
MAX_CONNECTIONS = 256  # per listener; more are accepted and closed at once. The callers of each
                       # listener hold a few each (kubelet, dockerd, the API server, the leader); 256
                       # x ~16 KB stays small, and 256 per listener x 8 listeners stays under the file
                       # descriptor limit the daemon raises itself to (raise_fd_limit)


def _with_deadline(app, seconds: float):
    """The ASGI app, cancelled ``seconds`` after a request's headers arrived;
    a request cut off before its answer started gets 408 and the connection closes."""

    async def wrapped(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        started = False

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        with trio.move_on_after(seconds) as deadline:
            await app(scope, receive, tracking_send)
        if deadline.cancelled_caught and not started:
            await send({"type": "http.response.start", "status": 408,
                        "headers": [(b"content-type", b"text/plain"), (b"connection", b"close")]})
            await send({"type": "http.response.body",
                        "body": f"request not completed within {seconds:g} s\n".encode()})
    return wrapped


class ConnectionCount:
    """Connections open on one listener, and those refused at the cap (for /metrics)."""

    def __init__(self) -> None:
        self.open = 0
        self.refused = 0


def connection_cap(default: int, share: int = 8, reserve: int = 256) -> int:
    """``default``, or less where the process's file-descriptor limit could
    not hold it: each of ``share`` listeners gets an equal part of the limit
    less ``reserve`` descriptors for files, the ledger and the driver."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return default
    return max(8, min(default, (soft - reserve) // share))


class _CountedStream(trio.abc.HalfCloseableStream):
    """A connection counted open until it is closed (for :class:`CappedListener`)."""

    def __init__(self, inner, counts: ConnectionCount) -> None:
        self._inner = inner
        self._counts = counts
        self._open = True
        self.socket = inner.socket  # what hypercorn and trio-websocket read addresses from

    async def send_all(self, data) -> None:
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes=None) -> bytes:
        return await self._inner.receive_some(max_bytes)

    async def send_eof(self) -> None:
        await self._inner.send_eof()

    def setsockopt(self, *args) -> None:
        self._inner.setsockopt(*args)

    def getsockopt(self, *args):
        return self._inner.getsockopt(*args)

    async def aclose(self) -> None:
        if self._open:
            self._open = False
            self._counts.open -= 1
        await self._inner.aclose()


class CappedListener(trio.abc.Listener):
    """A listener that holds at most ``cap`` connections: one accepted past
    it is closed at once (counted in ``counts.refused``), so a flood costs a
    descriptor for an instant, never the process's last one."""

    def __init__(self, inner, cap: int, counts: ConnectionCount) -> None:
        self.inner = inner
        self.cap = cap
        self.counts = counts
        self.socket = inner.socket

    async def accept(self):
        while True:
            stream = await self.inner.accept()
            if self.counts.open >= self.cap:
                self.counts.refused += 1
                await trio.aclose_forcefully(stream)
                continue
            self.counts.open += 1
            return _CountedStream(stream, self.counts)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def serve_asgi(app, bind: str, *, what: str = "", certfile: str | None = None, keyfile: str | None = None,
                     client_ca: str | None = None, deadline_s: float = REQUEST_DEADLINE_S,
                     max_connections: int | None = None, counts: ConnectionCount | None = None,
                     unix_group: int | None = None, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """``unix_group``: for a ``unix:PATH`` bind, the group given read and write on
    the socket (mode 0660; without it the process umask decides), the one way a
    process of another user (``hamid front``) is let in."""
    from hypercorn.trio.tcp_server import TCPServer
    from hypercorn.trio.worker_context import WorkerContext
    from hypercorn.utils import repr_socket_addr, wrap_app

    cfg = HyperConfig()
    cfg.bind = [bind]
    if (certfile is None) != (keyfile is None):
        raise TLSError(f"TLS needs both a certificate and a key file, got certfile={certfile!r} keyfile={keyfile!r}")
    if client_ca is not None and certfile is None:
        raise TLSError(f"client certificates ({client_ca}) need TLS: a certificate and key to serve")
    label = f"{what}: " if what else ""
    if certfile is not None:
        cfg.certfile, cfg.keyfile = certfile, keyfile
        if client_ca is not None:  # no handshake completes without a certificate this CA signed
            cfg.ca_certs, cfg.verify_mode = client_ca, ssl.CERT_REQUIRED
    cfg.accesslog = None
    cfg.errorlog = None
    cfg.graceful_timeout = 1.0
    cfg.keep_alive_timeout = HEADER_DEADLINE_S
    cfg.read_timeout = READ_TIMEOUT_S
    cfg.ssl_handshake_timeout = HEADER_DEADLINE_S
    try:
        ssl_context = cfg.create_ssl_context()  # loads the files now: fail here, naming them
    except (OSError, ssl.SSLError) as e:
        raise TLSError(f"{label}cannot load the TLS certificate {certfile} with key {keyfile}"
                       f"{' and client CA ' + client_ca if client_ca else ''}: "
                       f"{getattr(e, 'strerror', None) or e}") from None
    try:
        sockets = cfg.create_sockets()
    except OSError as e:
        raise ListenError(f"cannot listen on {what + ' ' if what else ''}{bind}: {e.strerror or e}") from None
    if unix_group is not None and bind.startswith("unix:"):
        import os

        os.chown(bind[5:], -1, unix_group)  # nobody but root could connect before this (umask 077)
        os.chmod(bind[5:], 0o660)
    listeners: list = []
    binds: list[str] = []
    counts = counts if counts is not None else ConnectionCount()
    cap = max_connections if max_connections is not None else connection_cap(MAX_CONNECTIONS)
    for sock in [*sockets.secure_sockets, *sockets.insecure_sockets]:
        sock.listen(cfg.backlog)
        inner = CappedListener(trio.SocketListener(trio.socket.from_stdlib_socket(sock)), cap, counts)
        secure = ssl_context is not None
        listeners.append(trio.SSLListener(inner, ssl_context, https_compatible=True) if secure else inner)
        binds.append(f"{'https' if secure else 'http'}://{repr_socket_addr(sock.family, sock.getsockname())}")
    served = wrap_app(_with_deadline(app, deadline_s), cfg.wsgi_max_body_size, "asgi")
    context = WorkerContext(None)

    async def handle(stream) -> None:
        try:
            await TCPServer(served, cfg, context, {}, stream)
        finally:
            await trio.aclose_forcefully(stream)  # counted closed even where TLS failed before hypercorn saw it

    async with trio.open_nursery() as nursery:
        task_status.started(binds)
        try:
            await trio.serve_listeners(handle, listeners, handler_nursery=nursery)
        finally:
            for lst in listeners:
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(lst)
