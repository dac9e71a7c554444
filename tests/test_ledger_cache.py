"""The ledger's booked state is kept as running sums (issue 25), and is never stale.

A commit no longer parses every reservation: the ledger keeps each
reservation's use and their sum, valid while no other connection committed
(SQLite's ``data_version``), updated row by row after its own commits. What
that must not change: every view equals the one computed from scratch from
the rows; a commit by another connection (another process: the runtime with
no daemon) is seen by the next commit, so nothing is overbooked; a
transaction that fails leaves the sums as they were.
"""

from __future__ import annotations

import random

import pytest

from hamid.ledger import Ledger, LedgerConflict
from hamid.placement.usage import with_usage
from test_ledger import new_ledger, req


def _scratch(led: Ledger, without: str | None = None):
    """The view as the ledger computed it before the running sums: from every row."""
    v = led.view()
    return with_usage(v.name, [g.with_use(0, 0, 0, False, ()) for g in v.gpus],
                      [r.decision for r in led.list() if r.owner != without], v.gpu_policy)


def test_views_equal_the_sum_of_the_rows_through_commits_moves_and_releases(tmp_path):
    led = new_ledger(tmp_path / "l.db", "A100-40GB:4")
    rnd = random.Random(7)
    held: list[str] = []
    for step in range(300):
        if held and rnd.random() < 0.4:
            led.release(f"docker:{held.pop(rnd.randrange(len(held)))}")
        else:
            cid = f"c{step}"
            spec = rnd.choice(["mem=1g", "mem=2g,cores=30", "mem=512m,cores=10", "cores=100", "mem=3g,gpus=2"])
            try:
                led.reserve(req(cid, spec), kind="docker")
                held.append(cid)
            except LedgerConflict:
                pass
        assert led.view() == _scratch(led)
        if held:
            who = f"docker:{rnd.choice(held)}"
            assert led.view_without(who) == _scratch(led, without=who)


def test_a_commit_by_another_connection_is_seen_by_the_next_commit(tmp_path):
    daemon = new_ledger(tmp_path / "l.db", "T4:1")  # one 16 GB GPU
    daemon.reserve(req("a", "mem=6g"), kind="docker")  # its running sums are warm
    runtime = Ledger(tmp_path / "l.db")  # another process's connection
    runtime.reserve(req("b", "mem=6g"), kind="docker")
    with pytest.raises(LedgerConflict):  # 6 + 6 + 6 > 16: the daemon must see b
        daemon.reserve(req("c", "mem=6g"), kind="docker")
    runtime.release("docker:b")
    daemon.reserve(req("c", "mem=6g"), kind="docker")  # and see b gone
    assert daemon.view() == _scratch(daemon)
    assert sum(g.mem_used for g in daemon.view().gpus) == 12 * 1024


def test_a_refused_commit_leaves_the_sums_as_they_were(tmp_path):
    led = new_ledger(tmp_path / "l.db", "T4:1")
    led.reserve(req("a", "mem=10g"), kind="docker")
    before = led.view()
    with pytest.raises(LedgerConflict):
        led.reserve(req("b", "mem=10g"), kind="docker")
    assert led.view() == before == _scratch(led)
    led.reserve(req("b", "mem=5g"), kind="docker")
    assert led.view() == _scratch(led)
