"""Only kube-scheduler can bind, and a bind never frees a running pod's GPU.

Found by an attack on a running daemon: the extender's ``bind`` answered
anyone on its NodePort (one ``POST /bind`` bound another namespace's pod to a
chosen node with the daemon's credentials, a pod asking no GPU with no commit
at all), and a ``bind`` for an already-bound pod re-committed the same
decision, the ledger took it as a repeat, the Binding failed with 409 and the
rollback released the running pod's reservation.

A real cluster env in extender mode (daemons, API-server and kube-scheduler
stand-ins), the extender on HTTPS with the client CA; the attacks with httpx.
"""

from __future__ import annotations

import ssl

import httpx
import pytest

import nodeenv
from clusterenv import ClusterEnv
from test_placement_cluster import SCHEDULER_CONFIG, gpu_pod

import yaml

pytestmark = pytest.mark.slow


def _client(env, cert=None) -> httpx.Client:
    ctx = ssl.create_default_context(cafile=str(env.tls.ca))
    ctx.check_hostname = False
    if cert is not None:
        ctx.load_cert_chain(*cert)
    return httpx.Client(verify=ctx, trust_env=False, timeout=10)


def _bind(client, env, i, pod, node):
    return client.post(f"https://127.0.0.1:{env.ports[i][3]}/bind", json={
        "PodName": pod["metadata"]["name"], "PodNamespace": pod["metadata"]["namespace"],
        "PodUID": pod["metadata"]["uid"], "Node": node})


@pytest.mark.parametrize("front", [False, True], ids=["daemon-serves", "front-serves"])
def test_extender_needs_a_client_certificate_and_refuses_binds_that_are_not_kube_schedulers(tmp_path, api_server,
                                                                                            front):
    """Served by the daemon itself, and as the chart runs it: by ``hamid front`` with no
    capabilities, the daemon answering only on its frontDir socket."""
    from hamid.webhook.certs import issue, make_ca
    from scheduler import SchedulerStandIn

    env = ClusterEnv(tmp_path / "c", api_server, nodes=2, mode="extender", front=front).start(webhook=False)
    config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    (ext,) = config["extenders"]
    leader = None
    sched = None
    try:
        leader = env.leader()
        if front:  # the port is the front's; the daemon holds only its socket
            n = env.nodes[leader]
            assert n.front_proc is not None and n.front_proc.poll() is None
            assert (n.front_dir / "extender.sock").is_socket()
            assert oct((n.front_dir / "extender.sock").stat().st_mode & 0o777) == "0o660"
            status = dict(line.split(":", 1) for line in open(f"/proc/{n.front_proc.pid}/status").read().splitlines())
            if nodeenv.SETPRIV:
                assert int(status["CapEff"], 16) == 0 and status["NoNewPrivs"].strip() == "1"
        ext["urlPrefix"] = f"https://127.0.0.1:{env.ports[leader][3]}"
        ext["tlsConfig"] = {**ext["tlsConfig"], **env.extender_tls()}
        sched = SchedulerStandIn(api_server, config=config, period=0.2).start()
        api_server.create(gpu_pod("running", 6000, cores=30, gated=False))
        node = sched.wait_bound("default", "running", timeout=30)
        running = api_server.get("Pod", "default", "running")
        uid = running["metadata"]["uid"]
        holder = next(n for n in env.nodes if n.node == node)
        assert [r["owner"] for r in holder.reservations()] == [f"pod:{uid}"]
        sched.stop()
        sched = None

        # no client certificate, or one from another CA: no TLS handshake, nothing served
        other = make_ca("someone else's CA")
        stranger = issue(other, ["mallory"], client=True)
        (tmp_path / "m.crt").write_bytes(stranger.cert_pem)
        (tmp_path / "m.key").write_bytes(stranger.key_pem)
        for cert in (None, (str(tmp_path / "m.crt"), str(tmp_path / "m.key"))):
            with _client(env, cert) as c, pytest.raises(httpx.HTTPError):
                _bind(c, env, leader, running, node)
        with httpx.Client(trust_env=False, timeout=5) as plain, pytest.raises(httpx.HTTPError):
            plain.post(f"http://127.0.0.1:{env.ports[leader][3]}/bind", json={})

        # kube-scheduler's certificate, but binds kube-scheduler would never make
        other_node = next(n.node for n in env.nodes if n.node != node)
        with _client(env, (str(env.client_cert), str(env.client_key))) as c:
            for target in (node, other_node):  # the running pod again: refused, its reservation kept
                got = _bind(c, env, leader, running, target).json()
                assert "already bound to node" in got["Error"], got
            assert [r["owner"] for r in holder.reservations()] == [f"pod:{uid}"]

            api_server.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu", "namespace": "default"},
                               "spec": {"containers": [{"name": "main", "image": "busybox"}]}})
            cpu = api_server.get("Pod", "default", "cpu")
            got = _bind(c, env, leader, cpu, node).json()
            assert "asks for no GPU" in got["Error"], got
            assert not api_server.get("Pod", "default", "cpu")["spec"].get("nodeName")

            theirs = gpu_pod("theirs", 2000, gated=False)
            theirs["spec"]["schedulerName"] = "another-scheduler"
            api_server.create(theirs)
            got = _bind(c, env, leader, api_server.get("Pod", "default", "theirs"), node).json()
            assert "belongs to scheduler 'another-scheduler'" in got["Error"], got

            api_server.create(gpu_pod("unfiltered", 2000, gated=False))
            unf = api_server.get("Pod", "default", "unfiltered")
            got = _bind(c, env, leader, unf, node).json()
            assert "was not filtered onto node" in got["Error"], got
            for pod in ("cpu", "theirs", "unfiltered"):
                assert not api_server.get("Pod", "default", pod)["spec"].get("nodeName")
            owners = sorted(r["owner"] for n in env.nodes for r in n.reservations())
            assert owners == [f"pod:{uid}"]
    finally:
        if sched is not None:
            sched.stop()
        env.stop()
