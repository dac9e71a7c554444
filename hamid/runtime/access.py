"""The node as the runtime reaches it: the daemon if it answers, else the node core itself.

One call per container create: ``POST /v1/containers`` with the container's
``HAMI_*`` variables; the daemon admits it and answers with the container's
edits. The call carries a deadline: a daemon that only gets to the request
after the runtime stopped waiting (stopped, swamped) commits nothing for it.
When no daemon answers (no socket, refused, timed out, or it died while
answering), the runtime admits the container with the very same
:class:`hamid.node.core.NodeCore` over the ledger file; the ledger's
transactions make the two equivalent, and the owner's key (the container id)
makes a retry find what an interrupted daemon already committed.
"""

from __future__ import annotations

import os
import time

from ..errors import HamidError
from ..localapi.client import Conflict, DaemonUnavailable, LocalClient
from ..node.layout import LEDGER_NAME
from ..placement.reasons import NO_ROOM
from ..request.docker import ENV_PREFIXES

# How long the runtime waits for the daemon, and the deadline it gives it:
# the daemon must have committed (or given up) well before the runtime stops
# waiting, so an answer in flight is never lost to a timeout.
DAEMON_TIMEOUT_S = 30.0
DEADLINE_S = 25.0

class NodeAccess:
    def __init__(self, state_dir: str | os.PathLike, *, timeout_s: float = DAEMON_TIMEOUT_S) -> None:
        self.state_dir = os.fspath(state_dir)
        self._timeout = timeout_s
        self._core = None

    def _local(self):
        """No daemon: the node core over the ledger file (the slow path)."""
        if self._core is None:
            from ..devices import open_backend
            from ..ledger import Ledger
            from ..node.core import NodeCore
            from ..node.facts import read_facts

            path = os.path.join(self.state_dir, LEDGER_NAME)
            if not os.path.exists(path):
                raise HamidError(f"no hamid ledger at {path}: start the daemon once (hamid run --state-dir "
                                 f"{self.state_dir}), or pass this runtime --state-dir")
            facts = read_facts(self.state_dir)
            b = facts.backend

            def backend():
                return open_backend(simulate=b.get("simulate") if b["kind"] == "simulated" else None,
                                    node_name=facts.node, mig_enabled=b.get("mig_enabled", False),
                                    state_dir=self.state_dir)

            self._core = NodeCore(Ledger(path), facts, backend)
        return self._core

    def admit_container(self, cid: str, env: list[str], user: tuple[int, int], details: dict) -> dict:
        """``{"ours": False}``, or ``{"ours": True, "reservation": ..., "edits": {container: cdi edits}}``."""
        ours = [e for e in env if e.startswith(ENV_PREFIXES)]
        deadline = time.time() + min(DEADLINE_S, self._timeout * 5 / 6)
        body = {"id": cid, "env": ours, "user": list(user), "details": details, "deadline": deadline}
        try:
            return LocalClient(self.state_dir, timeout=self._timeout).call("POST", "/v1/containers", body)
        except Conflict as e:
            raise HamidError(f"{e.headline or NO_ROOM}: {e}") from None
        except DaemonUnavailable:
            pass
        return self._admit_locally(cid, ours, user, details)

    def _admit_locally(self, cid: str, env: list[str], user: tuple[int, int], details: dict) -> dict:
        from ..ledger import LedgerConflict
        from ..node.callers import container_details
        from ..node.core import container_answer, refusal
        from ..request.model import Defaults

        core = self._local()
        defaults = Defaults(**core.facts.defaults) if core.facts.defaults else Defaults()
        try:
            got = core.admit_container(cid, env, user=user, details=container_details(details, cid),
                                       defaults=defaults)
        except LedgerConflict as e:
            raise HamidError(refusal(e)) from None
        return container_answer(got)

    def release(self, key: str) -> None:
        try:
            LocalClient(self.state_dir, timeout=self._timeout).release(key)
        except DaemonUnavailable:
            self._local().release(key)

    def close(self) -> None:
        if self._core is not None:
            self._core.close()
            self._core.ledger.close()
