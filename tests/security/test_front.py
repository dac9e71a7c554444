"""``hamid front``: the webhook, extender and metrics ports, as the chart's unprivileged container serves them.

Real processes, the front started with every capability dropped (effective,
permitted, inheritable, bounding and ambient sets empty) and ``no_new_privs``
set, as ``setpriv`` does, with only a config file and a certificate: it
serves AdmissionReviews (a GPU pod is gated) with no state directory; it
serves a real daemon's ``/metrics``, which the daemon itself serves only on a
socket in ``frontDir`` (mode 0660, ``frontGroup``); it checks extender bodies
(size, JSON) before any reaches the daemon; and it refuses a config it cannot
serve. (The chart also runs it as uid 65534; here the interpreter lives under
root's home, so the uid stays 0, without any of root's powers.)
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import uuid

import httpx
import pytest

from hamid.webhook import certs

HAMID = [sys.executable, "-m", "hamid.cli.main"]


from netports import free_port as _port, listening_ports  # noqa: E402 - ports outside the ephemeral range


SETPRIV = shutil.which("setpriv")


@pytest.mark.skipif(SETPRIV is None, reason="setpriv (util-linux) drops the capabilities")
def test_the_webhook_serves_alone_without_any_capability():
    d = tempfile.mkdtemp(prefix="hamid-webhook-")  # not under pytest's root-only tmp: nobody must read it
    try:
        os.chmod(d, 0o755)
        ca = certs.make_ca("test CA")
        srv = certs.issue(ca, ["127.0.0.1", "localhost"])
        for name, data in (("ca.pem", ca.cert_pem), ("tls.crt", srv.cert_pem), ("tls.key", srv.key_pem)):
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
            os.chmod(os.path.join(d, name), 0o644)
        port = _port()
        cfg = os.path.join(d, "config.yaml")
        with open(cfg, "w") as f:
            f.write(f"controlMode: gate\nwebhookListen: 127.0.0.1:{port}\nwebhookCertFile: {d}/tls.crt\n"
                    f"webhookKeyFile: {d}/tls.key\nwebhookAllocationWriters: [system:serviceaccount:x:hamid]\n"
                    f"stateDir: /nonexistent/never-used\nmetricsPort: 0\n")
        os.chmod(cfg, 0o644)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.Popen([SETPRIV, "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
                                 *HAMID, "front", "--config", cfg, "--log-format", "json"], cwd=d,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        try:
            ctx = ssl.create_default_context(cafile=os.path.join(d, "ca.pem"))
            deadline = time.time() + 30
            while True:
                assert proc.poll() is None, proc.stderr.read()
                try:
                    assert httpx.get(f"https://127.0.0.1:{port}/healthz", verify=ctx, timeout=2).text == "ok"
                    break
                except httpx.HTTPError:
                    assert time.time() < deadline, "the webhook did not come up"
                    time.sleep(0.1)
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
                   "spec": {"containers": [{"name": "main", "image": "x",
                                            "resources": {"limits": {"nvidia.com/gpu": "1",
                                                                     "nvidia.com/gpumem": "4096"}}}]}}
            review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
                "uid": str(uuid.uuid4()), "operation": "CREATE", "object": pod, "namespace": "default",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "userInfo": {"username": "alice"}}}
            out = httpx.post(f"https://127.0.0.1:{port}/mutate", json=review, verify=ctx, timeout=10).json()
            assert out["response"]["allowed"] is True
            assert "hamid.io/placement" in json.dumps(out["response"].get("patch") and
                                                       __import__("base64").b64decode(out["response"]["patch"]).decode())
            status = dict(line.split(":", 1) for line in open(f"/proc/{proc.pid}/status").read().splitlines())
            for cap in ("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb"):
                assert int(status[cap], 16) == 0, (cap, status[cap])
            assert status["NoNewPrivs"].strip() == "1"
        finally:
            proc.terminate()
            assert proc.wait(15) == 0
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_a_front_that_cannot_serve_its_config_is_refused_at_once(tmp_path):
    cfg = tmp_path / "c.yaml"
    for text, words in (("controlMode: gate\nwebhookListen: 127.0.0.1:0\nmetricsPort: 0\n", "needs webhookCertFile"),
                        ("controlMode: none\nmetricsPort: 9394\n", "set frontDir"),
                        ("controlMode: none\nmetricsPort: 0\n", "nothing to serve")):
        cfg.write_text(text)
        for cmd in ("front", "webhook"):  # `hamid webhook` is the same command (its first name)
            r = subprocess.run([*HAMID, cmd, "--config", str(cfg)], capture_output=True, text=True, timeout=60)
            assert r.returncode != 0 and words in r.stderr and "Traceback" not in r.stderr, (text, r.stderr)


def _wait(url: str, proc, timeout: float = 30.0, **kw) -> httpx.Response:
    deadline = time.time() + timeout
    while True:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else proc.returncode
        try:
            return httpx.get(url, timeout=2, **kw)
        except httpx.HTTPError:
            assert time.time() < deadline, f"{url} never answered"
            time.sleep(0.1)


@pytest.mark.skipif(SETPRIV is None, reason="setpriv (util-linux) drops the capabilities")
def test_the_front_serves_a_daemons_metrics_and_checks_extender_bodies_before_the_daemon_sees_them():
    d = tempfile.mkdtemp(prefix="hamid-front-")  # short: unix socket paths are at most 107 bytes
    procs = []
    try:
        metrics, extender, webhook = _port(), _port(), _port()
        front_dir = os.path.join(d, "front")
        ca = certs.make_ca("test CA")
        srv = certs.issue(ca, ["127.0.0.1"])
        for name, data in (("tls.crt", srv.cert_pem), ("tls.key", srv.key_pem)):
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        cfg = os.path.join(d, "config.yaml")
        with open(cfg, "w") as f:
            f.write(f"simulate: H100:1\nstateDir: {d}/state\nmetricsPort: {metrics}\nfrontDir: {front_dir}\n"
                    f"webhookListen: 127.0.0.1:{webhook}\nwebhookCertFile: {d}/tls.crt\nwebhookKeyFile: {d}/tls.key\n"
                    f"frontGroup: {os.getgid() + 1}\ncontrolMode: extender\nextenderListen: 127.0.0.1:{extender}\n"
                    f"extenderInsecure: true\n")
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        daemon = subprocess.Popen([*HAMID, "run", "--config", cfg], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, env=env)
        procs.append(daemon)
        sock = os.path.join(front_dir, "metrics.sock")
        deadline = time.time() + 30
        while not os.path.exists(sock):
            assert daemon.poll() is None and time.time() < deadline, daemon.stderr.read()
            time.sleep(0.1)
        st = os.stat(sock)
        assert oct(st.st_mode & 0o777) == "0o660" and st.st_gid == os.getgid() + 1  # frontGroup, no one else
        assert oct(os.stat(front_dir).st_mode & 0o777) == "0o750"
        assert metrics not in listening_ports(daemon.pid)  # the daemon holds no metrics port of its own
        front = subprocess.Popen([SETPRIV, "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
                                  *HAMID, "front", "--config", cfg], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, env=env)
        procs.append(front)
        body = _wait(f"http://127.0.0.1:{metrics}/metrics", front).text
        assert 'hami_vgpu_count' in body or "hamid_" in body, body[:500]
        assert "hamid_face_up" in body  # the daemon's registry, not the front's
        # the extender: checked here, as nobody; the daemon (not in a cluster) never sees these
        r = httpx.post(f"http://127.0.0.1:{extender}/filter", content=b"[1, 2]", timeout=10)
        assert r.status_code == 400 and "JSON object" in r.json()["Error"]
        r = httpx.post(f"http://127.0.0.1:{extender}/filter", content=b"{" * 200_000, timeout=10)
        assert r.status_code == 400
        r = httpx.post(f"http://127.0.0.1:{extender}/filter", content=b"x" * (9 << 20), timeout=20)
        assert r.status_code == 413
        r = httpx.post(f"http://127.0.0.1:{extender}/filter", json={"Pod": {}}, timeout=10)
        assert r.status_code == 503 and "not answering" in r.json()["Error"]  # no extender socket: said so
        # the daemon stops: the front says so per scrape, and serves again when it is back
        daemon.terminate()
        assert daemon.wait(20) == 0
        r = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=15)
        assert r.status_code == 503 and front.poll() is None
        daemon = subprocess.Popen([*HAMID, "run", "--config", cfg], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, env=env)
        procs.append(daemon)
        deadline = time.time() + 30
        while httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=15).status_code != 200:
            assert daemon.poll() is None and time.time() < deadline, daemon.stderr.read()
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(d, ignore_errors=True)


def test_front_dir_without_an_explicit_front_group_is_refused(tmp_path):
    """No shared default: outside a pod, nogroup (65534) is held by many host services, each of
    which could call the daemon's extender socket; the chart names its front container's group."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"simulate: H100:1\nstateDir: {tmp_path}/state\nfrontDir: {tmp_path}/front\nmetricsPort: 0\n")
    r = subprocess.run([*HAMID, "run", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "needs frontGroup" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "front").exists()  # refused before anything was made
    cfg.write_text(cfg.read_text() + f"frontGroup: {os.getgid() + 1}\n")
    from hamid.config import load_config

    assert load_config(cfg).frontGroup == os.getgid() + 1


@pytest.mark.skipif(SETPRIV is None, reason="setpriv (util-linux) drops the capabilities")
def test_the_peer_api_is_opened_by_the_front_and_the_daemon_answers_only_on_its_socket():
    """With frontDir the daemon holds no peer port: the front reads, opens and decodes every frame
    as nobody, refuses what fails there (the daemon never sees it) and relays the rest over
    frontDir/peer.sock; the leader's calls are answered through it, sealed to the caller."""
    import base64

    import trio

    from hamid.keyring import Keyring
    from hamid.peer import frames
    from hamid.peer.client import PeerClient
    from hamid.peer.errors import PeerUnauthenticated

    d = tempfile.mkdtemp(prefix="hamid-peer-")
    procs = []
    try:
        peer = _port()
        key = os.path.join(d, "gossip.key")
        with open(key, "w") as f:
            f.write(base64.b64encode(os.urandom(32)).decode() + "\n")
        os.chmod(key, 0o600)
        cfg = os.path.join(d, "config.yaml")
        with open(cfg, "w") as f:
            f.write(f"simulate: H100:1\nstateDir: {d}/state\nfrontDir: {d}/front\nfrontGroup: {os.getgid() + 1}\n"
                    f"metricsPort: 0\ncontrolMode: none\npeerListen: 127.0.0.1:{peer}\ngossipKeyFile: {key}\n"
                    f"nodeName: n1\n")
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        daemon = subprocess.Popen([*HAMID, "run", "--config", cfg], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, env=env)
        procs.append(daemon)
        sock = os.path.join(d, "front", "peer.sock")
        deadline = time.time() + 30
        while not os.path.exists(sock):
            assert daemon.poll() is None and time.time() < deadline, daemon.stderr.read()
            time.sleep(0.1)
        st = os.stat(sock)
        assert oct(st.st_mode & 0o777) == "0o660" and st.st_gid == os.getgid() + 1
        assert peer not in listening_ports(daemon.pid)
        front = subprocess.Popen([SETPRIV, "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
                                  *HAMID, "front", "--config", cfg], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True, env=env)
        procs.append(front)
        keys = Keyring.load(key)
        addr = f"127.0.0.1:{peer}"

        async def calls():
            async with PeerClient(keys, name="leader") as c:
                deadline = time.time() + 30
                while True:
                    try:
                        doc = await c.status(addr, node="n1")
                        break
                    except Exception:
                        assert front.poll() is None and time.time() < deadline, "the front never served the peer API"
                        await trio.sleep(0.2)
                assert doc["node"] == "n1"
                assert await c.release(addr, "pod:nobody", node="n1") == {"released": False, "reservation": None}
            async with PeerClient(Keyring([os.urandom(32)]), name="x") as stranger:
                with pytest.raises(PeerUnauthenticated):
                    await stranger.status(addr, node="n1")

        trio.run(calls)
        # sealed with the key but not a request: refused by the front, with the reason
        bad = frames.Sealer(keys).seal(b"\xa1\x61x\x01", frames.AAD_REQUEST)
        r = httpx.post(f"http://{addr}/v1/peer", content=bad, timeout=10)
        assert r.status_code == 400 and "bad-request" in r.text
        r = httpx.post(f"http://{addr}/v1/peer", content=b"\x01" + os.urandom(100), timeout=10)
        assert r.status_code == 401
        for p in procs:
            p.terminate()
            assert p.wait(20) == 0
        front_log, daemon_log = front.stderr.read(), daemon.stderr.read()
        assert "peer request dropped" in front_log
        assert "peer request dropped" not in daemon_log  # what failed at the front never reached the daemon
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        shutil.rmtree(d, ignore_errors=True)
