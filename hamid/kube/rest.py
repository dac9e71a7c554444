"""JSON requests to the Kubernetes API server on the trio event loop.

What it owns: :class:`AsyncKube`, an ``httpx.AsyncClient`` (trio through
anyio) speaking plain JSON to the API server with the server, TLS and
credentials of the official client's ``Configuration`` (kubeconfig or
in-cluster: its CA file, client certificate, bearer token, and the token
refresh hook the in-cluster and exec loaders install, asked on every
request as the official client asks). Answers are plain dicts, never the
generated models: the leader's and the faces' hot paths (a gated pod's
update, an informer's list and watch) pay neither a worker thread's
hand-off nor the models' (de)serialisation. The official client stays
where it serves (its ``Configuration``, the rare writes: Events, conditions).

Limits, each a default with its reason: every request has a deadline
(``timeout_s``, 10 s: the API server answers a GET or an update in well
under a second; a watch passes its own), an answer is read against
``max_answer_bytes`` (64 MiB: a LIST of every pod of a 5,000-node cluster
fits; more is refused rather than buffered), and at most
``max_connections`` (32, the official client's pool the daemon configures)
connections are open at once.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from ..errors import HamidError

TIMEOUT_S = 10.0
MAX_ANSWER_BYTES = 64 * 1024 * 1024
MAX_CONNECTIONS = 32
# How long a bearer token is used before the configuration's refresh hook is asked again. The in-cluster
# loader re-reads the projected token file once a minute itself, and kubelet rotates that token well
# before it expires (at 80 % of an hour or more): a minute late is still inside its life.
AUTH_TTL_S = 60.0
# Methods asked again when the connection drops before an answer (urllib3's default, which the official
# client relies on): a server closes idle kept-alive connections, and a request sent on one just then is
# lost. A PUT carries its resourceVersion, so one applied before the drop is refused (409) the second time.
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})
RETRIES = 2
_DROPPED = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.ConnectError)
MAX_LINE_BYTES = 16 * 1024 * 1024  # one watch event (one object): the API server's own request limit is 3 MiB


class KubeApiError(HamidError):
    """A request the API server refused or did not answer: ``status`` is the HTTP code, 0 when
    it was not reached or did not answer in time; ``reason`` is the Status object's reason."""

    def __init__(self, status: int, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def _tls(cfg: Any) -> tuple[Any, Any]:
    """httpx's ``verify`` and ``cert`` from a kubernetes ``Configuration``."""
    import ssl

    if not cfg.host.startswith("https"):
        return True, None
    if not cfg.verify_ssl:
        return False, None
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None,
                                     cadata=getattr(cfg, "ca_cert_data", None) or None)
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    if getattr(cfg, "assert_hostname", None) is False:
        ctx.check_hostname = False
    return ctx, None


class AsyncKube:
    """Use from trio code: ``await kube.request("GET", "/api/v1/namespaces/ns/pods/p")``."""

    def __init__(self, configuration: Any, *, timeout_s: float = TIMEOUT_S,
                 max_answer_bytes: int = MAX_ANSWER_BYTES, max_connections: int = MAX_CONNECTIONS) -> None:
        self.cfg = configuration
        self.base = configuration.host.rstrip("/")
        self.timeout_s = timeout_s
        self.max_answer_bytes = max_answer_bytes
        self._auth_at: float | None = None
        self._auth_value: str | None = None
        verify, cert = _tls(configuration)
        self._http = httpx.AsyncClient(verify=verify, cert=cert, trust_env=False, timeout=httpx.Timeout(timeout_s),
                                       limits=httpx.Limits(max_connections=max_connections,
                                                           max_keepalive_connections=max_connections))

    @classmethod
    def of(cls, api: Any, **kw) -> "AsyncKube":
        """The async client beside an official ``ApiClient`` (the same server and credentials)."""
        return cls(api.configuration, **kw)

    async def aclose(self) -> None:
        await self._http.aclose()

    def _auth(self) -> str | None:
        """The Authorization header, asked of the configuration (and its refresh hook) at most every
        :data:`AUTH_TTL_S`: the kubeconfig loader's hook rebuilds the whole configuration on each
        call (over a millisecond, more than the request itself)."""
        now = time.monotonic()
        if self._auth_at is None or now - self._auth_at >= AUTH_TTL_S:
            token = self.cfg.get_api_key_with_prefix("BearerToken", alias="authorization")  # runs the hook
            if token:
                self._auth_value = token
            elif self.cfg.username or self.cfg.password:
                pair = f"{self.cfg.username or ''}:{self.cfg.password or ''}".encode()
                self._auth_value = "Basic " + base64.b64encode(pair).decode()
            else:
                self._auth_value = None
            self._auth_at = now
        return self._auth_value

    def _headers(self, content_type: str | None) -> dict[str, str]:
        h = {"Accept": "application/json"}
        if content_type:
            h["Content-Type"] = content_type
        auth = self._auth()
        if auth:
            h["Authorization"] = auth
        return h

    async def request(self, method: str, path: str, body: Any = None, *, query: Mapping[str, str] | None = None,
                      content_type: str = "application/json", timeout_s: float | None = None) -> dict:
        """One request; the answer's JSON. :class:`KubeApiError` for any answer but 2xx (with the
        API server's message) and for no answer in time."""
        what = f"{method} {path}"
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        tries = RETRIES + 1 if method in IDEMPOTENT else 1
        for attempt in range(tries):
            try:
                async with self._http.stream(method, self.base + path, params=query, content=data,
                                             headers=self._headers(content_type if data is not None else None),
                                             timeout=timeout_s or self.timeout_s) as resp:
                    raw = await self._read(resp, what)
                return _answer(what, resp.status_code, raw)
            except _DROPPED as e:  # a kept-alive connection the server had closed: as urllib3, ask again
                if attempt + 1 < tries:
                    continue
                raise KubeApiError(0, f"{what}: the API server did not answer: {type(e).__name__}: {e}") from None
            except httpx.HTTPError as e:
                raise KubeApiError(0, f"{what}: the API server did not answer: {type(e).__name__}: {e}") from None
        raise AssertionError("unreachable")

    async def _read(self, resp: httpx.Response, what: str) -> bytes:
        buf = bytearray()
        async for chunk in resp.aiter_bytes():
            buf += chunk
            if len(buf) > self.max_answer_bytes:
                raise KubeApiError(resp.status_code, f"{what}: the answer is over {self.max_answer_bytes} bytes")
        return bytes(buf)

    @contextlib.asynccontextmanager
    async def watch(self, path: str, query: Mapping[str, str], timeout_s: float) -> AsyncIterator[AsyncIterator[list[dict]]]:
        """A watch (``query`` carries ``watch=true``, ``resourceVersion``...): yields an async
        iterator of its events (``{"type": ..., "object": {...}}``) in lists, each list what arrived
        together (a reader acts on a burst at once), each line read against :data:`MAX_LINE_BYTES`;
        ``timeout_s`` bounds the whole stream."""
        what = f"WATCH {path}"
        timeout = httpx.Timeout(self.timeout_s, read=timeout_s)
        try:
            async with self._http.stream("GET", self.base + path, params=query, headers=self._headers(None),
                                         timeout=timeout) as resp:
                if resp.status_code != 200:
                    _answer(what, resp.status_code, await self._read(resp, what))
                yield _events(resp, what)
        except httpx.HTTPError as e:
            raise KubeApiError(0, f"{what}: the stream ended: {type(e).__name__}: {e}") from None


async def _events(resp: httpx.Response, what: str) -> AsyncIterator[list[dict]]:
    buf = b""
    async for chunk in resp.aiter_raw():
        buf += chunk
        if len(buf) > MAX_LINE_BYTES and b"\n" not in buf:
            raise KubeApiError(200, f"{what}: one event is over {MAX_LINE_BYTES} bytes")
        *lines, buf = buf.split(b"\n")
        out = []
        for line in lines:
            if line.strip():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    raise KubeApiError(200, f"{what}: an event is not JSON: {line[:200]!r}") from None
        if out:
            yield out


def _answer(what: str, status: int, raw: bytes) -> dict:
    if not 200 <= status < 300:
        message, reason = "", ""
        try:
            doc = json.loads(raw)
            message, reason = doc.get("message") or "", doc.get("reason") or ""
        except (ValueError, AttributeError):
            message = raw[:200].decode(errors="replace")
        raise KubeApiError(status, f"{what}: {status} {message}".rstrip(), reason)
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        raise KubeApiError(status, f"{what}: the answer is not JSON: {raw[:200]!r}") from None


__all__ = ["AsyncKube", "KubeApiError", "MAX_ANSWER_BYTES", "TIMEOUT_S"]
