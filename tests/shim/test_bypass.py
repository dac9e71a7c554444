"""Issue 37: a container that runs kernels outside its shim is held to its compute limit from outside.

Owns the proof that the daemon's live pass, given NVML's view of a container with a compute limit whose
region charges nothing (no shim in its processes, or a region it froze), holds that container's GPU time to
its limit on average by stopping its processes (hamid/shimlimits/bypass.py), whatever the GPU's queue runs
on after a stop; that it does so only while the limit applies (force, or default with a neighbour active);
that no honest container is ever stopped; and, on real processes, that the stops are SIGSTOP/SIGCONT of
exactly the container's processes, undone when it leaves, when the daemon stops, and by a daemon that starts
after one that died with processes stopped.

NVML is the one stand-in (no GPU here): a model of a process whose launches fill a queue the GPU runs for
QUEUE_S after the process stops.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hamid.shimlimits import ContainerLimits, DeviceLimits, write_limits_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nodeharness import MAPPER, busy_gpu, installed_shims, limited_process  # noqa: E402
from hamid.shimlimits.bypass import BypassGuard, Signals, start_time
from hamid.shimlimits.live import DISAGREE_PASSES, OVER_LIMIT_PASSES, GpuReading, LivePass, Tenant

GPU = "GPU-11111111-2222-3333-4444-555555555555"
QUEUE_S = 1.5  # what a stopped process's queue still runs (a deep queue of 8192^3 GEMMs on an H100)


class Recorder:
    """A stopper that records what it was asked, and the model of the GPU below reads."""

    def __init__(self):
        self.stopped: set = set()
        self.asked: list = []

    def stop(self, key, pids):
        self.asked.append(("stop", key, tuple(pids)))
        self.stopped.add(key)

    def resume(self, key):
        self.asked.append(("resume", key))
        self.stopped.discard(key)


class Queue:
    """A saturating process's GPU work: all of the GPU while it runs; once stopped, what it queued runs on for
    QUEUE_S, then nothing."""

    def __init__(self):
        self.left = 0.0

    def use(self, stopped: bool) -> float:
        """Its share of the next second (0..1)."""
        if not stopped:
            self.left = QUEUE_S
            return 1.0
        got = min(1.0, self.left)
        self.left -= got
        return got


def limits_file(path: Path, sm: int = 30, policy: str = "default") -> Path:
    write_limits_file(path, ContainerLimits(devices=(DeviceLimits(GPU, sm_percent=sm),), region_path="/r",
                                            sm_policy=policy))
    return path


def run_model(tmp_path, passes: int, *, policy: str, neighbour: bool, limit: int = 30):
    """A saturating container with no shim (no region) at ``limit`` %, and optionally an honest neighbour
    (charging 0.2 s a pass, always busy: 20 % of the GPU), over ``passes`` one-second passes; returns the bypasser's busy
    share per pass and the recorder."""
    rec = Recorder()
    live = LivePass(guard=BypassGuard(rec))
    bad = limits_file(tmp_path / "bad.limits", limit, policy)
    good = limits_file(tmp_path / "good.limits", 70, policy)
    queue, shares = Queue(), []
    for t in range(1, passes + 1):
        use = queue.use((str(bad), 0) in rec.stopped)
        shares.append(100 * use)
        busy = {101} if use > 0 else set()
        pid_busy = {101: 100 * use}
        tenants = [Tenant(str(bad), 0, 1, (101,), None, limit_pct=limit, policy=policy)]
        if neighbour:
            busy.add(202)
            pid_busy[202] = 100.0  # time-sliced: NVML reads it at the device's share
            tenants.append(Tenant(str(good), 0, 1, (202,), int(0.2e9 * t), limit_pct=70, policy=policy))
        device = min(100.0, 100 * use + (20.0 if neighbour else 0.0))  # the neighbour runs 20 % of the GPU
        live.run(float(t), {GPU: (GpuReading(device, frozenset(busy), pid_busy), tenants)})
    return shares, rec, live


@pytest.mark.parametrize("policy, neighbour", [("force", False), ("default", True)])
def test_a_container_outside_its_shim_is_held_to_its_limit_on_average(tmp_path, policy, neighbour):
    shares, rec, live = run_model(tmp_path, 80, policy=policy, neighbour=neighbour)
    held = shares[10:]
    mean = sum(held) / len(held)
    assert mean <= 35, f"the bypassing container kept {mean:.1f} % of the GPU at a 30 % limit: {shares}"
    assert mean >= 15, f"held far under its limit: {mean:.1f} %"
    assert {a[1] for a in rec.asked} == {(str(tmp_path / "bad.limits"), 0)}, "only the bypasser is ever touched"
    assert live.untrusted["uncharged"] >= 1


def test_under_default_a_container_alone_runs_free_even_outside_its_shim(tmp_path):
    """HAMi's default: the limit applies only while another container is active. Alone, nothing is stopped."""
    shares, rec, _ = run_model(tmp_path, 20, policy="default", neighbour=False)
    assert rec.asked == [] and min(shares) == 100.0


def test_a_container_whose_shim_charges_again_is_let_go(tmp_path):
    """Counted bypassing, then its region charges (its shim is back, or it was late): continued, not held."""
    rec = Recorder()
    live = LivePass(guard=BypassGuard(rec))
    bad = limits_file(tmp_path / "bad.limits", 30, "force")
    key = (str(bad), 0)
    for t in range(1, DISAGREE_PASSES + 3):
        live.run(float(t), {GPU: (GpuReading(100.0, frozenset({101}), {101: 100.0}),
                                  [Tenant(str(bad), 0, 1, (101,), None, limit_pct=30, policy="force")])})
    assert key in rec.stopped
    charged = 0
    for t in range(DISAGREE_PASSES + 3, DISAGREE_PASSES + 6):
        charged += int(0.3e9)
        live.run(float(t), {GPU: (GpuReading(30.0, frozenset({101}), {101: 30.0}),
                                  [Tenant(str(bad), 0, 1, (101,), charged, limit_pct=30, policy="force")])})
    assert key not in rec.stopped and key not in live.bypassing


def test_a_container_that_leaves_is_continued(tmp_path):
    rec = Recorder()
    live = LivePass(guard=BypassGuard(rec))
    bad = limits_file(tmp_path / "bad.limits", 30, "force")
    for t in range(1, DISAGREE_PASSES + 3):
        live.run(float(t), {GPU: (GpuReading(100.0, frozenset({101}), {101: 100.0}),
                                  [Tenant(str(bad), 0, 1, (101,), None, limit_pct=30, policy="force")])})
    assert rec.stopped
    live.run(float(DISAGREE_PASSES + 3), {GPU: (GpuReading(0.0, frozenset(), {}), [])})
    assert not rec.stopped and not live.bypassing


# ---- real processes ---------------------------------------------------------------------------------------

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces with bind mounts need root (CI is root)")


def state_of(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2]


def wait_state(pid: int, want: str) -> str:
    for _ in range(200):
        if state_of(pid) == want:
            break
        time.sleep(0.01)
    return state_of(pid)


@root_only
def test_the_guard_stops_exactly_the_containers_processes_and_continues_them(tmp_path):
    """NodeCore.priority_pass with NVML's stand-in: a container at 30 % (force) whose process NVML shows busy
    with no region; its neighbour, on the GPU and idle. The bypasser's real process is stopped (state T) within a few
    passes, the neighbour's (on the GPU, idle) never; when the daemon stops (resume_stopped) it runs again."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from nodeharness import admit_docker, make_node

    from hamid.devices.types import BusyReading
    from hamid.node import layout
    from test_isolation import in_container

    d = make_node(tmp_path / "s", regionTmpfs=False)
    state = tmp_path / "s"
    procs = []
    try:
        lim, uuid = admit_docker(d, {"bad": "mem=1g,cores=30,policy=force", "good": "mem=1g,cores=30,policy=force"})
        bad, good = in_container(lim["bad"]), in_container(lim["good"])
        procs += [bad, good]
        d.core.backend.busy = lambda: {uuid: BusyReading(
            busy_pct=100.0, busy_pids=frozenset({bad.pid}), pids=frozenset({bad.pid, good.pid}),
            pid_busy={bad.pid: 100.0})}
        for _ in range(DISAGREE_PASSES + 2):
            d.core.priority_pass()
            time.sleep(0.05)
        assert wait_state(bad.pid, "T") == "T", "the bypassing container's process was not stopped"
        assert state_of(good.pid) != "T"
        record = state / layout.STOPPED_NAME
        assert str(bad.pid) in record.read_text()
        d.core.resume_stopped()
        assert wait_state(bad.pid, "S") != "T"
        assert str(bad.pid) not in record.read_text()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        d.close()


def test_a_daemon_that_died_with_processes_stopped_has_them_continued_by_the_next(tmp_path):
    """The record names what was stopped (pid and start time, written before the stop); a new daemon's
    first pass continues those that still run, and leaves alone a pid whose start time differs (the
    kernel handed it to another process)."""
    record = tmp_path / "stopped.json"
    child = subprocess.Popen(["sleep", "60"])
    other = subprocess.Popen(["sleep", "60"])
    try:
        first = Signals(record, lambda key, pid: True)
        first.stop(("a", 0), [child.pid])
        assert wait_state(child.pid, "T") == "T"
        # the daemon dies here: its pidfds go with it, the record stays
        os.kill(other.pid, signal.SIGSTOP)
        assert wait_state(other.pid, "T") == "T"  # stopped before the recovery runs (a busy machine lags)
        doc = record.read_text()
        assert str(child.pid) in doc and start_time(child.pid) is not None
        fake = doc[:-2] + f', "{other.pid}": {start_time(other.pid) + 1}' + doc[-2:]  # a recycled pid
        record.write_text(fake)
        assert Signals(record, lambda key, pid: True).recover() == 1
        assert wait_state(child.pid, "S") != "T"
        assert state_of(other.pid) == "T", "a pid whose start time differs was signalled"
    finally:
        for p in (child, other):
            p.kill()
            p.wait()


def test_a_pid_that_is_not_the_containers_is_never_stopped(tmp_path):
    """The map said the pid was the container's; by the time the guard opens its pidfd the pid is another
    process's (``owns`` says no): not signalled."""
    child = subprocess.Popen(["sleep", "60"])
    try:
        s = Signals(tmp_path / "stopped.json", lambda key, pid: False)
        s.stop(("a", 0), [child.pid])
        time.sleep(0.05)
        assert state_of(child.pid) != "T"
    finally:
        child.kill()
        child.wait()


def test_the_guards_stops_are_counted_in_metrics(tmp_path):
    """/metrics serves how many passes held a bypassing container stopped (the daemon registers the region
    collector with NodeCore.live_counts)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from hamid.shimregion import register_collector
    _, rec, live = run_model(tmp_path, 30, policy="force", neighbour=False)
    stopped_passes = sum(1 for a in rec.asked if a[0] == "stop")
    assert stopped_passes > 0 and live.guard.stops == stopped_passes
    reg = CollectorRegistry()
    (tmp_path / "containers").mkdir()
    register_collector(reg, tmp_path / "containers", live=live.counts)
    got = [s.value for fam in text_string_to_metric_families(generate_latest(reg).decode())
           for s in fam.samples if s.name == "hamid_vgpu_bypass_stops_total"]
    assert got == [float(stopped_passes)]


def test_a_stuck_pass_does_not_keep_a_container_stopped(tmp_path):
    """A stop lasts until the next pass. When passes stop coming (NVML not answering, the pass stuck in its
    thread), the daemon's watchdog continues every stopped container after STALE_S."""
    from hamid.shimlimits.bypass import STALE_S
    _, rec, live = run_model(tmp_path, 6, policy="force", neighbour=False)
    assert rec.stopped, "stopped by the model's last pass"
    assert not live.guard.resume_if_stale(6.0 + STALE_S - 0.5) and rec.stopped
    assert live.guard.resume_if_stale(6.0 + STALE_S + 0.5) and not rec.stopped


# ---- no shim mapped: whatever the region says --------------------------------------------------------------

def test_the_kernels_list_of_mappings_says_whether_a_process_has_the_shim(tmp_path):
    """hostpids.maps_any reads /proc/<pid>/maps: a process that maps the shim's file (same device and inode)
    has it; one that maps another file of the same name, or nothing, has not; a gone pid is unknown."""
    from hamid.shimlimits.hostpids import file_idents, maps_any

    shim = tmp_path / "libvgpu.so.1"
    shim.write_bytes(b"\0" * 8192)
    other = tmp_path / "elsewhere" / "libvgpu.so.1"
    other.parent.mkdir()
    other.write_bytes(b"\0" * 8192)
    idents = file_idents([shim])
    procs = [subprocess.Popen([sys.executable, "-c", MAPPER, str(p)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for p in (shim, other)]
    plain = subprocess.Popen(["sleep", "60"])
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ok"
        assert maps_any(procs[0].pid, idents) is True
        assert maps_any(procs[1].pid, idents) is False
        assert maps_any(plain.pid, idents) is False
        assert maps_any(999_999_999, idents) is None
    finally:
        for p in (*procs, plain):
            p.kill()
            p.wait()


@pytest.mark.parametrize("kind", ["tiny", "steady", "frozen"])
def test_a_container_with_no_shim_is_held_whatever_its_region_charges(tmp_path, kind):
    """No shim mapped in its busy process (the kernel's list), and a region it writes itself: a small charge
    each pass, a plausible steady one, or a frozen one. Counted "unshimmed" in the first pass it is busy,
    left out of the correction, and held to its limit by the guard on average."""
    rec = Recorder()
    live = LivePass(guard=BypassGuard(rec))
    bad = limits_file(tmp_path / "bad.limits", 30, "force")
    key = (str(bad), 0)
    queue, charged, shares = Queue(), 0, []
    for t in range(1, 81):
        use = queue.use(key in rec.stopped)
        shares.append(100 * use)
        charged += {"tiny": int(0.03e9), "steady": int(0.3e9), "frozen": 0}[kind]
        live.run(float(t), {GPU: (GpuReading(100.0 * use, frozenset({101}) if use else frozenset(), {101: 100 * use}),
                                  [Tenant(str(bad), 0, 1, (101,), charged, limit_pct=30, policy="force",
                                          unshimmed=(101,))])})
        if t == 1:
            assert live.untrusted["unshimmed"] == 1 and key in live.bypassing
    held = shares[10:]
    assert sum(held) / len(held) <= 35, shares
    assert live.factor(GPU) == 1.0


@root_only
def test_the_daemon_tells_a_process_with_the_installed_shim_from_one_without(tmp_path):
    """NodeCore.priority_pass: two limited containers busy on one GPU, one whose process maps the shim the
    daemon installed (stateDir/shim/libvgpu.so.<version>, as the preload does), one whose process maps none.
    After one pass only the second is counted "unshimmed" and held, and `hamid status` says so."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from nodeharness import admit_docker, make_node

    from hamid.cli.render import status_table

    d = make_node(tmp_path / "s", regionTmpfs=False)
    installed = installed_shims(d, tmp_path / "s")
    procs = []
    try:
        lim, uuid = admit_docker(d, {"with": "mem=1g,cores=30,policy=force", "without": "mem=1g,cores=30,policy=force"})
        procs.append(limited_process(lim["with"], [sys.executable, "-c", MAPPER, str(installed[0])]))
        procs.append(limited_process(lim["without"], ["sh", "-c", "echo ok; exec sleep 60"]))
        busy_gpu(d, uuid, [p.pid for p in procs])
        d.core.priority_pass()
        assert d.core.live_counts().untrusted == {"unshimmed": 1}
        assert set(d.core._live.bypassing) == {(str(lim["without"]), 0)}
        doc = d.core.status("sim")  # what `hamid status` and the local API show
        held = doc["compute_held"]
        assert [(h["owner"], h["gpu"], h["reason"]) for h in held] == [("docker:without", uuid, "unshimmed")], held
        rows = [ln for ln in status_table(doc).splitlines() if "HELD to its compute limit" in ln]
        assert len(rows) == 1 and "unshimmed" in rows[0], status_table(doc)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        d.close()


def test_a_pod_held_from_outside_gets_an_event_once(tmp_path):
    """Through the node service (as the daemon runs the pass): a pod's container with no shim, busy, is held;
    ``compute_held`` is announced once for it (not again while it stays held), and the kubelet face records
    a HamidComputeHeld Event on the pod naming the container, the GPU and why (a stopped pod looks hung)."""
    import trio

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from nodeharness import admit_docker, make_node

    from hamid.kubelet.face import KubeletFace

    d = make_node(tmp_path / "s", regionTmpfs=False)
    installed_shims(d, tmp_path / "s")
    procs, told, events = [], [], []
    try:
        lim, uuid = admit_docker(d, {"p1": "mem=1g,cores=30,policy=force"}, kind="pod")
        procs.append(limited_process(lim["p1"], ["sh", "-c", "echo ok; exec sleep 60"]))
        busy_gpu(d, uuid, [procs[0].pid])
        d.service.subscribe(lambda event, key: told.append((event, key)) if event == "compute_held" else None)

        async def passes():
            for _ in range(3):
                await d.service.priority_pass()
        trio.run(passes)
        assert told == [("compute_held", "pod:p1")]
        face = KubeletFace(d.service, kubelet_dir=str(tmp_path / "kubelet"), resource="nvidia.com/gpu",
                           strategy="envvar", cdi_dir=str(tmp_path / "cdi"), defaults=None, api=None)
        face.pods.event = lambda pod, reason, message, kind="Warning": events.append((pod, reason, message))
        face._held_event("pod:p1")
        ((pod, reason, message),) = events
        assert reason == "HamidComputeHeld" and pod["metadata"]["name"] == "p1" and pod["metadata"]["namespace"] == "ns"
        assert uuid in message and "unshimmed" in message and "SIGSTOP" in message, message
    finally:
        for p in procs:
            p.kill()
            p.wait()
        d.core.resume_stopped()
        d.close()


# ---- the shim mapped, the region made up: seen while alone -------------------------------------------------

def test_a_container_that_under_charges_while_alone_is_held_once_it_shares(tmp_path):
    """A tenant with the shim mapped that launches past it and writes a tiny charge (3 % for a GPU it keeps
    100 % busy). Alone under default it runs free (HAMi's meaning) but NVML's busy share is then its own GPU
    time: three passes under half of it and it is counted "under-charged" and kept. When a neighbour
    arrives, the guard holds it to its limit on average; the honest neighbour is never touched."""
    rec = Recorder()
    live = LivePass(guard=BypassGuard(rec))
    bad = limits_file(tmp_path / "bad.limits", 30, "default")
    good = limits_file(tmp_path / "good.limits", 70, "default")
    key = (str(bad), 0)
    queue, charged, good_charged, shares = Queue(), 0, 0, []
    for t in range(1, 91):
        use = queue.use(key in rec.stopped)
        charged += int(0.03e9)
        tenants = [Tenant(str(bad), 0, 1, (101,), charged, limit_pct=30, policy="default")]
        busy, pid_busy = ({101} if use else set()), {101: 100 * use}
        if t > 10:  # the neighbour arrives
            good_charged += int(0.2e9)
            busy.add(202)
            pid_busy[202] = 100.0
            tenants.append(Tenant(str(good), 0, 1, (202,), good_charged, limit_pct=70, policy="default"))
        shares.append(100 * use)
        live.run(float(t), {GPU: (GpuReading(min(100.0, 100 * use + (20 if t > 10 else 0)), frozenset(busy),
                                              pid_busy), tenants)})
        if t == 10:
            assert shares == [100.0] * 10 and not rec.asked, "alone under default: free"
            assert live.bypassing.get(key) == "under-charged"
    held = shares[20:]
    assert sum(held) / len(held) <= 35, shares
    assert {a[1] for a in rec.asked} == {key}


def run_over(tmp_path, passes: int, *, policy: str, neighbour: bool, honest: bool = False):
    """A container at 30 % with the shim mapped whose limiter does not hold it (its limit overwritten in
    memory, a launch path the shim charges but does not hold): it keeps the GPU busy and its region charges
    what it runs, truthfully. ``honest``: a shim that holds it (it runs and charges 30 %). Optionally an honest
    neighbour at 70 % that runs and charges 20 % of the GPU. Returns its busy share per pass, the recorder,
    the pass and its key."""
    rec = Recorder()
    live = LivePass(guard=BypassGuard(rec))
    bad = limits_file(tmp_path / "bad.limits", 30, policy)
    good = limits_file(tmp_path / "good.limits", 70, policy)
    key = (str(bad), 0)
    queue, charged, good_charged, shares = Queue(), 0, 0, []
    for t in range(1, passes + 1):
        use = 0.3 if honest else queue.use(key in rec.stopped) * (0.8 if neighbour else 1.0)
        charged += int(use * 1e9)
        shares.append(100 * use)
        busy, pid_busy = ({101} if use else set()), {101: 100 * use}
        tenants = [Tenant(str(bad), 0, 1, (101,), charged, limit_pct=30, policy=policy)]
        if neighbour:
            good_charged += int(0.2e9)
            busy.add(202)
            pid_busy[202] = 100.0
            tenants.append(Tenant(str(good), 0, 1, (202,), good_charged, limit_pct=70, policy=policy))
        device = min(100.0, 100 * use + (20.0 if neighbour else 0.0))
        live.run(float(t), {GPU: (GpuReading(device, frozenset(busy), pid_busy), tenants)})
    return shares, rec, live, key


@pytest.mark.parametrize("policy, neighbour", [("force", False), ("default", True)])
def test_a_container_whose_own_region_charges_over_its_limit_is_held_to_it(tmp_path, policy, neighbour):
    """Its region is its own container's, so its word against itself is taken: charges averaging over the
    limit + OVER_LIMIT_PTS through OVER_LIMIT_PASSES passes in which the limit applied count it
    "over-limit", and the guard holds it to its limit on average from then on (held, it charges less because
    it is stopped: it stays held). The honest neighbour is never touched."""
    shares, rec, live, key = run_over(tmp_path, 90, policy=policy, neighbour=neighbour)
    assert live.bypassing.get(key) == "over-limit"
    assert live.untrusted["over-limit"] >= 1
    held = shares[OVER_LIMIT_PASSES + 12:]
    assert sum(held) / len(held) <= 35, shares
    assert {a[1] for a in rec.asked} == {key}


def test_over_its_limit_only_counts_while_the_limit_applies(tmp_path):
    """Under default and alone it runs free (HAMi's meaning); an honest shim at its limit is never counted."""
    shares, rec, live, _ = run_over(tmp_path, 30, policy="default", neighbour=False)
    assert min(shares) == 100.0 and not rec.asked and not live.bypassing
    for policy, neighbour in (("force", False), ("default", True)):
        _, rec, live, _ = run_over(tmp_path, 30, policy=policy, neighbour=neighbour, honest=True)
        assert not rec.asked and not live.bypassing and dict(live.untrusted) == {}


@pytest.mark.parametrize("policy", ["force", "default"])
def test_a_tenant_that_rewinds_its_regions_schedule_is_still_held_by_its_shim(built, tmp_path, policy):
    """The limiter's schedule lives in the container's region, which the container can write. A tenant that
    moves it back to nothing before every launch (shimtest's forgetat) ran at 100 % at a 30 % limit: each
    process now schedules no launch before its own last one, so it keeps its limit, and its region charges
    what it ran. On the real shim, the stand-in driver's virtual clock (shimharness.py); under default beside
    a busy process the stand-in NVML reports."""
    from shimharness import Shim

    from hamid.shimregion import read_region

    def rate(res):
        n, ns = res.find("run")[-1][1:3]
        return int(n) / (int(ns) / 1e9), int(ns)

    for d in ("bare", "honest", "forger"):
        (tmp_path / d).mkdir()
    bare, _ = rate(Shim(built, tmp_path / "bare", vclock=True).run("direct", "init", "run:1.2:400:k",
                                                                    preload=False))
    util = tmp_path / "nvml_util"
    util.write_text("999999 60\n")  # a process of no container of ours, 60 % busy: a neighbour
    env = dict(CUDA_DEVICE_SM_LIMIT="30", GPU_CORE_UTILIZATION_POLICY=policy, FAKE_NVML_UTIL=str(util))
    honest, _ = rate(Shim(built, tmp_path / "honest", vclock=True).run("direct", "init", "run:1.2:400:k", **env))
    forger = Shim(built, tmp_path / "forger", vclock=True)
    f = forger.run("direct", "init", "forgetat", "run:1.2:400:k", **env)
    assert f.rc == 0 and f.one("forgetat")[1] == "ok", f.stderr
    got, ns = rate(f)
    share = got / bare
    # the same run without the rewind: 0.34 under force, 0.37 under default (free until its first sample)
    assert share <= honest / bare + 0.02 and share <= 0.4, \
        f"a rewound schedule escaped the limiter: {share:.2f} of the GPU at a 30 % limit ({honest / bare:.2f} honest)"
    charged = read_region(forger.region).device(0).gpu_time_ns / ns
    assert abs(charged - share) <= 0.05, (charged, share)


def test_an_honest_shim_whose_limit_just_began_to_apply_is_not_counted_over_it(tmp_path):
    """The recorded shape of an honest shim when a neighbour arrives (bench/gpu/results/isolation): a few
    passes over its limit, up to + 27 points, while its limiter takes hold, then at its limit."""
    live = LivePass(guard=BypassGuard(Recorder()))
    a = limits_file(tmp_path / "a.limits", 70, "force")
    charged = 0
    for t, pts in enumerate([27, 24, 18, 8, 2, 0, 1, 0, 0, 1, 0, 0, 0, 0], start=1):
        charged += int((70 + pts) / 100 * 1e9)
        live.run(float(t), {GPU: (GpuReading(99.0, frozenset({101}), {101: 99.0}),
                                  [Tenant(str(a), 0, 1, (101,), charged, limit_pct=70, policy="force")])})
    assert dict(live.untrusted) == {} and not live.bypassing


def test_an_honest_shim_alone_is_not_counted_under_charged_for_a_pass_or_two(tmp_path):
    """An honest shim's charge trails the GPU for a pass at its transitions (a queue launched in one pass runs
    in the next): under half of NVML's busy share for one or two passes running is not counted."""
    live = LivePass(guard=BypassGuard(Recorder()))
    a = limits_file(tmp_path / "a.limits", 30, "force")
    charged = 0
    for t in range(1, 30):
        charged += int(0.3e9) if t % 3 else int(0.05e9)  # every third pass charged 5 % for 30 % busy
        live.run(float(t), {GPU: (GpuReading(30.0, frozenset({101}), {101: 30.0}),
                                  [Tenant(str(a), 0, 1, (101,), charged, limit_pct=30, policy="force")])})
    assert dict(live.untrusted) == {} and not live.bypassing


def test_the_recorded_honest_passes_count_nothing():
    """Every live pass recorded beside the GPU results (honest tenants: GEMM, small kernels, generate(),
    dynamic shapes, training, at their own limits of 20-70 %, starting 0-3 s apart on an H100 and an H200),
    replayed through today's pass: no region is counted (under-charged, over-limit or anything else), no GPU
    unaccounted, nobody held."""
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "gpu"))
    from replay_passes import recorded_limits, recorded_passes, replay

    results = Path(__file__).resolve().parents[2] / "bench" / "gpu" / "results" / "isolation"
    total, limits_seen = 0, set()
    for f in sorted(results.glob("*.json")):
        doc = json.loads(f.read_text())
        passes, limits = recorded_passes(doc), recorded_limits(doc)
        firsts = {pids[0] for p in passes for pids in p["pids"].values() if pids}
        assert firsts <= limits.keys(), f"{f.name}: tenants with no recorded limit {sorted(firsts - limits.keys())}"
        limits_seen |= {limits[p] for p in firsts}
        total += len(passes)
        live = replay(passes, Path(tempfile.mkdtemp(prefix="replay-")), limits)
        assert dict(live.untrusted) == {}, f"{f.name}: {dict(live.untrusted)}"
        assert dict(live.unaccounted) == {} and not live.bypassing, f.name
    assert total >= 700
    assert {(30, "default"), (70, "default"), (20, "default"), (50, "default")} <= limits_seen
