"""Which names changed since a reader last looked: an append-only journal with cursors.

What it owns: the order in which named things (gossip members, nodes of the
leader's cluster view) changed, so a reader that keeps a cursor can bring its
own derived state up to date by touching only what changed since, instead of
re-reading every entry. What it does not: the things themselves (the caller
keeps those) or who reads (any number of readers, each with its own cursor).

A cursor is the journal's length when the reader last looked. The journal
keeps the last ``keep`` names; a reader whose cursor fell behind that gets
``None`` from :meth:`ChangeLog.since` and must re-read everything (correct,
only slower). Trimming replaces the list instead of cutting it in place, so a
:class:`LogView` taken earlier (e.g. handed to a worker thread) stays valid.
"""

from __future__ import annotations

# Names remembered: at 5,000 nodes each republishing every few seconds this
# is tens of seconds of history, far more than any reader lags (readers look
# on every call they serve); a list of references, ~0.8 MB when full.
KEEP = 100_000


class LogView:
    """The journal as it was when taken: names marked between cursors ``base`` and ``end``."""

    __slots__ = ("_names", "_base", "end")

    def __init__(self, names: list[str], base: int, end: int) -> None:
        self._names, self._base, self.end = names, base, end

    def since(self, cursor: int | None) -> set[str] | None:
        """Names marked after ``cursor`` up to this view's end, or None when
        ``cursor`` is None or older than what is kept (then: re-read everything)."""
        if cursor is None or cursor < self._base or cursor > self.end:
            return None
        return set(self._names[cursor - self._base:self.end - self._base])


class ChangeLog:
    """Append-only journal of changed names; readers keep cursors."""

    def __init__(self, keep: int = KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep}: expected at least 1 name")
        self._keep = keep
        self._names: list[str] = []
        self._base = 0  # the cursor of _names[0]

    @property
    def cursor(self) -> int:
        """The cursor a reader that has seen everything so far holds."""
        return self._base + len(self._names)

    def mark(self, name: str) -> None:
        self._names.append(name)
        if len(self._names) > 2 * self._keep:  # amortised: trim by half at a time, into a new list
            cut = len(self._names) - self._keep
            self._names = self._names[cut:]
            self._base += cut

    def since(self, cursor: int | None) -> set[str] | None:
        return self.frozen().since(cursor)

    def frozen(self) -> LogView:
        return LogView(self._names, self._base, self.cursor)
