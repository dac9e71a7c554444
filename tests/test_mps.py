"""MPS mode (issue 27) without a GPU: asking for it, placing it, and the daemon owning MPS.

Owns the proof that: ``mode=mps`` / ``nvidia.com/vgpu-mode: mps`` parse into an MPS request and a
multi-GPU MPS request is refused with the reason; a GPU serves the share modes its node's
``operatingMode`` or ``deviceModes`` say, one mode at a time, and a refusal names the setting to
change; ``status`` and ``plan`` show the mode; a GPU's MPS control daemon (the stand-in
``tests/standins/nvidia-cuda-mps-control``, which keeps NVIDIA's command protocol) is started with
its first MPS tenant, shared by the next, stopped after the last, adopted (same process) by a new
node core on the same state directory, stopped when it has no tenants; a dead or wedged daemon is
found, its tenants' reservations are kept and marked failed with the reason, and it is restarted;
an MPS container's edits carry the pipe directory and its limits file marks the share as MPS.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from hamid.cli.render import status_table
from hamid.node import mps
from hamid.node.identity import Owner
from hamid.placement import place
from hamid.request import parse_docker_env, parse_pod
from hamid.request.model import RequestError
from hamid.shimlimits import decode
from nodeharness import make_node

STANDIN = str(Path(__file__).parent / "standins" / "nvidia-cuda-mps-control")


def env(spec: str, devices: str | None = None) -> list[str]:
    out = [f"HAMI_VGPU_SPEC={spec}"]
    if devices is not None:
        out.append(f"HAMI_VISIBLE_DEVICES={devices}")
    return out


def pod(mode: str | None, gpus: int = 1, cores: int = 30, mem: int = 4096) -> dict:
    ann = {"nvidia.com/vgpu-mode": mode} if mode else {}
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "annotations": ann},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {
                "nvidia.com/gpu": gpus, "nvidia.com/gpumem": mem, "nvidia.com/gpucores": cores}}}]}}


# ---- asking for it -----------------------------------------------------------------------------

def test_mode_mps_parses_from_docker_and_pods():
    g = parse_docker_env(env("mode=mps,mem=4g,cores=30"), "c1").containers[0].gpu
    assert (g.mode, g.mem_mib, g.cores, g.count, g.wants_mps) == ("mps", 4096, 30, 1, True)
    g = parse_pod(pod("mps")).containers[0].gpu
    assert (g.mode, g.mem_mib, g.cores) == ("mps", 4096, 30)


@pytest.mark.parametrize("make,needle", [
    (lambda: parse_docker_env(env("mode=mps,gpus=2"), "c"), "mode=mps takes one GPU"),
    (lambda: parse_docker_env(env("mode=mps", "0,1"), "c"), "mode=mps takes one GPU"),
    (lambda: parse_docker_env(env("mode=mps", "all"), "c"), "every GPU"),
    (lambda: parse_docker_env(env("mode=mps,1g.10gb"), "c"), "needs mode=mig, not mps"),
    (lambda: parse_docker_env(env("mode=shared"), "c"), "hami-core, mig, mps"),
    (lambda: parse_pod(pod("mps", gpus=2)), "mps takes one GPU per container"),
    (lambda: parse_pod(pod("mpss")), "accepted: hami-core, mig, mps"),
])
def test_bad_mps_requests_are_refused_with_the_reason(make, needle):
    with pytest.raises(RequestError) as e:
        make()
    assert needle in str(e.value)


# ---- which GPUs serve it, one mode at a time -----------------------------------------------------------

@pytest.fixture
def short_tmp():
    """A short state directory: the control socket's path must fit a unix socket (107 bytes)."""
    d = tempfile.mkdtemp(prefix="mps", dir="/tmp")
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def node_of(short_tmp):
    made = []

    def make(simulate: str = "H100:2", **settings):
        d = make_node(short_tmp / f"s{len(made)}", simulate, mpsControl=STANDIN, **settings)
        made.append(d)
        return d

    yield make
    for d in made:
        ctl = mps.MpsControl(STANDIN, str(d.state_dir), root=d.core.facts.mps_dir)
        for uuid in ctl.gpus():  # none left running, whatever the test did
            ctl.stop(uuid)
        with contextlib.suppress(OSError):  # a test may have closed it already
            d.close()


def test_a_hami_core_node_refuses_mps_and_names_the_setting(node_of):
    d = node_of()
    got = place(parse_docker_env(env("mode=mps,mem=4g,cores=30"), "c"), [d.ledger.view()])
    msg = got.message()
    assert "does not serve mps (it serves hami-core)" in msg
    assert "operatingMode (node) or deviceModes (per GPU)" in msg and "to mps or any" in msg


def test_device_modes_pick_the_gpus_that_serve_mps(node_of):
    d = node_of(deviceModes={"1": "mps"})
    view = d.ledger.view()
    assert [g.serves for g in view.gpus] == [("hami-core",), ("mps",)]
    got = place(parse_docker_env(env("mode=mps,mem=4g,cores=30"), "c"), [view])
    dev = got.containers[0].devices[0]
    assert (dev.index, dev.mps, dev.cores) == (1, True, 30)
    got = place(parse_docker_env(env("mode=hami-core,mem=4g,cores=30"), "c"), [view])
    assert got.containers[0].devices[0].index == 0 and not got.containers[0].devices[0].mps


def test_a_gpu_serving_any_mode_keeps_one_mode_at_a_time(node_of):
    d = node_of(operatingMode="any", simulate="H100:1")
    d.core.admit(Owner("docker", "a"), parse_docker_env(env("mode=mps,mem=4g,cores=30"), "a"))
    view = d.ledger.view()
    assert view.gpus[0].share_mode == "mps" and view.gpus[0].mps_used == 1
    refused = place(parse_docker_env(env("mode=hami-core,mem=4g,cores=30"), "b"), [view])
    assert "has 1 MPS tenant(s); a hami-core share needs a GPU without them" in refused.message()
    # a request naming no mode follows the GPU's current tenants
    follows = place(parse_docker_env(env("mem=4g,cores=30"), "b"), [view])
    assert follows.containers[0].devices[0].mps
    doc = d.core.status("test")
    assert doc["gpus"][0]["serves"] == ["hami-core", "mps"] and doc["gpus"][0]["mps_shares"] == 1
    from hamid.metrics.exporter import LedgerCollector

    fams = {m.name: m for m in LedgerCollector(d.ledger, lambda: "test").collect()}
    assert [s.value for s in fams["hamid_gpu_mps_shares"].samples] == [1]
    table = status_table(doc)
    assert "hami-core|mps [mps]" in table and "mps: 4096 MiB pinned, 30% threads" in table


def test_plan_shows_the_mode(tmp_path):
    from hamid.cluster.plan import load_cluster, plan, render

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("nodes:\n  - name: n1\n    gpus: H100:1\n    config: {operatingMode: mps}\n")
    items = tmp_path / "items.yaml"
    items.write_text("kind: Docker\nname: a\nenv: {HAMI_VGPU_SPEC: 'mem=4g,cores=30'}\n")
    import yaml

    out = render(plan(load_cluster(cluster), list(yaml.safe_load_all(items.read_text()))))
    assert "MPS 4096 MiB pinned, 30% threads" in out, out


# ---- the daemon owns MPS ------------------------------------------------------------------------

def daemon_pids(d, uuid):
    return mps.MpsControl(STANDIN, str(d.state_dir)).daemon_pids(uuid)


def test_lifecycle_start_on_first_share_next_stop_after_last(node_of):
    d = node_of(operatingMode="mps", simulate="H100:1")
    uuid = d.ledger.view().gpus[0].uuid
    assert daemon_pids(d, uuid) == []
    a = d.core.admit(Owner("docker", "a"), parse_docker_env(env("mem=4g,cores=30"), "a"))
    first = daemon_pids(d, uuid)
    assert len(first) == 1
    ctl = mps.MpsControl(STANDIN, str(d.state_dir))
    assert ctl.server_list(uuid) == []  # it answers; no client has connected yet
    e = a.edits["main"]
    pipe = mps.pipe_dir(d.state_dir, uuid)
    assert any(m.host_path == pipe and m.container_path == "/run/hamid-mps" for m in e.mounts)
    envs = dict(x.split("=", 1) for x in e.env)
    assert envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/hamid-mps"
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30" and "CUDA_DEVICE_SM_LIMIT" not in envs
    lim = decode(Path(d.state_dir, "limits", "a").read_bytes())
    assert lim.mps and lim.devices[0].sm_percent == 30 and lim.devices[0].memory_bytes == 4096 << 20
    assert lim.devices[0].slots == ()  # no time slices under MPS
    d.core.admit(Owner("docker", "b"), parse_docker_env(env("mem=4g,cores=70"), "b"))
    assert daemon_pids(d, uuid) == first  # one daemon per GPU, shared
    d.core.release("docker:a")
    assert daemon_pids(d, uuid) == first
    d.core.release("docker:b")
    assert daemon_pids(d, uuid) == []
    assert os.path.isdir(pipe) and not os.path.exists(os.path.join(pipe, "control"))


def test_a_new_node_core_adopts_the_running_daemon_and_stops_an_orphan(node_of, tmp_path):
    d = node_of(operatingMode="mps", simulate="H100:2")
    u0, u1 = (g.uuid for g in d.ledger.view().gpus)
    d.core.admit(Owner("docker", "a"), parse_docker_env(env("mem=4g,cores=30", "0"), "a"))
    pid = daemon_pids(d, u0)
    ctl = mps.MpsControl(STANDIN, str(d.state_dir))
    ctl.start(u1)  # a daemon whose last tenant left while hamid was down
    d.close()
    again = make_node(d.state_dir, "H100:2", mode="mps", mpsControl=STANDIN)  # hamid restarted
    try:
        assert again.core.mps_check() == []
        assert daemon_pids(again, u0) == pid  # adopted, not restarted
        assert daemon_pids(again, u1) == []  # no tenants: stopped
    finally:
        again.core.release("docker:a")
        again.close()
    assert daemon_pids(again, u0) == []


@pytest.mark.parametrize("fault", ["dead", "wedged"])
def test_a_failed_daemon_marks_its_tenants_and_is_restarted(node_of, monkeypatch, fault):
    # shorter than the product's 5 s, for a quicker test, yet long enough for the stand-in (a Python program)
    # to answer on a busy machine: 1 s took a healthy daemon for a wedged one under load
    monkeypatch.setattr(mps, "COMMAND_TIMEOUT_S", 3.0)
    d = node_of(operatingMode="mps", simulate="H100:1")
    uuid = d.ledger.view().gpus[0].uuid
    for who in ("a", "b"):
        d.core.admit(Owner("docker", who), parse_docker_env(env("mem=4g,cores=40"), who))
    old, = daemon_pids(d, uuid)
    os.kill(old, signal.SIGKILL if fault == "dead" else signal.SIGSTOP)
    if fault == "dead":
        deadline = time.monotonic() + 5
        while daemon_pids(d, uuid) and time.monotonic() < deadline:
            time.sleep(0.02)
    got = d.core.mps_check()
    assert [(f["gpu"], sorted(f["owners"])) for f in got] == [(uuid, ["docker:a", "docker:b"])]
    assert ("not running" if fault == "dead" else "wedged") in got[0]["reason"]
    new = daemon_pids(d, uuid)
    assert len(new) == 1 and new != [old]
    assert mps.MpsControl(STANDIN, str(d.state_dir)).server_list(uuid) == []  # the new one answers
    for who in ("a", "b"):
        r = d.ledger.get(f"docker:{who}")
        assert r is not None and r.state == "allocated"  # no reservation lost
        assert r.details.mps_failure["reason"] == got[0]["reason"]
    assert d.core.mps_check() == []  # healthy again
    assert "(MPS daemon failed, restarted)" in status_table(d.core.status("test"))


def server_pids(d, uuid):
    return mps.MpsControl(STANDIN, str(d.state_dir)).server_list(uuid)


def start_server(ctl, uuid) -> int:
    """A server, as a client's first connection starts one; returned once it has started (it logs so)."""
    pid = int(ctl.command(uuid, "start_server -uid 0"))
    log = Path(ctl.logs(uuid), "server.log")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if log.exists() and f"Server {pid:>5}] Server has started" in log.read_text():
            return pid
        time.sleep(0.02)
    raise AssertionError(f"server {pid} did not start")


def test_a_client_fault_the_server_logs_marks_the_gpus_tenants_once_and_restarts_nothing(node_of, short_tmp):
    """A client's fatal GPU fault fails every client of the server (measured on an H200) while the
    daemon answers: hamid reads it from the server's log, marks each tenant (kept, not released),
    tells them once, restarts nothing, and a restarted hamid does not tell them again."""
    d = node_of(operatingMode="mps", simulate="H100:1")
    uuid = d.ledger.view().gpus[0].uuid
    ctl = mps.MpsControl(STANDIN, str(d.state_dir))
    for who in ("a", "b"):
        d.core.admit(Owner("docker", who), parse_docker_env(env("mem=4g,cores=40"), who))
    daemon = daemon_pids(d, uuid)
    server = start_server(ctl, uuid)  # as the first client's connection would
    os.kill(server, signal.SIGUSR1)  # the stand-in server logs what the real one logged for a client's fault
    deadline = time.monotonic() + 5
    got = []
    while not got and time.monotonic() < deadline:
        got = d.core.mps_check()
        time.sleep(0.05)
    assert [(f["gpu"], f["kind"], sorted(f["owners"])) for f in got] == [(uuid, "client_fault", ["docker:a", "docker:b"])]
    assert "fatal GPU fault" in got[0]["reason"] and "every client of that server" in got[0]["reason"]
    assert daemon_pids(d, uuid) == daemon and server_pids(d, uuid) == [server]  # nothing restarted
    for who in ("a", "b"):
        r = d.ledger.get(f"docker:{who}")
        assert r is not None and r.state == "allocated" and r.details.mps_failure["kind"] == "client_fault"
    assert d.core.mps_check() == []  # told once
    assert "(MPS client fault)" in status_table(d.core.status("test"))
    d.close()
    again = make_node(d.state_dir, "H100:1", mode="mps", mpsControl=STANDIN)  # hamid restarted
    try:
        assert again.core.mps_check() == []  # the log was read up to there: not told again
        os.kill(server, signal.SIGUSR1)
        deadline = time.monotonic() + 5
        got = []
        while not got and time.monotonic() < deadline:
            got = again.core.mps_check()
            time.sleep(0.05)
        assert [f["kind"] for f in got] == ["client_fault"]  # a new fault is
    finally:
        for who in ("a", "b"):
            again.core.release(f"docker:{who}")
        again.close()


def test_a_server_silent_in_two_checks_in_a_row_is_killed_and_its_tenants_marked(node_of, monkeypatch):
    """Measured on an H200: a stopped MPS server leaves ``get_server_status`` unanswered while the
    daemon answers the rest. Silent once is a warning; silent in two
    checks in a row, the server (never a client) is killed, the tenants marked, the daemon kept."""
    # shorter than the product's 5 s, for a quicker test, yet long enough for the stand-in (a Python program)
    # to answer on a busy machine: 1 s took a healthy daemon for a wedged one under load
    monkeypatch.setattr(mps, "COMMAND_TIMEOUT_S", 3.0)
    d = node_of(operatingMode="mps", simulate="H100:1")
    uuid = d.ledger.view().gpus[0].uuid
    ctl = mps.MpsControl(STANDIN, str(d.state_dir))
    for who in ("a", "b"):
        d.core.admit(Owner("docker", who), parse_docker_env(env("mem=4g,cores=40"), who))
    daemon = daemon_pids(d, uuid)
    server = start_server(ctl, uuid)
    try:
        os.kill(server, signal.SIGSTOP)
        assert d.core.mps_check() == []  # silent once: maybe busy
        os.kill(server, signal.SIGCONT)
        assert d.core.mps_check() == []  # it answered again: forgiven
        assert mps._live(str(server))
        os.kill(server, signal.SIGSTOP)
        assert d.core.mps_check() == []
        got = d.core.mps_check()
        assert [(f["kind"], sorted(f["owners"])) for f in got] == [("server_wedged", ["docker:a", "docker:b"])]
        assert f"MPS server {server} gave no status in two checks in a row" in got[0]["reason"]
        deadline = time.monotonic() + 5
        while mps._live(str(server)) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not mps._live(str(server))  # killed
        assert daemon_pids(d, uuid) == daemon  # the daemon is kept
        for who in ("a", "b"):
            r = d.ledger.get(f"docker:{who}")
            assert r.state == "allocated" and r.details.mps_failure["kind"] == "server_wedged"
        assert "(MPS server wedged, killed)" in status_table(d.core.status("test"))
        assert d.core.mps_check() == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)


def test_kill_server_kills_only_a_listed_mps_server(node_of):
    d = node_of(operatingMode="mps", simulate="H100:1")
    uuid = d.ledger.view().gpus[0].uuid
    d.core.admit(Owner("docker", "a"), parse_docker_env(env("mem=4g,cores=40"), "a"))
    ctl = mps.MpsControl(STANDIN, str(d.state_dir))
    other = subprocess.Popen(["sleep", "30"])
    try:
        assert not ctl.kill_server(uuid, other.pid)  # not a server the daemon lists
        assert other.poll() is None
    finally:
        other.kill()
        other.wait()


def test_the_server_log_is_read_once_in_whole_lines_and_a_new_file_from_its_start(short_tmp):
    ctl = mps.MpsControl(STANDIN, str(short_tmp))
    uuid = "GPU-4f1c3e2a-0000-0000-0000-000000000001"
    mps.ensure_dirs(str(short_tmp), uuid)
    log = Path(ctl.logs(uuid), "server.log")
    bad = f"[2026-11-26 06:00:00.000 Server  4242] client {mps.FAULT_MARKS[0]} one"
    log.write_text(bad + "\n")
    assert ctl.client_faults(uuid) == []  # never read before: history
    with log.open("a") as f:
        f.write("[2026-11-26 06:00:01.000 Server  4242] Client process 7 disconnected\n" + bad[:30])
    assert ctl.client_faults(uuid) == []  # a line being written waits for its end
    with log.open("a") as f:
        f.write(bad[30:] + "\n")
    assert ctl.client_faults(uuid) == [bad]
    assert ctl.client_faults(uuid) == []
    log.unlink()  # a new file (the daemon's log rotated away): read from its start
    log.write_text(bad.replace("one", "two") + "\n")
    assert ctl.client_faults(uuid) == [bad.replace("one", "two")]


def test_faults_logged_before_a_daemon_started_are_not_its_tenants(node_of):
    d = node_of(operatingMode="mps", simulate="H100:1")
    uuid = d.ledger.view().gpus[0].uuid
    ctl = mps.MpsControl(STANDIN, str(d.state_dir))
    d.core.admit(Owner("docker", "a"), parse_docker_env(env("mem=4g,cores=40"), "a"))
    server = start_server(ctl, uuid)
    os.kill(server, signal.SIGUSR1)
    time.sleep(0.3)
    d.core.release("docker:a")  # the daemon stops; its log stays
    d.core.admit(Owner("docker", "b"), parse_docker_env(env("mem=4g,cores=40"), "b"))  # a new daemon
    assert d.core.mps_check() == []
    assert not d.ledger.get("docker:b").details.mps_failure


@pytest.mark.parametrize("missing", ["control", "server"])
def test_a_node_without_the_mps_programs_refuses_mps_at_placement_and_says_what_to_install(tmp_path, missing):
    """The programs come with the driver, not the image: a node without them says so in its view
    (so no scheduler places an MPS share there), in the refusal, in ``status``, and admits nothing."""
    from hamid.errors import HamidError
    from hamid.placement.view import gpu_view_from_dict, gpu_view_to_dict

    if missing == "control":
        control = "/nonexistent/nvidia-cuda-mps-control"
    else:  # the control program without its server beside it (and none on PATH)
        (tmp_path / "bin").mkdir()
        control = str(tmp_path / "bin" / "nvidia-cuda-mps-control")
        shutil.copy(STANDIN, control)
    d = make_node(tmp_path / "s", "H100:2", mode="mps", mpsControl=control, deviceModes={"1": "any"})
    try:
        g0, g1 = d.ledger.view().gpus
        assert g0.mps_missing and g1.mps_missing
        assert gpu_view_from_dict(gpu_view_to_dict(g0)).mps_missing  # what peers and the leader see
        got = place(parse_docker_env(env("mode=mps,mem=4g,cores=30"), "a"), [d.ledger.view()])
        msg = got.message()
        assert "GPU 0 is set to serve mps but its node cannot run MPS" in msg, msg
        assert "nvidia.driverCapabilities" in msg and "utility,compute" in msg and "nvidia-cuda-mps-server" in msg
        with pytest.raises(HamidError) as e:
            d.core.admit(Owner("docker", "a"), parse_docker_env(env("mode=mps,mem=4g,cores=30"), "a"))
        assert "is set to serve mps but its node cannot run MPS" in str(e.value), str(e.value)
        assert d.ledger.get("docker:a") is None  # nothing booked
        # a GPU that also serves hami-core takes a request that names no mode in hami-core
        plain = d.core.admit(Owner("docker", "b"), parse_docker_env(env("mem=4g,cores=30"), "b"))
        dev = plain.reservation.decision.containers[0].devices[0]
        assert (dev.index, dev.mps) == (1, False)
        doc = d.core.status("test")
        why = ("nvidia-cuda-mps-control" if missing == "control" else "nvidia-cuda-mps-server") + " not found"
        assert why in doc["mps_missing"], doc["mps_missing"]
        table = status_table(doc)
        assert "NO-MPS-PROGRAMS" in table and "MPS shares refused here: " in table and why in table, table
    finally:
        d.close()


def test_kube_scheduler_hears_that_a_node_lacks_the_mps_programs(tmp_path):
    from hamid.scheduling.fitsummary import summarize

    d = make_node(tmp_path / "s", "H100:1", mode="mps", mpsControl="/nonexistent/nvidia-cuda-mps-control")
    try:
        got = place(parse_pod(pod("mps")), [d.ledger.view()])
        msg = summarize({"n": list(got.reasons[d.ledger.view().name])}, 1)
        assert "GPU mode (mps: the node lacks NVIDIA's MPS programs, nvidia-cuda-mps-control)" in msg, msg
    finally:
        d.close()


def answering(ctl, uuid) -> bool:
    """One daemon process that answers: not the moment of ``-d`` forking, when the
    starting process and the daemon are both there."""
    try:
        return len(ctl.daemon_pids(uuid)) == 1 and ctl.running(uuid)
    except mps.MpsError:
        return False


def test_the_daemon_restarts_a_killed_mps_daemon_and_a_restarted_hamid_adopts_it(short_tmp, free_port):
    """``hamid run`` end to end: its health loop finds the control daemon killed, keeps the
    reservation (marked), restarts it; hamid stopped and started again adopts the new one."""
    from hamid.localapi.client import LocalClient
    from test_daemon import start, stop

    state = short_tmp / "st"
    cfg = short_tmp / "hamid.yaml"
    cfg.write_text(f"operatingMode: mps\nmpsControl: {STANDIN}\nmpsCheckInterval: 0.2\nsimulate: H100:1\n")
    p = start(state, free_port, "--config", str(cfg))
    ctl = mps.MpsControl(STANDIN, str(state))
    try:
        req = parse_docker_env(env("mem=4g,cores=30"), "c1")
        with LocalClient(state) as c:
            res = c.reserve(req.to_dict(), "docker")
        uuid = res["decision"]["containers"][0]["devices"][0]["uuid"]
        first, = ctl.daemon_pids(uuid)
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 10
        marked = None
        while time.monotonic() < deadline:
            with LocalClient(state) as c:
                marked = next(r for r in c.reservations() if r["owner"] == "docker:c1")["details"].get("mps_failure")
            if marked and answering(ctl, uuid):
                break
            time.sleep(0.1)
        assert marked and ("not running" in marked["reason"] or "does not answer" in marked["reason"]), marked
        second, = ctl.daemon_pids(uuid)
        assert second != first
        stop(p)
        assert ctl.daemon_pids(uuid) == [second]  # hamid's exit leaves it (and its clients) alone
        p = start(state, free_port, "--config", str(cfg))
        time.sleep(0.5)  # a few health checks
        assert ctl.daemon_pids(uuid) == [second]  # adopted, not restarted
        with LocalClient(state) as c:
            c.release("docker:c1")
        assert ctl.daemon_pids(uuid) == []
    finally:
        stop(p)
        for u in ctl.gpus():
            ctl.stop(u)


def test_kube_scheduler_hears_why_an_mps_pod_fits_nowhere(node_of):
    """The extender's and the gate's one-line summary names the mode and the setting to change."""
    from hamid.scheduling.fitsummary import summarize

    plain = node_of(simulate="H100:1")
    busy = node_of(operatingMode="any", simulate="H100:1")
    busy.core.admit(Owner("docker", "a"), parse_docker_env(env("mode=hami-core,mem=4g,cores=30"), "a"))
    req = parse_pod(pod("mps"))
    reasons = {}
    for name, d in (("plain", plain), ("busy", busy)):
        got = place(req, [d.ledger.view()])
        reasons[name] = list(got.reasons[d.ledger.view().name])
    msg = summarize(reasons, 2)
    assert "1 GPU mode (mps not served: set operatingMode or deviceModes to mps or any)" in msg, msg
    assert "1 GPU mode (mps requested, GPU busy with hami-core tenants)" in msg, msg


def test_mps_dir_moves_the_pipe_directories_and_opens_them_to_traverse(node_of, short_tmp):
    root = str(short_tmp / "mpsd")
    d = node_of(operatingMode="mps", simulate="H100:1", mpsDir=root)
    uuid = d.ledger.view().gpus[0].uuid
    a = d.core.admit(Owner("docker", "a"), parse_docker_env(env("mem=4g,cores=30"), "a"))
    pipe = mps.pipe_dir(d.state_dir, uuid, root)
    assert pipe.startswith(root + "/")
    assert any(m.host_path == pipe and m.container_path == "/run/hamid-mps" for m in a.edits["main"].mounts)
    assert os.path.exists(os.path.join(pipe, "control"))  # the daemon listens there
    assert os.stat(root).st_mode & 0o777 == 0o711 and os.stat(os.path.dirname(pipe)).st_mode & 0o777 == 0o711
    assert not os.path.exists(os.path.join(d.state_dir, "mps", uuid))
    d.core.release("docker:a")
    assert mps.MpsControl(STANDIN, str(d.state_dir), root=root).daemon_pids(uuid) == []
