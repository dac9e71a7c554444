"""GPU time slots (hamid/placement/timeslots.py) and the ledger that hands
them out: compute-limited containers on one GPU get disjoint parts of the
shim's period, each exactly as large as its limit, through any sequence of
reservations and releases."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from hamid.ledger.store import Ledger
from hamid.placement import timeslots
from hamid.placement.result import ContainerAssignment, Decision, DeviceAssignment
from hamid.placement.view import GpuView
from hamid.request.model import ContainerRequest, GpuRequest, Request


def test_best_fit_keeps_large_gaps_large():
    # gaps: 10..20 (10) and 50..100 (50); 10 goes to the exact gap, not the large one
    assert timeslots.allocate(10, [(0, 10), (20, 50)]) == [(10, 20)]
    assert timeslots.allocate(40, [(0, 10), (20, 50)]) == [(50, 90)]


def test_fragmented_free_time_is_used_in_the_fewest_pieces():
    assert timeslots.allocate(25, [(0, 10), (20, 50), (60, 90)]) == [(10, 20), (50, 60), (90, 95)]
    assert timeslots.allocate(31, [(0, 10), (20, 50), (60, 90)]) is None  # only 30 free
    assert timeslots.render([(0, 30), (50, 70)]) == "0-30,50-70"


def _decision(name: str, cores: list[int], init: list[bool] | None = None) -> Decision:
    init = init or [False] * len(cores)
    return Decision("n", tuple(ContainerAssignment(f"{name}-{i}", ini, (DeviceAssignment("GPU-a", 0, 100, c),))
                               for i, (c, ini) in enumerate(zip(cores, init))))


def test_pod_app_containers_are_disjoint_and_init_containers_may_reuse_them():
    got = timeslots.assign(_decision("p", [30, 20, 50], [False, False, True]), [])
    app = got["p-0"]["GPU-a"] + got["p-1"]["GPU-a"]
    assert sum(b - a for a, b in app) == 50 and not _overlap(app)
    assert sum(b - a for a, b in got["p-2"]["GPU-a"]) == 50  # runs before them, may share their time


def test_no_slot_without_a_limit_or_for_mig():
    d = Decision("n", (ContainerAssignment("c", False, (DeviceAssignment("GPU-a", 0, 100, 0),
                                                        DeviceAssignment("GPU-b", 1, 100, 100))),))
    assert timeslots.assign(d, []) == {}


def _overlap(spans) -> bool:
    s = sorted(spans)
    return any(b[0] < a[1] for a, b in zip(s, s[1:]))


def _ledger(tmp_path) -> Ledger:
    led = Ledger(tmp_path / "ledger.db")
    led.set_inventory("n", [GpuView(uuid="GPU-a", index=0, name="NVIDIA H100 80GB HBM3", mode="hami-core",
                                    mem_total=81559, cores_total=100, slots_total=16)])
    return led


def _req(owner: str, cores: int) -> Request:
    return Request(owner=owner, containers=(ContainerRequest("c", False, GpuRequest(count=1, mem_mib=1000,
                                                                                    cores=cores)),))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 60)), min_size=1, max_size=30))
def test_ledger_slots_never_overlap_through_reserves_and_releases(tmp_path_factory, ops):
    led = _ledger(tmp_path_factory.mktemp("l"))
    live: list[str] = []
    for n, (release, cores) in enumerate(ops):
        if release and live:
            led.release(live.pop(0))
        else:
            try:
                led.reserve(_req(f"o{n}", cores), kind="docker")
                live.append(f"o{n}")
            except Exception:  # noqa: BLE001 - does not fit: fine, the point is the slots of those that do
                continue
        spans, total = [], 0
        for r in led.list():
            cores_of = r.decision.containers[0].devices[0].cores
            got = r.details.slots["c"]["GPU-a"]
            assert sum(b - a for a, b in got) == cores_of
            spans += [tuple(x) for x in got]
            total += cores_of
        assert not _overlap(spans) and total <= 100
