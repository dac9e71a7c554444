"""The node core and the runtime's way to it: defects a new user hit, each fixed.

- a daemon stopped for longer than the runtime waits must not commit the
  request later (a phantom for an exited container);
- a daemon that dies while answering is as good as no daemon: the runtime
  admits the container itself;
- every admission finishes pending releases first;
- two drains of one MIG container's release marker, racing a newcomer for its
  placement, never let the newcomer's instance be destroyed or refused;
- a refused second daemon on the same state directory changes nothing;
- a busy metrics port and an oversized request body are one-line errors.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from hamid.ledger import Ledger
from hamid.localapi.client import LocalClient
from hamid.node.identity import Owner
from hamid.node.released import mark
from hamid.request import parse_docker_env
from hamid.runtime.access import NodeAccess
from nodeharness import make_node
from test_daemon import HAMID, start, stop


def _env(spec: str, devices: str | None = None) -> list[str]:
    env = ["PATH=/bin", f"HAMI_VGPU_SPEC={spec}"]
    if devices is not None:
        env.append(f"HAMI_VISIBLE_DEVICES={devices}")
    return env


@pytest.mark.slow  # several seconds of real time: whole suite only (make test-fast skips it)
def test_a_request_the_runtime_gave_up_on_is_never_committed_later(tmp_path, free_port):
    state = tmp_path / "s"
    daemon = start(state, free_port, "--simulate", "T4")
    try:
        daemon.send_signal(signal.SIGSTOP)
        t0 = time.time()
        got = NodeAccess(state, timeout_s=1.5).admit_container("gone1", _env("mem=2g"), (0, 0), {})
        assert got["ours"] and time.time() - t0 < 10  # admitted by the runtime itself
        # the container exits at once and is released, still without the daemon
        access = NodeAccess(state, timeout_s=1.5)
        access._local().release("docker:gone1")
        access.close()
        daemon.send_signal(signal.SIGCONT)  # the daemon now reads the queued request
        time.sleep(1.0)
        with LocalClient(state) as c:
            assert c.status()  # it is alive and answering
            assert c.reservations() == []  # and did not commit the abandoned request: no phantom
    finally:
        daemon.send_signal(signal.SIGCONT)
        stop(daemon)


def test_a_daemon_that_dies_while_answering_is_as_good_as_none(tmp_path):
    d = make_node(tmp_path / "s", simulate="T4")
    d.close()
    sock_path = tmp_path / "s" / "hamid.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(sock_path))
    srv.listen(4)

    def die_while_answering():
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.close()  # no answer at all: as a daemon killed mid-request

    t = threading.Thread(target=die_while_answering, daemon=True)
    t.start()
    got = NodeAccess(tmp_path / "s").admit_container("c1", _env("mem=1g"), (0, 0), {})
    t.join(5)
    srv.close()
    assert got["ours"] and got["reservation"]["owner"] == "docker:c1"
    led = Ledger(tmp_path / "s" / "ledger.db")
    assert led.get("docker:c1").state == "allocated"
    led.close()


def test_every_admission_finishes_pending_releases_first(tmp_path):
    d = make_node(tmp_path / "s", simulate="T4")  # one T4: 15360 MiB
    try:
        d.core.admit(Owner("docker", "old"), parse_docker_env(_env("mem=12g"), "old"))
        mark(str(tmp_path / "s"), "old")  # its poststop ran; nobody drained yet
        got = d.core.admit(Owner("docker", "new"), parse_docker_env(_env("mem=12g"), "new"))
        assert got.reservation.owner == "docker:new"
        assert d.ledger.get("docker:old") is None
    finally:
        d.close()


def _drain(state: str, out) -> None:
    from hamid.runtime.access import NodeAccess

    try:
        a = NodeAccess(state)
        a._local().drain_released()
        a.close()
        out.put(("drained", None))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        out.put(("drain-error", repr(e)))


def _admit(state: str, cid: str, out) -> None:
    from hamid.runtime.access import NodeAccess

    try:
        a = NodeAccess(state)
        got = a.admit_container(cid, ["HAMI_VISIBLE_DEVICES=0", "HAMI_VGPU_SPEC=1g.10gb"], (0, 0), {})
        a.close()
        out.put(("admitted", got["reservation"]["mig"]))
    except Exception as e:  # noqa: BLE001
        out.put(("admit-error", repr(e)))


@pytest.mark.slow
def test_racing_drains_never_destroy_a_newcomers_mig_instance(tmp_path):
    """Two runtimes drain one MIG container's marker while a third admits a container that wants the
    same placement (no daemon anywhere). Before the release claim, 2 of 8 trials ended with the newcomer
    refused ("placement overlaps a live instance") or its instance destroyed."""
    from hamid.devices.simulated import SimulatedBackend, parse_simulate_spec

    ctx = mp.get_context("spawn")
    for trial in range(8):
        state = tmp_path / f"s{trial}"
        d = make_node(state, simulate="H100:1", mode="mig")
        d.close()
        a = NodeAccess(state)
        first = a.admit_container(f"old{trial}", ["HAMI_VISIBLE_DEVICES=0", "HAMI_VGPU_SPEC=1g.10gb"], (0, 0), {})
        a.close()
        mark(str(state), f"old{trial}")
        q = ctx.Queue()
        procs = [ctx.Process(target=_drain, args=(str(state), q)) for _ in range(2)]
        procs.append(ctx.Process(target=_admit, args=(str(state), f"new{trial}", q)))
        for p in procs:
            p.start()
        results = [q.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(30)
        kinds = sorted(r[0] for r in results)
        assert kinds == ["admitted", "drained", "drained"], results
        new_mig = next(r[1] for r in results if r[0] == "admitted")
        backend = SimulatedBackend(parse_simulate_spec("H100:1"), "node-t", mig_enabled=True,
                                   state_file=state / "simulated-mig.json")
        live = [i.uuid for g in backend.gpus() for i in g.mig_instances]
        backend.close()
        assert live == [inst["uuid"] for inst in new_mig.values()], (trial, live, new_mig, first["reservation"]["mig"])
        led = Ledger(state / "ledger.db")
        assert [r.owner for r in led.list()] == [f"docker:new{trial}"]
        led.close()


def test_a_refused_second_daemon_changes_nothing(tmp_path, free_port):
    state = tmp_path / "s"
    daemon = start(state, free_port, "--simulate", "T4")
    try:
        facts = (state / "node.json").read_bytes()
        r = subprocess.run([*HAMID, "run", "--state-dir", str(state), "--simulate", "H100:2", "--metrics-port", "0"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "another hamid daemon is running" in r.stderr
        assert "Traceback" not in r.stderr
        assert (state / "node.json").read_bytes() == facts
        with LocalClient(state) as c:
            assert [g["name"] for g in c.status()["gpus"]] == ["Tesla T4"]  # inventory untouched (not 2 H100s)
    finally:
        stop(daemon)


def test_a_busy_metrics_port_is_one_line(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    try:
        r = subprocess.run([*HAMID, "run", "--state-dir", str(tmp_path / "s"), "--simulate", "T4",
                            "--metrics-port", str(port), "--config", _metrics_on_loopback(tmp_path)],
                           capture_output=True, text=True, timeout=60)
    finally:
        busy.close()
    assert r.returncode == 1
    assert "Traceback" not in r.stderr, r.stderr
    assert f"cannot listen on the metrics port 127.0.0.1:{port}" in r.stderr, r.stderr


def _metrics_on_loopback(tmp_path: Path) -> str:
    cfg = tmp_path / "m.yaml"
    cfg.write_text("metricsAddress: 127.0.0.1\n")
    return str(cfg)


def test_the_local_api_refuses_an_oversized_body(tmp_path, free_port):
    state = tmp_path / "s"
    daemon = start(state, free_port, "--simulate", "T4")
    try:
        transport = httpx.HTTPTransport(uds=str(state / "hamid.sock"))
        with httpx.Client(transport=transport, base_url="http://hamid") as c:
            r = c.post("/v1/containers", content=json.dumps({"id": "x", "env": ["A=" + "x" * 300_000]}),
                       headers={"content-type": "application/json"})
            assert r.status_code == 413 and "over 262144 bytes" in r.json()["error"]
            ok = c.post("/v1/containers", json={"id": "y", "env": ["HAMI_VGPU_SPEC=mem=1g"]})
            assert ok.status_code == 200 and ok.json()["ours"] is True
    finally:
        stop(daemon)


def test_a_mig_instance_is_destroyed_while_its_row_still_books_the_placement(tmp_path):
    """The rule: destroy the instance while the row is still there in `releasing` (so no newcomer can
    be given that placement and lose its instance to this release), and delete the row only after.
    A backend that checks the ledger at the moment of destruction fails this deterministically if the
    order is ever reversed."""
    d = make_node(tmp_path / "s", simulate="H100", mode="mig")
    try:
        real = d.core.backend
        seen = []

        class OrderCheckingBackend:
            def __getattr__(self, name):
                return getattr(real, name)

            def destroy_mig_instance(self, gpu, gi_id):
                row = d.ledger.get("docker:m1")
                seen.append(row.state if row is not None else None)
                assert row is not None and row.state == "releasing", \
                    f"MIG instance destroyed with its row {'gone' if row is None else row.state}"
                return real.destroy_mig_instance(gpu, gi_id)

        d.core._backend = OrderCheckingBackend()
        d.core.admit(Owner("docker", "m1"), parse_docker_env(_env("1g.10gb"), "m1"))
        assert d.ledger.get("docker:m1").mig, "a MIG instance was made and recorded"
        d.core.release("docker:m1")
        assert seen == ["releasing"] and d.ledger.get("docker:m1") is None
        assert not [i for g in real.gpus() for i in g.mig_instances]
    finally:
        d.close()
