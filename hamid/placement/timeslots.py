"""Time slots: which part of every period each compute-limited container on a
GPU may run in.

Containers with a compute limit (0 < cores < 100) on one GPU get disjoint
parts of the shim's period (100 ms by default), in whole percent, as many
percent as their limit. The shim (``HAMID_SM_SLOTS``) runs their kernels only
there, so they never time-slice against each other: time-slicing between
contexts costs the GPU 8-10% of its throughput, and that loss would land on
whichever container could least afford it (measured on an H100, see
bench/gpu/). Containers without a limit take no slot.

The placement already guarantees that the limits on a GPU add up to at most
100, so an assignment always exists; it is contiguous when a free gap is large
enough (best fit, so large gaps stay large), and otherwise made of the fewest
pieces, largest gaps first. Pure functions; the ledger calls them inside the
transaction that books the reservation.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .result import Decision

PERIOD_PCT = 100
MAX_PIECES = 16  # the shim's HAMID_MAX_SLOTS

Span = tuple[int, int]  # [start, end) in percent of the period


def free_spans(taken: Iterable[Span]) -> list[Span]:
    """The gaps of [0, 100) that no span in ``taken`` covers, in order."""
    out, at = [], 0
    for a, b in sorted(taken):
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < PERIOD_PCT:
        out.append((at, PERIOD_PCT))
    return out


def allocate(pct: int, taken: Iterable[Span]) -> list[Span] | None:
    """``pct`` percent of the period outside ``taken``, or None if it is not there."""
    gaps = free_spans(taken)
    whole = [g for g in gaps if g[1] - g[0] >= pct]
    if whole:
        a, _ = min(whole, key=lambda g: (g[1] - g[0], g[0]))
        return [(a, a + pct)]
    out, left = [], pct
    for a, b in sorted(gaps, key=lambda g: (g[0] - g[1], g[0])):
        take = min(left, b - a)
        out.append((a, a + take))
        left -= take
        if not left:
            break
    if left or len(out) > MAX_PIECES:
        return None
    return sorted(out)


def render(spans: Iterable[Span]) -> str:
    """The shim's ``HAMID_SM_SLOTS`` form: ``0-30,50-70``."""
    return ",".join(f"{a}-{b}" for a, b in spans)


SlotMap = dict[str, dict[str, list[Span]]]  # container name -> GPU uuid -> spans


def assign(decision: Decision, others: Iterable[Mapping[str, Mapping[str, Iterable[Iterable[int]]]]]) -> SlotMap:
    """Slots for every compute-limited GPU share in ``decision``.

    ``others`` are the slot maps of the reservations already on the node. App
    containers of one pod run together, so they get disjoint slots; init
    containers run one at a time before them, so each may reuse the pod's app
    slots. A share that cannot get slots (more than MAX_PIECES fragments) gets
    none, and the shim falls back to its rate limit for it.
    """
    taken: dict[str, list[Span]] = {}
    for m in others:
        for per_gpu in m.values():
            for uuid, spans in per_gpu.items():
                taken.setdefault(uuid, []).extend((int(a), int(b)) for a, b in spans)
    return assign_taken(decision, taken)


def assign_taken(decision: Decision, taken: Mapping[str, list[Span]]) -> SlotMap:
    """:func:`assign`, given the spans already taken on each GPU (kept as a
    running sum by the ledger, so a commit does not walk every reservation)."""
    out: SlotMap = {}
    own: dict[str, list[Span]] = {}
    for c in sorted(decision.containers, key=lambda c: c.init):  # app containers first
        for d in c.devices:
            if d.mig_profile or not 0 < d.cores < 100:
                continue
            busy = taken.get(d.uuid, []) + ([] if c.init else own.get(d.uuid, []))
            got = allocate(d.cores, busy)
            if got is None:
                continue
            out.setdefault(c.name, {})[d.uuid] = got
            if not c.init:
                own.setdefault(d.uuid, []).extend(got)
    return out
