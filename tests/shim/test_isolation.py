"""Issue 37: no decision about one container from data another container can write.

Owns the proof, on real limits files (the writer's own) and the daemon's real live pass, that what a tenant
writes into its own region (charges of any size or shape, any pids) neither lowers a neighbour's share below
its limit by more than the band, nor puts any pid into a neighbour's hold list; that hold lists and the
"another container is active" signal come from the host's pid map (a process's mount namespace, as the kernel
reports it through /proc/<pid>/root); and that a region disagreeing with NVML is counted and not trusted.

The processes of the "containers" are real processes in mount namespaces of their own (unshare, root), each
seeing its container's limits file at the fixed path, as a container of the daemon does. NVML's process list
and busy samples are the one stand-in (no GPU here): the test says which host pids NVML reports, as the real
NvmlBackend.busy() would.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from hamid.devices.types import BusyReading
from hamid.shimlimits import ContainerLimits, DeviceLimits, write_limits_file
from hamid.node.layout import LIMITS_IN_CONTAINER
from hamid.shimlimits.codec import hold_pids_offset, max_hold, others_offset, share_offset
from hamid.shimlimits.hostpids import owners
from hamid.shimlimits.live import DISAGREE_PASSES, SHARE_BOUND, GpuReading, LivePass, Tenant

GPU = "GPU-11111111-2222-3333-4444-555555555555"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces with bind mounts need root (CI is root)")


def share_of(path) -> int:
    return struct.unpack_from("<I", Path(path).read_bytes(), share_offset(0))[0]


def others_of(path) -> int:
    return struct.unpack_from("<I", Path(path).read_bytes(), others_offset(0))[0]


def hold_of(path) -> list[int]:
    raw = Path(path).read_bytes()[hold_pids_offset(0):hold_pids_offset(0) + 4 * max_hold()]
    return [p for p in struct.unpack(f"<{max_hold()}i", raw) if p]


def limits_file(path: Path, sm: int = 30) -> Path:
    write_limits_file(path, ContainerLimits(devices=(DeviceLimits(GPU, sm_percent=sm),), region_path="/r"))
    return path


# ---- forged charges: the sharing correction and "others active" --------------------------------------------

def forged(kind: str, t: int) -> float:
    """The liar's charge over pass t (s of GPU time per s), whatever it really runs."""
    return {"zero": 0.0, "tiny": 0.03, "huge": 3.0, "oscillating": 0.02 if t % 2 else 0.95}[kind]


@pytest.mark.parametrize("kind", ["zero", "tiny", "huge", "oscillating", "backwards"])
def test_a_tenants_forged_charges_move_no_neighbours_limit_beyond_the_band(tmp_path, kind):
    """A victim held to 30 % (its shim honest: its charges are its GPU time times the factor its file says)
    beside a tenant that runs 60 % of the GPU without the shim and writes what it likes into its region. Over
    30 passes the victim's GPU time stays within 5 points of its limit, never over it (the factor within
    1 .. 1 + the bound); its file
    says another container is active (the liar's host pids are busy in NVML) whatever the liar's region says;
    and a region that disagrees with NVML (more than the device was busy, a count going back) is counted."""
    victim, liar = limits_file(tmp_path / "v.limits"), limits_file(tmp_path / "l.limits", sm=70)
    live = LivePass()
    charged = [0, 0]
    shares = []
    for t in range(1, 31):
        f = share_of(victim) / 1000 or 1.0
        true_v = 0.30 / f
        charged[0] += int(0.30e9)
        if kind == "backwards":
            charged[1] = max(0, charged[1] + int((0.5 if t % 3 else -2.0) * 1e9))
        else:
            charged[1] += int(forged(kind, t) * 1e9)
        busy = min(100.0, 100 * (true_v + 0.60))
        live.run(float(t), {GPU: (GpuReading(busy, frozenset({101, 202})),
                                  [Tenant(str(victim), 0, 1, (101,), charged[0]),
                                   Tenant(str(liar), 0, 1, (202,), charged[1], last_kernel_ns=None)])},
                 wall=1e9 + t)
        shares.append(100 * true_v)
    assert all(25 <= s <= 30 + 1e-9 for s in shares), shares
    assert 1.0 <= live.factor(GPU) <= 1 + SHARE_BOUND + 1e-9
    assert others_of(victim) == 1 and others_of(liar) == 1
    if kind == "huge":
        assert live.untrusted["over-busy"] >= 25
    if kind == "backwards":
        assert live.untrusted["went-back"] >= 5


def shared_passes(tmp_path, liar_charge: float, passes: int = 12) -> tuple[LivePass, list[float], Path]:
    """A victim held to 30 % (honest: it charges its GPU time times its file's factor) beside a tenant that
    runs 60 % of the GPU past its shim and charges ``liar_charge`` s a second; both always busy, so NVML reads
    each at the device's share and never the two apart. Returns the pass, the victim's GPU time per pass and
    the victim's file."""
    victim, liar = limits_file(tmp_path / "v.limits"), limits_file(tmp_path / "l.limits", sm=30)
    live = LivePass()
    charged, shares = [0, 0], []
    for t in range(1, passes + 1):
        true_v = 0.30 / (share_of(victim) / 1000 or 1.0)
        charged[0] += int(0.30e9)
        charged[1] += int(liar_charge * 1e9)
        live.run(float(t), {GPU: (GpuReading(100 * (true_v + 0.60), frozenset({101, 202}), {101: 90.0, 202: 90.0}),
                                  [Tenant(str(victim), 0, 1, (101,), charged[0], limit_pct=30),
                                   Tenant(str(liar), 0, 1, (202,), charged[1], limit_pct=30)])})
        shares.append(100 * true_v)
    return live, shares, victim


def test_a_gpu_whose_sharing_tenants_charge_far_less_than_it_ran_is_counted_unaccounted(tmp_path, capsys):
    """While they share, no region can be checked against NVML on its own, but their sum can: 0.33 s charged
    a second on a GPU 90 % busy. Counted per GPU (the sum cannot say whose), logged once, and the sharing
    correction is off there: the missing time is not charged to the honest victim (before, the factor went
    to its bound and the victim got 27.8 % at a 30 % limit)."""
    live, shares, victim = shared_passes(tmp_path, 0.03)
    from hamid.shimlimits.live import UNACCOUNTED_PASSES
    assert live.unaccounted[GPU] == 12 - UNACCOUNTED_PASSES
    assert capsys.readouterr().out.count("GPU time not accounted for") == 1
    assert live.factor(GPU) == 1.0 and share_of(victim) == 0
    assert all(s == pytest.approx(30.0) for s in shares), shares
    assert dict(live.untrusted) == {}, "no region is blamed: the sum cannot say whose"
    assert live.unaccounted_gpus() == [GPU] and not live.held()


def test_sharing_tenants_whose_charges_add_up_are_not_counted(tmp_path):
    """Honest shims sharing a GPU charged 0.79-1.1 of its busy time over three passes running (recorded):
    a liar that charges 0.45 s a second for its 0.6 (0.75 of the busy time in all) is not told from them."""
    live, _, _ = shared_passes(tmp_path, 0.45)
    assert dict(live.unaccounted) == {}


def test_unaccounted_gpus_are_in_metrics(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from hamid.shimregion import register_collector
    live, _, _ = shared_passes(tmp_path, 0.0 + 0.05)
    reg = CollectorRegistry()
    (tmp_path / "containers").mkdir()
    register_collector(reg, tmp_path / "containers", live=live.counts)
    got = {s.labels["device_uuid"]: s.value for fam in text_string_to_metric_families(generate_latest(reg).decode())
           for s in fam.samples if s.name == "hamid_vgpu_unaccounted_passes_total"}
    assert got == {GPU: float(live.unaccounted[GPU])} and got[GPU] > 0


def test_charges_with_no_process_on_the_gpu_are_not_trusted(tmp_path):
    """A region charging GPU time while none of its container's processes is on the GPU (NVML's process list
    mapped by the host) is a forgery: counted, and the pass learns nothing from it."""
    a, b = limits_file(tmp_path / "a.limits"), limits_file(tmp_path / "b.limits")
    live = LivePass()
    for t in range(1, 10):
        live.run(float(t), {GPU: (GpuReading(90.0, frozenset({101})),
                                  [Tenant(str(a), 0, 1, (101,), int(0.3e9 * t)),
                                   Tenant(str(b), 0, 1, (), int(0.05e9 * t))])})
    # counted from its DISAGREE_PASSES-th pass of charges on: passes 2..9 disagree
    assert live.untrusted["no-process"] == 8 - DISAGREE_PASSES + 1
    assert share_of(a) == 0 and live.factor(GPU) == 1.0


def test_others_active_follows_hamis_window(tmp_path):
    """Policy default's signal, HAMi's recent_kernel rule: a neighbour that launched kernels (its region's
    launch stamp, or its host pids busy in NVML, however rarely) within the window makes a container's file
    say 1; after the window with neither, 0. A stamp only ever says "active", never hides a busy process."""
    a, b = limits_file(tmp_path / "a.limits"), limits_file(tmp_path / "b.limits")
    live = LivePass()

    def at(t, busy=frozenset(), stamp=None):
        live.run(t, {GPU: (GpuReading(10.0, busy), [Tenant(str(a), 0, 1, (101,)),
                                                     Tenant(str(b), 0, 1, (202,), last_kernel_ns=stamp)])},
                 wall=1000.0 + t)
        return others_of(a), others_of(b)

    assert at(1.0) == (0, 0)  # nobody launched anything
    assert at(2.0, stamp=int((1000.0 + 1.5) * 1e9)) == (1, 0)  # b's stamp: a is limited, b is not
    assert at(11.0, stamp=int((1000.0 + 1.5) * 1e9)) == (1, 0)  # 9.5 s later: still within the window
    assert at(12.0, stamp=int((1000.0 + 1.5) * 1e9)) == (0, 0)  # 10.5 s: b is idle
    assert at(13.0, busy=frozenset({202}), stamp=None) == (1, 0)  # one busy NVML sample of b's pid, no stamp
    assert at(22.5) == (1, 0)
    assert at(23.5) == (0, 0)
    assert at(24.0, busy=frozenset({999})) == (1, 1)  # a busy process of nobody's: everyone limited


def test_hold_lists_never_name_a_containers_own_pids(tmp_path):
    """Even a caller that hands the pass one pid under two containers: a container's own pids are never in
    its hold list (the shim checks too)."""
    hi, lo = limits_file(tmp_path / "hi.limits"), limits_file(tmp_path / "lo.limits")
    LivePass().run(1.0, {GPU: (GpuReading(None), [Tenant(str(hi), 0, 0, (11, 22)), Tenant(str(lo), 0, 1, (22, 33))])})
    assert hold_of(lo) == [11] and hold_of(hi) == []


# ---- the host's pid map, through the daemon ---------------------------------------------------------------

def in_container(limits: Path) -> subprocess.Popen:
    """A process in a mount namespace of its own that sees ``limits`` at the fixed path, as a container of the
    daemon's does (a tmpfs over /usr/local keeps the host's tree untouched)."""
    top = "/" + LIMITS_IN_CONTAINER.strip("/").split("/")[0] + "/" + LIMITS_IN_CONTAINER.strip("/").split("/")[1]
    script = (f'mount -t tmpfs none {top} && mkdir -p "$(dirname {LIMITS_IN_CONTAINER})" && '
              f'touch {LIMITS_IN_CONTAINER} && mount --bind "$0" {LIMITS_IN_CONTAINER} && echo ok && exec sleep 60')
    p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(limits)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ok", p.stderr.read()
    return p


@root_only
def test_the_host_pid_map_reads_the_kernels_view_not_the_containers(tmp_path):
    a, b = limits_file(tmp_path / "a.limits"), limits_file(tmp_path / "b.limits")
    pa, pb = in_container(a), in_container(b)
    try:
        got = owners([pa.pid, pb.pid, os.getpid(), 1, 999_999_999], {"a": str(a), "b": str(b)}, LIMITS_IN_CONTAINER)
        assert got == {pa.pid: "a", pb.pid: "b", os.getpid(): None, 1: None, 999_999_999: None}
    finally:
        for p in (pa, pb):
            p.kill()
            p.wait()
    # a pid gone (and perhaps handed to another process) belongs to whoever holds it now: here, nobody
    assert owners([pa.pid], {"a": str(a)}, LIMITS_IN_CONTAINER) == {pa.pid: None}


@root_only
def test_a_forged_region_puts_no_pid_into_a_neighbours_hold_list(built, tmp_path):
    """NodeCore.priority_pass, two containers on one GPU (priority 0 and 1). The high one's region claims the
    low one's own process, pids 2..16, 4242 and 1,000 more; NVML reports the high one's real process, the low
    one's, and 1,000 processes of nobody's. The low one's hold list is exactly the high one's real pid; the
    high one's is empty; and once the high one's process is gone, nobody is listed."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from nodeharness import make_node

    from hamid.node import layout
    from hamid.node.identity import Owner
    from hamid.node.realize import slot_assignment, slot_name
    from hamid.request import parse_docker_env
    from shimharness import forged_region

    d = make_node(tmp_path / "s", regionTmpfs=False)
    procs = []
    try:
        got = {}
        for cid, prio in (("hi", 0), ("lo", 1)):
            req = parse_docker_env(["HAMI_VISIBLE_DEVICES=0", f"HAMI_VGPU_SPEC=mem=1g,cores=40,priority={prio}"], cid)
            got[cid] = d.core.admit(Owner("docker", cid), req).reservation
        state = tmp_path / "s"
        lim = {cid: Path(layout.limits_file(state, slot_name(got[cid], "main"))) for cid in got}
        uuid = slot_assignment(got["hi"], "main").devices[0].uuid
        hi_p, lo_p = in_container(lim["hi"]), in_container(lim["lo"])
        procs += [hi_p, lo_p]
        strangers = frozenset(range(3_000_000, 3_001_000))  # no such processes: nobody's

        # the high one's region, forged
        claimed = [lo_p.pid, *range(2, 17), 4242, *range(5000, 5000 + 1000)]
        region = Path(layout.region_dir(state, slot_name(got["hi"], "main"))) / "vgpu.cache"
        region.write_bytes(forged_region(claimed))

        reading = {"now": BusyReading(busy_pct=50.0, busy_pids=frozenset({hi_p.pid}),
                                      pids=frozenset({hi_p.pid, lo_p.pid}) | strangers)}
        d.core.backend.busy = lambda: {uuid: reading["now"]}  # NVML's view (the stand-in)
        d.core.priority_pass()
        assert hold_of(lim["lo"]) == [hi_p.pid] and hold_of(lim["hi"]) == []
        hi_p.kill()
        hi_p.wait()
        reading["now"] = BusyReading(busy_pct=50.0, busy_pids=frozenset(), pids=frozenset({hi_p.pid, lo_p.pid}))
        d.core.priority_pass()
        assert hold_of(lim["lo"]) == [] and hold_of(lim["hi"]) == []
    finally:
        for p in procs:
            p.kill()
            p.wait()
        d.close()


def test_untrusted_regions_are_counted_in_metrics(tmp_path):
    """The live pass's count of regions it did not trust, by reason, as /metrics serves it (the daemon
    registers the region collector with NodeCore.live_counts)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from hamid.shimregion import register_collector
    a, b = limits_file(tmp_path / "a.limits"), limits_file(tmp_path / "b.limits")
    live = LivePass()
    for t in range(1, 7):  # b charges three times the interval: more than the device was busy (passes 2..6)
        live.run(float(t), {GPU: (GpuReading(50.0, frozenset({101, 202})),
                                  [Tenant(str(a), 0, 1, (101,), int(0.3e9 * t)),
                                   Tenant(str(b), 0, 1, (202,), int(3e9 * t))])})
    reg = CollectorRegistry()
    (tmp_path / "containers").mkdir()
    register_collector(reg, tmp_path / "containers", live=live.counts)
    got = {s.labels["reason"]: s.value for fam in text_string_to_metric_families(generate_latest(reg).decode())
           for s in fam.samples if s.name == "hamid_vgpu_region_untrusted_total"}
    assert got == {"over-busy": float(5 - DISAGREE_PASSES + 1)}


def test_an_honest_tenants_passing_disagreements_are_not_counted_but_not_learned_from(tmp_path):
    """What an honest shim's region shows at its transitions is no forgery: a container whose process left the
    GPU during the pass was charged for its last kernels before it left (the H100 run of 2026-12-07 counted 27
    such passes in 24 runs), and a queue launched in one pass runs on the GPU in the next, so a pass or two can
    charge more than the device was busy (14 there). Neither is counted nor logged; the pass that saw it
    learns nothing from it. The same disagreement DISAGREE_PASSES passes running is counted."""
    a, b = limits_file(tmp_path / "a.limits"), limits_file(tmp_path / "b.limits")
    live = LivePass()
    ca, cb = 0, 0
    # a and b share the GPU, honest; from pass 4 to 5, b's queue launched ahead charges 1.2 s a pass at 80 % busy
    for t in range(1, 9):
        ca += int(0.3e9)
        cb += int(1.2e9) if t in (4, 5) else int(0.4e9)
        before = live.factor(GPU)
        live.run(float(t), {GPU: (GpuReading(80.0, frozenset({101, 202})),
                                  [Tenant(str(a), 0, 1, (101,), ca), Tenant(str(b), 0, 1, (202,), cb)])})
        if t in (4, 5):
            assert live.factor(GPU) == before, "a pass whose charges disagree with NVML must not learn"
    # b's process leaves the GPU: the next pass still reads its last charges, with no process of it listed
    cb += int(0.3e9)
    live.run(9.0, {GPU: (GpuReading(60.0, frozenset({101})),
                         [Tenant(str(a), 0, 1, (101,), ca + int(0.3e9)), Tenant(str(b), 0, 1, (), cb)])})
    live.run(10.0, {GPU: (GpuReading(30.0, frozenset({101})),
                          [Tenant(str(a), 0, 1, (101,), ca + int(0.6e9)), Tenant(str(b), 0, 1, (), cb)])})
    assert dict(live.untrusted) == {}
    # the same over-charge kept up is a forgery: counted once it has lasted DISAGREE_PASSES passes
    for t in range(11, 11 + DISAGREE_PASSES):
        cb += int(1.2e9)
        live.run(float(t), {GPU: (GpuReading(80.0, frozenset({101, 202})),
                                  [Tenant(str(a), 0, 1, (101,), ca + int(0.3e9) * (t - 8)),
                                   Tenant(str(b), 0, 1, (202,), cb)])})
    assert dict(live.untrusted) == {"over-busy": 1}


def in_root(root: Path) -> subprocess.Popen:
    """A process whose root is ``root`` (chroot, as a container's is its image), once it is there."""
    p = subprocess.Popen([sys.executable, "-c", "import os, sys, time; os.chroot(sys.argv[1]); "
                          "print('ok', flush=True); time.sleep(60)", str(root)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ok", p.stderr.read()
    return p


@root_only
def test_a_symlink_at_the_fixed_path_does_not_make_a_process_a_neighbours(tmp_path):
    """A container's root may rename its limits file's directory away (a parent of a bind mount can be renamed)
    and put at the fixed path a symlink naming a neighbour's limits file on the host. The kernel resolves an
    absolute target in the root of whoever looks, so a lookup through /proc/<pid>/root that follows it lands
    on the neighbour's file and counts the process as the neighbour's (into the hold lists of whoever ranks
    below the neighbour). Resolved in the container's own root, it names nothing there: nobody's."""
    a, b = limits_file(tmp_path / "a.limits"), limits_file(tmp_path / "b.limits")
    root = tmp_path / "liar"
    at = root / LIMITS_IN_CONTAINER.lstrip("/")
    at.parent.mkdir(parents=True)
    at.symlink_to(b)  # the neighbour's file as the host names it
    liar = in_root(root)
    pb = in_container(b)
    try:
        got = owners([liar.pid, pb.pid], {"a": str(a), "b": str(b)}, LIMITS_IN_CONTAINER)
        assert got == {liar.pid: None, pb.pid: "b"}
    finally:
        for p in (liar, pb):
            p.kill()
            p.wait()


@root_only
def test_a_container_whose_image_links_the_limits_files_directory_is_still_its_own(tmp_path):
    """An image may have the limits file's directory behind symlinks (here /usr/local/vgpu -> /opt/real, and
    /opt/real -> ../srv/../srv/real, relative): the runtime mounts the file where the links lead, and the lookup
    follows them inside the container's root, as the container itself sees the path."""
    a = limits_file(tmp_path / "a.limits")
    root = tmp_path / "image"
    at = root / LIMITS_IN_CONTAINER.lstrip("/")
    at.parent.parent.mkdir(parents=True)
    at.parent.symlink_to("/opt/real")
    (root / "opt").mkdir()
    (root / "opt" / "real").symlink_to("../srv/../srv/real")
    (root / "srv" / "real").mkdir(parents=True)
    os.link(a, root / "srv" / "real" / at.name)  # the same inode, as the runtime's bind mount shows it
    p = in_root(root)
    try:
        assert owners([p.pid], {"a": str(a)}, LIMITS_IN_CONTAINER) == {p.pid: "a"}
    finally:
        p.kill()
        p.wait()


def test_a_daemon_outside_the_hosts_pid_namespace_says_so_once(tmp_path, capsys):
    """NVML reports host pids; a daemon that cannot see them in its /proc (no hostPID) maps no process to a
    container and its hold lists stay empty: it says so once, with the fix, not on a single exited pid."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from nodeharness import make_node

    from hamid.node.identity import Owner
    from hamid.node.realize import slot_assignment
    from hamid.request import parse_docker_env

    d = make_node(tmp_path / "s", regionTmpfs=False)
    try:
        req = parse_docker_env(["HAMI_VISIBLE_DEVICES=0", "HAMI_VGPU_SPEC=mem=1g,cores=40,priority=1"], "lo")
        res = d.core.admit(Owner("docker", "lo"), req).reservation
        uuid = slot_assignment(res, "main").devices[0].uuid
        unseen = frozenset(range(3_000_000, 3_000_004))  # beyond any pid_max this kernel hands out: not in /proc
        mixed = unseen | {os.getpid()}
        reading = {"now": BusyReading(busy_pct=50.0, busy_pids=frozenset(), pids=mixed)}
        d.core.backend.busy = lambda: {uuid: reading["now"]}
        for _ in range(5):  # one pid of ours is seen: nothing to say
            d.core.priority_pass()
        assert "pid namespace" not in capsys.readouterr().out
        reading["now"] = BusyReading(busy_pct=50.0, busy_pids=frozenset(), pids=unseen)
        for _ in range(6):
            d.core.priority_pass()
        out = capsys.readouterr().out
        assert out.count("not in this daemon's pid namespace") == 1, out[-2000:]
        assert "hostPID" in out
    finally:
        d.close()


@pytest.mark.parametrize("region", ["none", "frozen"])
def test_a_limited_container_busy_on_the_gpu_with_no_charges_is_counted(tmp_path, region):
    """A container with a compute limit whose processes NVML shows busy while its region charges nothing runs
    without its limit: no shim at all (a static binary, its own driver calls: no region) or a region it froze
    (writing its charge back each time). The pass does not learn from it (its busy time would read as every
    neighbour's under-charge and lower their limits) and, three passes running, counts it ("uncharged") and
    says which container. One without a compute limit (its shim charges nothing) is not counted."""
    a, b = limits_file(tmp_path / "a.limits"), limits_file(tmp_path / "b.limits")
    free = limits_file(tmp_path / "free.limits", sm=0)
    live = LivePass()
    for t in range(1, 10):
        live.run(float(t), {GPU: (GpuReading(95.0, frozenset({101, 202, 303})),
                                  [Tenant(str(a), 0, 1, (101,), int(0.3e9 * t)),
                                   Tenant(str(b), 0, 1, (202,), None if region == "none" else int(5e9)),
                                   Tenant(str(free), 0, 1, (303,), None, charged=False)])})
    # passes 1..9 ("none": every pass; "frozen": from pass 2, the first with an interval)
    disagreeing = 9 if region == "none" else 8
    assert dict(live.untrusted) == {"uncharged": disagreeing - DISAGREE_PASSES + 1}
    assert live.factor(GPU) == 1.0


def test_a_limited_container_that_stops_launching_is_not_counted_uncharged(tmp_path):
    """NVML's busy samples trail a process's last kernels by up to a sample period: a container that stopped
    launching can show busy for a pass with nothing charged. Not counted."""
    a, b = limits_file(tmp_path / "a.limits"), limits_file(tmp_path / "b.limits")
    live = LivePass()
    cb = 0
    for t in range(1, 12):
        cb += int(0.4e9) if t % 4 else 0  # every fourth pass b charged nothing while NVML still saw it busy
        live.run(float(t), {GPU: (GpuReading(80.0, frozenset({101, 202})),
                                  [Tenant(str(a), 0, 1, (101,), int(0.3e9 * t)), Tenant(str(b), 0, 1, (202,), cb)])})
    assert dict(live.untrusted) == {}
