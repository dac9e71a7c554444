"""The ledger's batch commit: several proposals in one transaction, a verdict for each.

What the gate leader relies on: a batch books exactly what the same commits one by one
would (same rows, same time slots, same refusals), one refused proposal leaves the others
committed, a batch sent again (a new leader after failover) changes nothing, and the whole
batch costs the node one transaction, not one per placement.
"""

from __future__ import annotations

import random

import pytest

from simnodes import node_view

from hamid.ledger import Details, Ledger, LedgerConflict
from hamid.node.identity import Owner
from hamid.placement import place
from hamid.request import parse_docker_env


def new_ledger(path, spec="T4:2"):
    led = Ledger(path)
    led.set_inventory("node-a", node_view("node-a", spec).gpus)
    return led


def proposals(led: Ledger, n: int, seed: int):
    """``n`` (owner, decision, request, details) chosen from the ledger's view as it is now
    (a leader's stale view: later ones may no longer fit once earlier ones are booked)."""
    rnd = random.Random(seed)
    view = led.view()
    out = []
    for i in range(n):
        spec = rnd.choice(["mem=2g", "mem=4g", "mem=6g,cores=30", "mem=1g,cores=50"])
        request = parse_docker_env({"HAMI_VGPU_SPEC": spec}, f"c{i}")
        out.append((Owner("pod", f"uid-{seed}-{i}", name=f"default/p{i}"), place(request, [view]),
                    request, Details(placed_by="gate", attempt=f"a{i}")))
    return out


def rows(led: Ledger):
    return sorted((r.owner, r.state, r.decision, r.details, r.request, r.name) for r in led.list())


@pytest.mark.parametrize("seed", range(6))
def test_a_batch_books_what_the_same_commits_one_by_one_would(tmp_path, seed):
    one, many = new_ledger(tmp_path / "one.db"), new_ledger(tmp_path / "many.db")
    items = proposals(one, 12, seed)
    singles = []
    for owner, decision, request, details in items:
        try:
            singles.append(one.commit(owner, decision, request=request, details=details))
        except LedgerConflict as e:
            singles.append(e)
    got = many.commit_many(items)
    assert [type(x) for x in got] == [type(x) for x in singles]
    assert any(isinstance(x, LedgerConflict) for x in got), "the seed should overfill the node"
    assert [str(x) for x in got if isinstance(x, LedgerConflict)] == \
        [str(x) for x in singles if isinstance(x, LedgerConflict)]
    assert [(r.owner, r.decision, r.details) for r in got if not isinstance(r, LedgerConflict)] == \
        [(r.owner, r.decision, r.details) for r in singles if not isinstance(r, LedgerConflict)]
    strip = lambda rs: [(o, s, d, sl, rq, n) for o, s, d, sl, rq, n in rs]  # noqa: E731
    assert strip(rows(many)) == strip(rows(one))
    assert many.view() == one.view()
    # a fresh reader of the file (no cache) sees the same booked state
    assert Ledger(tmp_path / "many.db").view() == one.view()


def test_one_refused_proposal_leaves_the_others_committed(tmp_path):
    led = new_ledger(tmp_path / "l.db", "T4")  # one GPU, 15360 MiB
    view = led.view()
    mk = lambda i, spec: (Owner("pod", f"u{i}"), place(parse_docker_env({"HAMI_VGPU_SPEC": spec}, f"c{i}"), [view]),  # noqa: E731
                          None, None)
    items = [mk(0, "mem=8g"), mk(1, "mem=10g"), mk(2, "mem=4g")]  # the second no longer fits after the first
    got = led.commit_many(items)
    assert not isinstance(got[0], LedgerConflict) and not isinstance(got[2], LedgerConflict)
    assert isinstance(got[1], LedgerConflict) and "does not fit" in str(got[1]) and got[1].reasons
    assert sorted(r.owner for r in led.list()) == ["pod:u0", "pod:u2"]
    assert led.view().gpus[0].mem_used == 12288


def test_the_same_batch_again_changes_nothing(tmp_path):
    """A new leader sends the same placements again (its predecessor's answer was lost): each
    comes back as the reservation the node already holds, with the first attempt's details."""
    led = new_ledger(tmp_path / "l.db")
    items = proposals(led, 5, 1)
    first = led.commit_many(items)
    before = rows(led)
    again = [(o, d, r, Details(placed_by="gate", attempt="new-term")) for o, d, r, _ in items]
    second = led.commit_many(again)
    assert second == first
    assert all(r.details.attempt != "new-term" for r in second)
    assert rows(led) == before
    # a different decision for an owner already placed is that owner's refusal alone
    o, d, r, det = items[0]
    other = place(parse_docker_env({"HAMI_VGPU_SPEC": "mem=1g"}, "x"), [led.view()])
    got = led.commit_many([(o, other, r, det), *again[1:]])
    assert isinstance(got[0], LedgerConflict) and "already holds a different reservation" in str(got[0])
    assert got[1:] == first[1:] and rows(led) == before


def test_a_batch_is_one_transaction(tmp_path):
    led = new_ledger(tmp_path / "l.db", "A100-80GB:4")
    items = proposals(led, 20, 2)
    statements = []
    led._db.set_trace_callback(statements.append)
    got = led.commit_many(items)
    assert sum(1 for s in statements if s.strip().upper() == "COMMIT") == 1
    assert sum(1 for s in statements if s.strip().upper().startswith("BEGIN")) == 1
    assert len(led.list()) == sum(1 for x in got if not isinstance(x, LedgerConflict)) >= 10


def test_a_batch_that_fails_midway_books_nothing(tmp_path, monkeypatch):
    """Not a refusal but a failure (the disk, a bug) in the middle of a batch: the transaction
    rolls back and the node's booked state is what it was, to this process too."""
    led = new_ledger(tmp_path / "l.db")
    items = proposals(led, 4, 3)
    real, n = Ledger._insert, []

    def failing(self, *a, **kw):
        n.append(1)
        if len(n) == 3:
            raise OSError("disk full")
        return real(self, *a, **kw)

    monkeypatch.setattr(Ledger, "_insert", failing)
    with pytest.raises(OSError):
        led.commit_many(items)
    monkeypatch.setattr(Ledger, "_insert", real)
    assert led.list() == []
    assert all(g.mem_used == 0 and g.cores_used == 0 for g in led.view().gpus)
    assert len([x for x in led.commit_many(items) if not isinstance(x, LedgerConflict)]) >= 2
