"""Synchronous client of the local API (for the CLI and the runtime hook)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from ..errors import HamidError
from ..ledger import LedgerConflict
from . import SOCKET_NAME


class DaemonUnavailable(HamidError):
    """No daemon answers on the socket (not running, or a stale socket)."""


class LocalClient:
    def __init__(self, state_dir: str | Path, timeout: float = 30.0) -> None:
        self.socket = Path(state_dir) / SOCKET_NAME
        self._http = httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)),
                                  base_url="http://hamid", timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method: str, path: str, **kw) -> Any:
        if not self.socket.exists():
            raise DaemonUnavailable(f"no daemon socket at {self.socket}")
        try:
            r = self._http.request(method, path, **kw)
        except PermissionError as e:
            raise HamidError(f"cannot reach the daemon at {self.socket}: {e.strerror} (run as root)") from None
        except httpx.TransportError as e:
            raise DaemonUnavailable(f"no daemon answers at {self.socket}: {e}") from None
        try:
            body = r.json()
        except ValueError:
            raise HamidError(f"daemon answered {r.status_code} with a non-JSON body") from None
        if r.status_code == 409:
            raise LedgerConflict(body.get("error", "conflict"), body.get("reasons", ()))
        if r.status_code >= 400:
            raise HamidError(body.get("error", f"daemon answered {r.status_code}"))
        return body

    def status(self) -> dict:
        return self._call("GET", "/v1/status")

    def reservations(self) -> list[dict]:
        return self._call("GET", "/v1/reservations")

    def reserve(self, request: dict, kind: str, details: dict | None = None) -> dict:
        return self._call("POST", "/v1/reservations", json={"kind": kind, "request": request, "details": details or {}})

    def commit(self, owner: str, decision: dict, kind: str, request: dict | None = None) -> dict:
        return self._call("POST", "/v1/reservations/commit",
                          json={"kind": kind, "owner": owner, "decision": decision, "request": request or {}})

    def update(self, owner: str, **fields) -> dict:
        return self._call("PATCH", "/v1/reservations", params={"owner": owner}, json=fields)

    def release(self, owner: str) -> dict:
        return self._call("DELETE", "/v1/reservations", params={"owner": owner})
