"""The node as the runtime sees it: the daemon if it answers, else the ledger.

Reservations go through the local API when a daemon runs, so the daemon's
metrics and logs see them; with no daemon the runtime commits to the same
ledger file itself (the ledger's transaction makes the two equivalent). Node
facts the runtime needs (device backend, shim paths, device roots, defaults)
are what the daemon recorded in the ledger at start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..daemon.nodefacts import read_facts
from ..errors import HamidError
from ..localapi.client import Conflict, DaemonUnavailable, LocalClient
from ..request.model import Defaults, Request

# The ledger (SQLite + the placement engine) is imported only when no daemon
# answers: it is the slow path, and container start time matters.

LEDGER_NAME = "ledger.db"


class NodeAccess:
    def __init__(self, state_dir: str | Path) -> None:
        self.state_dir = Path(state_dir)
        self._client: LocalClient | None = LocalClient(self.state_dir)
        self._ledger = None
        self._facts: dict[str, Any] | None = None

    def _led(self):
        if self._ledger is None:
            from ..ledger import Ledger

            path = self.state_dir / LEDGER_NAME
            if not path.exists():
                raise HamidError(f"no hamid ledger at {path}: start the daemon once (hamid run --state-dir "
                                 f"{self.state_dir}), or pass this runtime --state-dir")
            self._ledger = Ledger(path)
        return self._ledger

    def meta(self) -> dict[str, Any]:
        if self._facts is None:
            self._facts = read_facts(self.state_dir)
        return self._facts

    def defaults(self) -> Defaults:
        d = self.meta().get("defaults") or {}
        return Defaults(**d) if d else Defaults()

    def _via_daemon(self, call, fallback):
        if self._client is not None:
            try:
                return call(self._client)
            except DaemonUnavailable:
                self._client = None  # no daemon: use the ledger from now on
        return fallback(self._led())

    def _drain(self, led) -> None:
        """No daemon: finish the releases poststop hooks left, before placing."""
        from .released import drain, pending

        if not pending(str(self.state_dir)):
            return

        def destroy(res: dict) -> None:
            if any(d.get("mig_profile") for c in res["decision"]["containers"] for d in c["devices"]):
                from ..daemon.reconcile import destroy_mig_of

                backend = self.backend()
                try:
                    destroy_mig_of(backend, res)
                finally:
                    backend.close()

        drain(str(self.state_dir), lambda owner: (r.to_dict() if (r := led.release(owner)) else None), destroy)

    def _local_reserve(self, led, request: Request, details: dict) -> dict:
        self._drain(led)
        return led.reserve(request, kind="docker", details=details,
                           node_policy=self.meta().get("node_policy", "binpack")).to_dict()

    def reserve(self, request: Request, details: dict) -> dict:
        try:
            return self._via_daemon(lambda c: c.reserve(request.to_dict(), "docker", details),
                                    lambda led: self._local_reserve(led, request, details))
        except Conflict as e:
            raise HamidError(f"no room for this container: {e}") from None
        except HamidError as e:
            from ..ledger import LedgerConflict
            if not isinstance(e, LedgerConflict):
                raise
            raise HamidError(f"no room for this container: {e}") from None

    def update(self, owner: str, **fields) -> dict:
        return self._via_daemon(lambda c: c.update(owner, **fields),
                                lambda led: led.update(owner, **fields).to_dict())

    def release(self, owner: str) -> dict | None:
        def local(led):
            r = led.release(owner)
            return r.to_dict() if r else None

        return self._via_daemon(lambda c: c.release(owner).get("reservation"), local)

    def get(self, owner: str) -> dict | None:
        r = self._led().get(owner)
        return r.to_dict() if r else None

    def backend(self):
        """The device backend the daemon uses, opened here (for MIG create/destroy)."""
        from ..devices import open_backend

        d = self.meta()["devices"]
        return open_backend(simulate=d.get("simulate") if d["kind"] == "simulated" else None,
                            node_name=d["node"], mig_enabled=d.get("mig_enabled", False),
                            state_dir=self.state_dir)

    def close(self) -> None:
        if self._ledger is not None:
            self._ledger.close()
