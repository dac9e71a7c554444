"""What a peer call can end in, one class per thing the caller does differently."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import HamidError, Unreachable


class PeerError(HamidError):
    """Any failure of a peer call."""

    def __init__(self, message: str, *, address: str = "") -> None:
        super().__init__(message)
        self.address = address


class PeerRefused(PeerError):
    """The peer's ledger said no; ``reasons`` are the ledger's, one per GPU or rule."""

    def __init__(self, message: str, reasons: Iterable[str] = (), *, address: str = "") -> None:
        super().__init__(message, address=address)
        self.reasons = tuple(reasons)


class PeerUnauthenticated(PeerError):
    """One side does not hold a key of the other's keyring: the server could
    not open our request, or the answer is not sealed by a key of ours (the
    server is not a key holder, or someone else answered)."""


class PeerUnreachable(PeerError, Unreachable):
    """No answer: connection refused, timed out, cut mid-answer.
    ``maybe_applied`` is True when the request may have reached the peer
    (commit and release are idempotent: retrying is safe)."""

    def __init__(self, message: str, *, address: str = "", maybe_applied: bool = False) -> None:
        super().__init__(message, address=address)
        self.maybe_applied = maybe_applied


class PeerProtocolError(PeerError):
    """The peer authenticated the request but refused it for what it is (stale
    timestamp, replayed id, wrong node, malformed arguments, too large), or
    answered something this client cannot read. ``kind`` names which."""

    def __init__(self, message: str, kind: str, *, address: str = "") -> None:
        super().__init__(message, address=address)
        self.kind = kind


class PeerUnknownMethod(PeerProtocolError):
    """The peer does not know the request's method (an older hamid, during a rolling upgrade): it
    refused the request before reading it, so nothing was applied."""

    def __init__(self, message: str, *, address: str = "") -> None:
        super().__init__(message, "unknown-method", address=address)
