"""ledger: the node's authoritative record of what is reserved on its GPUs.

SQLite in WAL mode, one ``BEGIN IMMEDIATE`` transaction per change, durable
on commit (``synchronous=FULL``). Every reservation is re-checked inside its
transaction by the placement engine against the ledger's own state, so two
processes (the daemon and a runtime hook) committing at once never overbook a
GPU, and no node-wide lock is held between proposing and committing.
"""

from .details import Details
from .store import (STATES, TRANSITIONS, Abandoned, CommitFailed, IllegalTransition, Ledger, LedgerConflict,
                    LedgerError, Reservation, claimant_alive, claimant_id)

__all__ = ["STATES", "TRANSITIONS", "Abandoned", "CommitFailed", "Details", "IllegalTransition", "Ledger",
           "LedgerConflict", "LedgerError", "Reservation", "claimant_alive", "claimant_id"]
