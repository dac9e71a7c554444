"""Serving an ASGI app with hypercorn on trio: the one helper every face uses.

``serve_asgi(app, bind)`` binds (``HOST:PORT`` or ``unix:PATH``), calls
``task_status.started(bound addresses)`` once listening and serves until
cancelled. An address that cannot be bound is a :class:`HamidError` naming
it, not a traceback. With ``certfile`` and ``keyfile`` (PEM files) it serves
HTTPS only (TLS 1.2 or later); with ``client_ca`` too, only clients that
present a certificate signed by that CA complete the handshake. A pair that
cannot be loaded is a :class:`HamidError` naming the files.
"""

from __future__ import annotations

import ssl

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve

from .errors import HamidError


class BodyTooLarge(HamidError):
    """A request body over its listener's limit (answer 413)."""


async def read_body(req, limit: int) -> bytes:
    """A starlette request's body, refused (:class:`BodyTooLarge`) as soon as it
    is known to pass ``limit`` bytes: by its Content-Length before anything is
    read, else while streaming, so an oversized body is never held."""
    length = req.headers.get("content-length")
    if length is not None and (not length.isascii() or not length.isdigit() or int(length) > limit):
        raise BodyTooLarge(f"request body over {limit} bytes")
    buf = bytearray()
    async for chunk in req.stream():
        buf += chunk
        if len(buf) > limit:
            raise BodyTooLarge(f"request body over {limit} bytes")
    return bytes(buf)


class ListenError(HamidError):
    """An address could not be bound (in use, not ours, malformed)."""


class TLSError(HamidError):
    """A certificate or key file could not be loaded."""


async def serve_asgi(app, bind: str, *, what: str = "", certfile: str | None = None, keyfile: str | None = None,
                     client_ca: str | None = None, task_status=trio.TASK_STATUS_IGNORED) -> None:
    cfg = HyperConfig()
    cfg.bind = [bind]
    if (certfile is None) != (keyfile is None):
        raise TLSError(f"TLS needs both a certificate and a key file, got certfile={certfile!r} keyfile={keyfile!r}")
    if client_ca is not None and certfile is None:
        raise TLSError(f"client certificates ({client_ca}) need TLS: a certificate and key to serve")
    if certfile is not None:
        cfg.certfile, cfg.keyfile = certfile, keyfile
        if client_ca is not None:  # no handshake completes without a certificate this CA signed
            cfg.ca_certs, cfg.verify_mode = client_ca, ssl.CERT_REQUIRED
        try:
            cfg.create_ssl_context()  # hypercorn loads them only once serving: fail here, naming the files
        except (OSError, ssl.SSLError) as e:
            label = f"{what}: " if what else ""
            raise TLSError(f"{label}cannot load the TLS certificate {certfile} with key {keyfile}: "
                           f"{getattr(e, 'strerror', None) or e}") from None
    cfg.accesslog = None
    cfg.errorlog = None
    cfg.graceful_timeout = 1.0
    async with trio.open_nursery() as nursery:
        try:
            binds = await nursery.start(lambda task_status: serve(app, cfg, task_status=task_status))
        except BaseException as e:  # hypercorn's bind error arrives inside (nested) exception groups
            err = _first(e, OSError)
            if err is None:
                raise
            label = f"{what} " if what else ""
            raise ListenError(f"cannot listen on {label}{bind}: {err.strerror or err}") from None
        task_status.started(binds)


def _first(e: BaseException, kind: type) -> BaseException | None:
    if isinstance(e, kind):
        return e
    if isinstance(e, BaseExceptionGroup):
        for sub in e.exceptions:
            if (got := _first(sub, kind)) is not None:
                return got
    return None
