"""The daemon's live pass over the limits files (hamid/shimlimits/live.py): the sharing correction's
arithmetic and when it may learn, on real limits files (the writer's own), with the GPU's tenants simulated
as the shim would behave: each charges its raw measured cost times the factor written into its file and is
held to its limit, while its true GPU time is its raw cost over a bias that no shim can see while sharing."""

from __future__ import annotations

import struct

import pytest

from hamid.shimlimits import ContainerLimits, DeviceLimits, write_limits_file
from hamid.shimlimits.codec import hold_pids_offset, max_hold, share_offset
from hamid.shimlimits.live import SHARE_BOUND, STEP_MAX, GpuReading, LivePass, Tenant, next_factor

GPU = "GPU-11111111-2222-3333-4444-555555555555"


def share_of(path) -> int:
    return struct.unpack_from("<I", path.read_bytes(), share_offset(0))[0]


def hold_of(path) -> list[int]:
    raw = path.read_bytes()[hold_pids_offset(0):hold_pids_offset(0) + 4 * max_hold()]
    return [p for p in struct.unpack(f"<{max_hold()}i", raw) if p]


@pytest.fixture
def files(tmp_path):
    def make(n: int, sm: int = 30):
        out = []
        for i in range(n):
            p = tmp_path / f"c{i}.limits"
            write_limits_file(p, ContainerLimits(devices=(DeviceLimits(GPU, sm_percent=sm),), region_path="/r"))
            out.append(p)
        return out
    return make


class Sim:
    """Tenants on one GPU, each limit-bound: per second it charges its limit (the shim holds it there),
    which at factor f is limit/f of raw cost, i.e. limit/(f*bias) of true GPU time (bias: raw/true)."""

    def __init__(self, paths, limits, biases, pids=None):
        self.paths, self.limits, self.biases = paths, limits, biases
        self.charged = [0] * len(paths)
        self.pids = pids or [(1000 + i,) for i in range(len(paths))]
        self.t = 0.0

    def tenants(self, charged=True):
        return [Tenant(str(p), 0, 1, pid, c, charged) for p, pid, c in zip(self.paths, self.pids, self.charged)]

    def step(self, live: LivePass, rate_scale=None, busy_override=None, strangers=frozenset()):
        f = [share_of(p) / 1000 or 1.0 for p in self.paths]
        scale = rate_scale or [1.0] * len(self.paths)
        true = [lim / 100 * s / (fi * b) for lim, s, fi, b in zip(self.limits, scale, f, self.biases)]
        for i, lim in enumerate(self.limits):
            self.charged[i] += int(lim / 100 * scale[i] * 1e9)
        self.t += 1.0
        busy = busy_override if busy_override is not None else min(100.0, 100 * sum(true))
        pids = frozenset(p for pid in self.pids for p in pid) | strangers
        return live.run(self.t, {GPU: (GpuReading(busy, pids), self.tenants())})


def test_next_factor_moves_all_the_way_and_at_most_step_max():
    # charges are 0.95 of the busy time: one pass makes them match
    assert next_factor(1.0, [0.35e9, 0.6e9], 1e9, 100.0) == pytest.approx(1 / 0.95)
    # a ratio of 1.2 in one pass moves it only as far as the bound; so does a ratio of 16
    assert next_factor(1.0, [0.3e9, 0.5e9], 1e9, 96.0) == pytest.approx(1 + SHARE_BOUND)
    assert next_factor(1.0, [0.05e9], 1e9, 80.0) == pytest.approx(1 + SHARE_BOUND)
    assert next_factor(1.0, [0.8e9], 1e9, 5.0) == pytest.approx(1.0)  # never under 1: nobody over its limit
    # within the bound, whatever the history
    assert next_factor(3.9, [0.1e9], 1e9, 90.0) == pytest.approx(1 + SHARE_BOUND)
    assert STEP_MAX > 1 + SHARE_BOUND  # the step limit never binds inside the bound


def test_a_steady_shared_gpu_learns_so_the_charges_sum_to_its_busy_time(files):
    """Two containers at 20 and 30 %, whose shims both charge 0.95 of their true GPU time while sharing: the
    pass converges on 1/0.95 and writes it into both files; their charges then sum to NVML's busy time. Off by
    more than the bound (0.65), the factor stops at the bound."""
    sim = Sim(files(2), [20, 30], [0.95, 0.95])
    live = LivePass()
    for _ in range(14):
        sim.step(live)
    want = 1 / 0.95
    assert [share_of(p) for p in sim.paths] == [round(live.factor(GPU) * 1000)] * 2
    assert live.factor(GPU) == pytest.approx(want, rel=0.01)
    f = live.factor(GPU)
    assert 100 * sum(lim / 100 / (f * 0.95) for lim in (20, 30)) == pytest.approx(50, rel=0.01)
    far = Sim(files(4)[2:], [20, 30], [0.65, 0.65])
    live = LivePass()
    for _ in range(14):
        far.step(live)
    assert live.factor(GPU) == pytest.approx(1 + SHARE_BOUND)


@pytest.mark.parametrize("case", ["alone", "stranger", "uncharged", "nvml-unknown"])
def test_no_correction_where_the_pass_cannot_know(files, case):
    """Alone (the shim's own feedback holds), a process of nobody's busy (its time is in the busy share, in
    no charge), a busy container whose shim does not charge (no limit, or policy disable), or no NVML
    reading: the files say none."""
    n = 1 if case == "alone" else 2
    sim = Sim(files(n), [30, 30][:n], [0.5, 0.5][:n])
    live = LivePass()
    for _ in range(5):
        if case == "stranger":
            sim.step(live, strangers=frozenset({777}))
        elif case == "uncharged":
            sim.t += 1
            for i in range(n):
                sim.charged[i] += int(0.3e9)
            live.run(sim.t, {GPU: (GpuReading(100.0, frozenset({1000, 1001})),
                                   [sim.tenants()[0], Tenant(str(sim.paths[1]), 0, 1, (1001,), sim.charged[1], False)])})
        elif case == "nvml-unknown":
            sim.t += 1
            for i in range(n):
                sim.charged[i] += int(0.3e9)
            live.run(sim.t, {GPU: (GpuReading(None), sim.tenants())})
        else:
            sim.step(live)
    assert [share_of(p) for p in sim.paths] == [0] * n
    assert live.factor(GPU) == 1.0


def test_a_container_starting_or_stopping_teaches_nothing(files):
    """A pass in which a container's charges jump or collapse (it started, stopped, paused) compares charges
    and busy time of different work: the factor does not move (on the H200 the pass after a tenant stopped
    saw 24 % charged against 99 % busy, and a learning pass doubled the factor)."""
    sim = Sim(files(2), [30, 70], [1.0, 1.0])
    live = LivePass()
    for _ in range(4):
        sim.step(live)
    settled = live.factor(GPU)
    assert settled == pytest.approx(1.0, abs=0.02)
    sim.step(live, rate_scale=[0.2, 0.3], busy_override=99.0)  # both stopped launching; their queues still run
    assert live.factor(GPU) == settled
    assert share_of(sim.paths[0]) == round(settled * 1000)


def test_a_new_mix_starts_from_one(files):
    """The factor belongs to the containers it was learned for: another pair on the GPU starts at 1."""
    a = Sim(files(2), [20, 30], [0.7, 0.7])
    live = LivePass()
    for _ in range(10):
        a.step(live)
    assert live.factor(GPU) == pytest.approx(1 + SHARE_BOUND)
    paths = files(4)[2:]
    b = Sim(paths, [20, 30], [1.0, 1.0])
    b.step(live)  # first sight: no interval yet
    b.step(live)
    assert live.factor(GPU) == pytest.approx(1.0, abs=0.01)
    assert [share_of(p) for p in paths] == [1000, 1000]


def test_hold_lists_name_the_higher_priority_pids_and_are_written_once(files):
    paths = files(3)
    ts = [Tenant(str(paths[0]), 0, 0, (11, 12)), Tenant(str(paths[1]), 0, 1, (21,)), Tenant(str(paths[2]), 0, 1, ())]
    live = LivePass()
    assert live.run(1.0, {GPU: (GpuReading(None), ts)}) == 9  # three hold lists, shares (none), others_active
    assert hold_of(paths[0]) == [] and hold_of(paths[1]) == [11, 12] and hold_of(paths[2]) == [11, 12]
    assert live.run(2.0, {GPU: (GpuReading(None), ts)}) == 0


def test_a_container_the_gpu_serves_below_its_limit_does_not_slow_the_learning(files):
    """A 30 % container held to its limit beside a 70 % one that never reaches its limit (time slicing gives
    it the rest of the GPU): the latter's charges are its GPU time times the factor, so each step of the
    factor moves them. The pass judges steadiness on the charges over the factor the file said, and settles
    in the passes the step limit allows (on today's H200 runs: 1.0, 1.5, 1.5, 1.61; a pass was lost after
    every step)."""
    paths = files(2)
    live, charged, bias = LivePass(), [0, 0], 0.94
    seen = []
    for t in range(1, 6):
        f = [share_of(p) / 1000 or 1.0 for p in paths]
        held_true = min(0.5, 0.30 / (f[0] * bias))  # charges 30 %/s = raw * f, raw = bias * true
        charged[0] += int(0.30e9)
        charged[1] += int((1.0 - held_true) * bias * f[1] * 1e9)  # the rest of the GPU, charged raw * f
        live.run(float(t), {GPU: (GpuReading(100.0, frozenset({1, 2})),
                                  [Tenant(str(paths[0]), 0, 1, (1,), charged[0]),
                                   Tenant(str(paths[1]), 0, 1, (2,), charged[1])])})
        seen.append(live.factor(GPU))
    # pass 1 has no interval, pass 2 compares with a pass that saw no sharing; then there, and it stays
    assert seen[2] == pytest.approx(1 / bias, rel=0.01)
    assert seen[3] == pytest.approx(1 / bias, rel=0.01)
    assert seen[4] == pytest.approx(1 / bias, rel=0.03)
