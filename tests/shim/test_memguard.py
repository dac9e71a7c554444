"""A container's processes that allocate outside the shim are held to its GPU memory limit (memguard.py).

Owns the proof that a container whose processes hold more GPU memory than its limit by NVML's count of them
(its host pids, the host's pid map) two passes running is counted, and that with ``memoryBypass: kill`` its
processes that have no shim mapped, and only those, are killed: real processes in mount namespaces of their
own, through ``NodeCore.priority_pass``; and that an honest container within its limit, one just over it
for a pass, or one whose every process maps the shim, loses nothing.

NVML's process list is the one stand-in (no GPU here): the test says which host pids NVML lists and the
memory it gives each, as NvmlBackend.busy() reads nvmlDeviceGetComputeRunningProcesses.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

from hamid.shimlimits.memguard import MEMORY_PASSES, SLACK_MIN_BYTES, MemoryGuard, MemUse

MiB, GiB = 1 << 20, 1 << 30
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces with bind mounts need root (CI is root)")


class Recorder:
    def __init__(self):
        self.killed: list = []

    def kill(self, key, pids):
        self.killed.append((key, tuple(pids)))
        return len(tuple(pids))


def test_over_its_limit_two_passes_running_its_processes_with_no_shim_are_killed():
    rec = Recorder()
    g = MemoryGuard(rec)
    over = MemUse(("c.limits", 0), GiB, GiB + SLACK_MIN_BYTES + 1, bare=(202,))
    g.run([over])
    assert rec.killed == [] and g.over_passes == 0, "one pass over is a reading between an allocation and its free"
    g.run([over])
    assert rec.killed == [(("c.limits", 0), (202,))] and g.kills == 1 and g.killed_last == [("c.limits", 0)]
    assert MEMORY_PASSES == 2


@pytest.mark.parametrize("use", [
    MemUse(("a", 0), GiB, GiB + SLACK_MIN_BYTES, bare=(1,)),  # within the slack: the shim's lag
    MemUse(("a", 0), GiB, 5 * GiB, bare=()),  # over, but every process maps the shim: counted only
    MemUse(("a", 0), 0, 5 * GiB, bare=(1,)),  # no memory limit
], ids=["within-slack", "all-shimmed", "no-limit"])
def test_what_is_never_killed(use):
    rec = Recorder()
    g = MemoryGuard(rec)
    for _ in range(5):
        g.run([use])
    assert rec.killed == []
    assert g.over_passes == (4 if use.limit_bytes and not use.bare and use.used_bytes > 2 * GiB else 0)


def test_report_counts_and_kills_nothing():
    g = MemoryGuard(None)
    for _ in range(3):
        g.run([MemUse(("a", 0), GiB, 3 * GiB, bare=(1,))])
    assert g.over_passes == 2 and g.kills == 0


def test_a_pass_under_again_starts_the_count_over():
    rec = Recorder()
    g = MemoryGuard(rec)
    for used in (3 * GiB, 100 * MiB, 3 * GiB, 100 * MiB):
        g.run([MemUse(("a", 0), GiB, used, bare=(1,))])
    assert rec.killed == []


@root_only
def test_the_daemon_kills_exactly_the_containers_process_with_no_shim(tmp_path):
    """The node service's pass (NodeCore.priority_pass): a container with a 1 GiB memory limit whose process maps no shim and holds
    3 GiB by NVML's count is killed within two passes; its neighbour, whose process maps the installed shim
    and also holds 3 GiB, is counted but lives; a third, within its limit, is untouched. /metrics counts
    both, and the kubelet face records a HamidMemoryKilled Event on the killed pod, once."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from nodeharness import MAPPER, admit_docker, installed_shims, limited_process, make_node

    from hamid.devices.types import BusyReading

    d = make_node(tmp_path / "s", regionTmpfs=False)
    installed = installed_shims(d, tmp_path / "s")
    procs = []
    try:
        lim, uuid = admit_docker(d, {"bare": "mem=1g", "shimmed": "mem=1g", "fine": "mem=1g"}, kind="pod")
        bare = limited_process(lim["bare"], ["sh", "-c", "echo ok; exec sleep 60"])
        shimmed = limited_process(lim["shimmed"], [sys.executable, "-c", MAPPER, str(installed[0])])
        fine = limited_process(lim["fine"], ["sh", "-c", "echo ok; exec sleep 60"])
        procs = [bare, shimmed, fine]
        mem = {bare.pid: 3 * GiB, shimmed.pid: 3 * GiB, fine.pid: 512 * MiB}
        d.core.backend.busy = lambda: {uuid: BusyReading(busy_pct=0.0, busy_pids=frozenset(), pids=frozenset(mem),
                                                         pid_busy={}, pid_mem=mem)}
        trio.run(d.service.priority_pass)  # as the daemon runs it: the node service's pass
        assert bare.poll() is None, "killed after one pass"
        trio.run(d.service.priority_pass)
        assert bare.wait(timeout=10) == -9
        assert shimmed.poll() is None and fine.poll() is None
        counts = d.core.live_counts()
        assert counts.memory_kills == 1 and counts.memory_over_passes >= 2
        from hamid.kubelet.face import KubeletFace

        face = KubeletFace(d.service, kubelet_dir=str(tmp_path / "kubelet"), resource="nvidia.com/gpu",
                           strategy="envvar", cdi_dir=str(tmp_path / "cdi"), defaults=None, api=None)
        events = []
        face.pods.event = lambda pod, reason, message, kind="Warning": events.append((pod, reason, message))
        face._killed_event("pod:bare")
        face._killed_event("pod:bare")  # told once
        ((pod, reason, message),) = events
        assert reason == "HamidMemoryKilled" and pod["metadata"]["name"] == "bare" and uuid in message, message
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        d.close()
