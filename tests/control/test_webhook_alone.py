"""``hamid webhook``: the admission webhook alone, as the chart's unprivileged container runs it.

A real process, started with every capability dropped (effective, permitted,
inheritable, bounding and ambient sets empty) and ``no_new_privs`` set, as
``setpriv`` does, with only a config file and a certificate: it serves
AdmissionReviews (a GPU pod is gated), needs no state directory, and refuses a
config it cannot serve. (The chart also runs it as uid 65534; here the
interpreter lives under root's home, so the uid stays 0, without any of root's
powers.)
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import uuid

import httpx
import pytest

from hamid.control import certs

HAMID = [sys.executable, "-m", "hamid.cli.main"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
                    f"stateDir: /nonexistent/never-used\n")
        os.chmod(cfg, 0o644)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.Popen([SETPRIV, "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
                                 *HAMID, "webhook", "--config", cfg, "--log-format", "json"], cwd=d,
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


def test_a_webhook_without_a_certificate_is_refused_at_once(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("controlMode: gate\nwebhookListen: 127.0.0.1:0\n")
    r = subprocess.run([*HAMID, "webhook", "--config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "needs webhookCertFile" in r.stderr and "Traceback" not in r.stderr
