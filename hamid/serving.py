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
closed as they are accepted), of which one source holds at most
:data:`PER_SOURCE` until they are authenticated and the last :data:`RESERVE`
go only to sources that hold none (so one caller flooding cannot lock the
others out). A TLS handshake must complete within :data:`HEADER_DEADLINE_S`
too. hypercorn's own serve loop is replaced by one that counts connections;
its per-connection server is used as it is. A face whose callers prove who
they are in a request (the peer API's signatures) calls
:meth:`ConnectionCount.authenticated` with the request's client address; a
listener that requires a client certificate does it for every request.
"""

from __future__ import annotations

import ssl

import trio
from hypercorn.config import Config as HyperConfig
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from .errors import HamidError


class BodyTooLarge(HamidError):
    """A request body over its listener's limit (answer 413)."""

    http_status = 413


class BodyIncomplete(HTTPException):
    """The client stopped sending before its body's end (its framing promised more: a
    Content-Length, a chunk size) and the read deadline passed, or it hung up. A starlette
    HTTP exception, so every app answers it 400 without a handler of its own (starlette
    would answer its ``ClientDisconnect`` 500, as if the server had failed)."""

    def __init__(self, got: int) -> None:
        super().__init__(400, f"request body incomplete: {got} bytes arrived, then nothing more within "
                              f"{READ_TIMEOUT_S} s (its Content-Length or chunk sizes promised more)\n")


async def read_body(req, limit: int) -> bytes:
    """A starlette request's body, refused (:class:`BodyTooLarge`) when it passes
    ``limit`` bytes; an oversized body is never held: over
    :data:`DRAIN_MAX_BYTES` (by its Content-Length, or while streaming) it is
    cut at once, below that it is read and dropped so the answer arrives. A body cut
    short is :class:`BodyIncomplete` (400)."""
    length = req.headers.get("content-length")
    if length is not None and (not length.isascii() or not length.isdigit()):
        raise BodyTooLarge(f"request body over {limit} bytes (Content-Length {length[:20]!r})")
    too_large = length is not None and int(length) > limit
    if too_large and int(length) > DRAIN_MAX_BYTES:
        raise BodyTooLarge(f"request body over {limit} bytes")
    buf = bytearray()
    seen = 0
    try:
        async for chunk in req.stream():
            seen += len(chunk)
            if too_large or seen > limit:  # read on and drop it (up to DRAIN_MAX_BYTES): nothing is kept
                too_large = True
                if seen > DRAIN_MAX_BYTES:
                    break
                continue
            buf += chunk
    except ClientDisconnect:
        raise BodyIncomplete(seen) from None
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
LISTEN_BACKLOG = 4096  # the kernel's queue of connections not yet accepted (hypercorn's default is 100). A
                      # flood's handshakes fill a short queue faster than the accept loop closes them, and a
                      # caller's connection that finds it full waits out a SYN retransmit (1 s, then 3 s...);
                      # 4,096 is Linux's default cap (net.core.somaxconn) and costs nothing until used
PER_SOURCE = 32  # connections one source (an IPv4 address, an IPv6 /64) may hold on one listener until
                 # they are authenticated. The callers that matter hold one to a few each: the API server
                 # sends admission reviews over HTTP/2 (one connection, a few while it rotates them),
                 # kube-scheduler and the leader keep a small pool, Prometheus one per scrape, a browser
                 # six. 32 leaves them room while one source holding thousands keeps at most 32: with the
                 # reserve below, 256 - 32 = 224 slots need 7 sources to fill, the reserve 32 more
RESERVE = 32  # the last slots of a listener go only to a source that holds none there now: a caller
              # that matters (the API server on the webhook, kube-scheduler on the extender, the leader
              # on the peer port, Prometheus on metrics) still gets its first connection while others
              # fill the rest. 32 distinct sources must flood at once to take it from them


def source_of(sockaddr) -> str | None:
    """The source a connection is counted against: its IPv4 address, or its IPv6 /64 (one host
    holds a whole /64, so counting single IPv6 addresses would give it 2^64 shares); None for a
    unix socket (its callers are named by the socket's owner and mode, not counted here)."""
    import ipaddress

    if not isinstance(sockaddr, tuple) or not sockaddr:
        return None
    try:
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
    except ValueError:
        return None
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


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


def _authenticated_by_certificate(app, counts: "ConnectionCount"):
    """The ASGI app, each connection no longer counted against its source once a request
    arrives on it (a listener that requires a client certificate: the handshake proved it)."""

    async def wrapped(scope, receive, send):
        counts.authenticated(scope.get("client"))
        return await app(scope, receive, send)
    return wrapped


class ConnectionCount:
    """Connections open on one listener, by source until authenticated, and those refused (for /metrics).

    ``refused`` counts every connection closed at accept; ``refused_source`` those of them refused
    because their source held its share (:data:`PER_SOURCE`) or the reserve (:data:`RESERVE`) was
    kept for other sources."""

    def __init__(self) -> None:
        self.open = 0
        self.refused = 0
        self.refused_source = 0
        self._by_source: dict[str, int] = {}  # unauthenticated connections held, by source
        self._by_peer: dict[tuple, "CountedStream"] = {}  # (address, port) -> its connection

    def held(self, source: str) -> int:
        """Unauthenticated connections ``source`` holds now."""
        return self._by_source.get(source, 0)

    def admits(self, source: str | None, cap: int, per_source: int, reserve: int) -> bool:
        """Whether a connection from ``source`` may be held now (counted as refused when not)."""
        if self.open >= cap:
            self.refused += 1
            return False
        if source is not None:
            held = self.held(source)
            if held >= per_source or (held > 0 and self.open >= cap - reserve):
                self.refused += 1
                self.refused_source += 1
                return False
        return True

    def authenticated(self, peer) -> None:
        """The connection from ``peer`` (``(address, port)`` as the server sees it) proved who
        it is (a client certificate, a signed request, a frame opened with the keyring): it is
        no longer counted against its source, only against the listener's cap."""
        if peer is None:
            return
        conn = self._by_peer.get((str(peer[0]), int(peer[1])))
        if conn is not None:
            conn.uncount_source()

    def _opened(self, conn: "CountedStream") -> None:
        self.open += 1
        if conn.source is not None:
            self._by_source[conn.source] = self.held(conn.source) + 1
        if conn.peer is not None:
            self._by_peer[conn.peer] = conn

    def _uncount_source(self, source: str) -> None:
        left = self.held(source) - 1
        if left > 0:
            self._by_source[source] = left
        else:
            self._by_source.pop(source, None)

    def _closed(self, conn: "CountedStream") -> None:
        self.open -= 1
        if conn.peer is not None and self._by_peer.get(conn.peer) is conn:
            del self._by_peer[conn.peer]


def connection_cap(default: int, share: int = 8, reserve: int = 256) -> int:
    """``default``, or less where the process's file-descriptor limit could
    not hold it: each of ``share`` listeners gets an equal part of the limit
    less ``reserve`` descriptors for files, the ledger and the driver."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return default
    return max(8, min(default, (soft - reserve) // share))


class CountedStream(trio.abc.HalfCloseableStream):
    """A connection counted open until it is closed, and against its source until it is
    authenticated or closed (for :class:`CappedListener`)."""

    def __init__(self, inner, counts: ConnectionCount, source: str | None, peer: tuple | None) -> None:
        self._inner = inner
        self._counts = counts
        self._open = True
        self.source = source  # None once no longer counted against it
        self.peer = peer
        self._unanswered = False  # bytes received since the last sent: a request may be waiting for its answer
        self.socket = inner.socket  # what hypercorn and trio-websocket read addresses from
        counts._opened(self)

    def uncount_source(self) -> None:
        if self.source is not None:
            self._counts._uncount_source(self.source)
            self.source = None

    async def send_all(self, data) -> None:
        self._unanswered = False
        await self._inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes=None) -> bytes:
        data = await self._inner.receive_some(max_bytes)
        if data:
            self._unanswered = True
        elif not self._unanswered and self._open:
            # the caller closed its side with nothing left to answer (a scraper after its answer, or a flood):
            # hypercorn would keep the socket until its keep-alive timer ends (5 s), holding a slot no source's
            # share counts, so it is closed now. A caller that closed its side after asking keeps its
            # connection, counted against its source, until hypercorn has answered and closed it.
            self._open = False
            self.uncount_source()
            self._counts._closed(self)
            await trio.aclose_forcefully(self._inner)
        return data

    async def send_eof(self) -> None:
        await self._inner.send_eof()

    def setsockopt(self, *args) -> None:
        self._inner.setsockopt(*args)

    def getsockopt(self, *args):
        return self._inner.getsockopt(*args)

    async def aclose(self) -> None:
        if self._open:
            self._open = False
            self.uncount_source()
            self._counts._closed(self)
        await self._inner.aclose()


class CappedListener(trio.abc.Listener):
    """A listener that holds at most ``cap`` connections, at most ``per_source``
    of them unauthenticated from one source, and the last ``reserve`` only for
    sources holding none: one accepted past these is closed at once (counted in
    ``counts.refused``), so a flood costs a descriptor for an instant, never the
    process's last one, and one flooding source never locks the others out."""

    def __init__(self, inner, cap: int, counts: ConnectionCount, *, per_source: int = PER_SOURCE,
                 reserve: int = RESERVE) -> None:
        self.inner = inner
        self.cap = cap
        self.counts = counts
        self.per_source = per_source
        self.reserve = min(reserve, cap // 4)  # a small cap (a low descriptor limit) keeps most of its slots shared
        self.socket = inner.socket

    async def accept(self):
        while True:
            stream = await self.inner.accept()
            try:
                peer = stream.socket.getpeername()
            except OSError:  # gone before we looked
                await trio.aclose_forcefully(stream)
                continue
            source = source_of(peer)
            if not self.counts.admits(source, self.cap, self.per_source, self.reserve):
                await trio.aclose_forcefully(stream)
                continue
            return CountedStream(stream, self.counts, source,
                                  (str(peer[0]), int(peer[1])) if source is not None else None)

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
    cfg.backlog = LISTEN_BACKLOG
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
        listeners.append(trio.SSLListener(inner, ssl_context, https_compatible=True) if ssl_context is not None
                         else inner)
        binds.append(f"{'https' if ssl_context is not None else 'http'}://"
                     f"{repr_socket_addr(sock.family, sock.getsockname())}")
    timed = _with_deadline(app, deadline_s)
    if client_ca is not None:  # a request reaching the app came over a handshake with a certificate the CA signed
        timed = _authenticated_by_certificate(timed, counts)
    served = wrap_app(timed, cfg.wsgi_max_body_size, "asgi")
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
