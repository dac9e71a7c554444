"""Synchronous client of the local API (for the CLI and the runtime hook).

``hamid-runtime`` runs on every container start, and importing
``http.client`` (email parsing, ssl) costs more than the whole request, so
this client speaks the small subset of HTTP/1.1 the local API needs itself:
one request per connection (``Connection: close``), JSON bodies with a
``Content-Length``, the answer read to EOF.
"""

from __future__ import annotations

import errno
import json
import os
import socket

from ..errors import HamidError
from . import SOCKET_NAME


class DaemonUnavailable(HamidError):
    """No daemon answers on the socket (not running, or a stale socket)."""


class Conflict(HamidError):
    """The daemon's ledger refused a reservation (HTTP 409); ``reasons`` says why."""

    def __init__(self, message: str, reasons=(), headline: str | None = None) -> None:
        super().__init__(message)
        self.reasons = tuple(reasons)
        self.headline = headline  # "no room ...", "not configured ...", "not possible ..." (the daemon's)


def _http(path: str, timeout: float, method: str, target: str, body: bytes | None) -> tuple[int, bytes]:
    head = [f"{method} {target} HTTP/1.1", "Host: hamid", "Connection: close", "Accept: application/json"]
    if body is not None:
        head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    data = ("\r\n".join(head) + "\r\n\r\n").encode() + (body or b"")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    raw = b"".join(chunks)
    header, sep, payload = raw.partition(b"\r\n\r\n")
    lines = header.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if not sep or len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP response: {lines[0]!r}")
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            payload = payload[: int(value.strip())]
        elif name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
            raise ValueError("chunked responses are not expected from the local API")
    return int(parts[1]), payload


class LocalClient:
    def __init__(self, state_dir: str | os.PathLike, timeout: float = 30.0) -> None:
        self.socket = os.path.join(state_dir, SOCKET_NAME)
        self._timeout = timeout

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def call(self, method: str, path: str, json_body=None, *, params: dict | None = None) :
        return self._call(method, path, params=params, json_body=json_body)

    def _call(self, method: str, path: str, *, params: dict | None = None, json_body=None) :
        if not os.path.exists(self.socket):
            state = os.path.dirname(self.socket)
            if os.path.isdir(state) and not os.access(state, os.X_OK):  # root's 0700 state dir, seen by a user
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), state)
            raise DaemonUnavailable(f"no daemon socket at {self.socket}")
        if params:
            import urllib.parse

            path += "?" + urllib.parse.urlencode(params)
        body = None if json_body is None else json.dumps(json_body).encode()
        try:
            status, raw = _http(self.socket, self._timeout, method, path, body)
        except PermissionError as e:
            raise HamidError(f"cannot reach the daemon at {self.socket}: {e.strerror} (run as root)") from None
        except (TimeoutError, ConnectionError, FileNotFoundError) as e:
            raise DaemonUnavailable(f"no daemon answers at {self.socket}: {e}") from None
        except ValueError as e:
            # it died (or was killed) while answering: as good as no daemon at all
            raise DaemonUnavailable(f"the daemon at {self.socket} stopped while answering: {e}") from None
        try:
            doc = json.loads(raw)
        except ValueError:
            raise HamidError(f"daemon answered {status} with a non-JSON body") from None
        if status == 409:
            raise Conflict(doc.get("error", "conflict"), doc.get("reasons", ()), doc.get("headline"))
        if status == 410:  # it got to the request after our deadline: it committed nothing
            raise DaemonUnavailable(f"the daemon at {self.socket} answered too late: {doc.get('error')}")
        if status >= 400:
            raise HamidError(doc.get("error", f"daemon answered {status}"))
        return doc

    def status(self) -> dict:
        return self._call("GET", "/v1/status")

    def cluster(self) -> dict:
        """The gossiped cluster view (members, states, capacity documents)."""
        return self._call("GET", "/v1/cluster")

    def reservations(self) -> list[dict]:
        return self._call("GET", "/v1/reservations")

    def reserve(self, request: dict, kind: str, details: dict | None = None, *, owner: dict | None = None,
                deadline: float | None = None) -> dict:
        body = {"kind": kind, "request": request, "details": details or {}, "deadline": deadline}
        if owner is not None:
            body["owner"] = owner
        return self._call("POST", "/v1/reservations", json_body=body)

    def commit(self, owner: str | dict, decision: dict, kind: str, request: dict | None = None) -> dict:
        return self._call("POST", "/v1/reservations/commit",
                          json_body={"kind": kind, "owner": owner, "decision": decision, "request": request or {}})

    def set_state(self, owner: str, state: str) -> dict:
        return self._call("PATCH", "/v1/reservations", params={"owner": owner}, json_body={"state": state})

    def release(self, owner: str) -> dict:
        return self._call("DELETE", "/v1/reservations", params={"owner": owner})
