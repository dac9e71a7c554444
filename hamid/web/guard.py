"""The web listener's rules: who may look, how many at once, for how long.

- **Token** (``webTokenFile``): one secret line. A request is let in with
  ``Authorization: Bearer <token>`` or with the session cookie that
  ``POST /login`` sets after the token is typed in (HttpOnly,
  SameSite=Strict; its value is an HMAC of the token, not the token). The
  file must not be readable by group or others, as an SSH key. Without a
  token file the view is open to whoever reaches the port, which the config
  allows only on loopback unless ``webInsecure`` says otherwise.
- **Connection cap** (``webMaxConnections``): requests in flight, live
  streams included; past it, 503 at once instead of queueing.
- **Deadlines**: every request but the live stream must finish within
  ``webRequestTimeout`` (body read included) or gets 503; a live stream ends
  after ``STREAM_MAX_S`` and the browser reconnects by itself, so no
  connection is held forever by a tab left open.
- **Body limit**: ``MAX_BODY`` bytes (the what-if box's text), counted as it
  arrives, so a false ``Content-Length`` does not get past it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat

from ..errors import HamidError

COOKIE = "hamid_web"
MAX_BODY = 64 * 1024 + 1024  # the what-if text (whatif.MAX_TEXT) and its form encoding
STREAM_MAX_S = 300.0  # a live stream's lifetime; EventSource reconnects in about a second


class TokenError(HamidError):
    """The token file cannot be used."""


def load_token(path: str) -> str:
    try:
        st = os.stat(path)
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise TokenError(f"webTokenFile {path}: {e.strerror}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise TokenError(f"webTokenFile {path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
                         "chmod 600 it")
    if len(token) < 16 or any(c.isspace() for c in token):
        raise TokenError(f"webTokenFile {path}: the token must be one line of at least 16 characters "
                         "without spaces (e.g. openssl rand -hex 24)")
    return token


class Guard:
    """The token check (None: open)."""

    def __init__(self, token: str | None) -> None:
        self.token = token
        self._session = (hmac.new(token.encode(), b"hamid-web-session", hashlib.sha256).hexdigest()
                         if token else None)

    @property
    def open(self) -> bool:
        return self.token is None

    def token_ok(self, given: str) -> bool:
        return self.token is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def session_cookie(self) -> str:
        assert self._session is not None
        return self._session

    def allowed(self, headers, cookies) -> bool:
        if self.token is None:
            return True
        auth = headers.get("authorization", "")
        if auth.startswith("Bearer ") and self.token_ok(auth[7:].strip()):
            return True
        got = cookies.get(COOKIE, "")
        return bool(got) and self._session is not None and hmac.compare_digest(got.encode(), self._session.encode())


class ConnectionCap:
    """ASGI middleware: at most ``limit`` HTTP requests in flight; 503 past it."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit
        self.active = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.active >= self.limit:
            body = f"too many connections to the web view (webMaxConnections={self.limit})\n".encode()
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"retry-after", b"2"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1
