"""Gossip seeds from the DaemonSet's pods (listed in the API-server stand-in)
and from a headless Service's DNS name; the leader election config keys."""

from __future__ import annotations

import socket

import pytest
from pydantic import ValidationError

from hamid.config.schema import Config
from hamid.kube.seeds import SeedError, gossip_port, kubernetes_seeds, service_seeds
from hamid.kube.client import api_client

NS = "hamid-system"


def daemon_pod(api, name: str, ip: str | None, *, labels=None, node="n", namespace=NS) -> None:
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}) \
        if not any(n["metadata"]["name"] == namespace for n in api.list("Namespace")) else None
    api.create({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": labels if labels is not None else {"app.kubernetes.io/name": "hamid"}},
                "spec": {"nodeName": node, "containers": [{"name": "hamid", "image": "hamid"}]}})
    if ip:
        api.set_status("Pod", namespace, name, {"podIP": ip, "phase": "Running"})


async def test_seeds_from_the_daemon_pods(api_server, kubeconfig):
    daemon_pod(api_server, "hamid-a", "10.0.0.1")
    daemon_pod(api_server, "hamid-b", "10.0.0.2")
    daemon_pod(api_server, "hamid-v6", "fd00::7")
    daemon_pod(api_server, "hamid-self", "10.0.0.9")  # this daemon's own pod
    daemon_pod(api_server, "hamid-new", None)  # no IP yet
    daemon_pod(api_server, "hamid-going", "10.0.0.3")
    api_server.delete("Pod", NS, "hamid-going", grace_period=30)  # bound: stays, with deletionTimestamp
    assert api_server.get("Pod", NS, "hamid-going")["metadata"].get("deletionTimestamp")
    daemon_pod(api_server, "other-app", "10.0.0.4", labels={"app.kubernetes.io/name": "other"})
    daemon_pod(api_server, "hamid-elsewhere", "10.0.0.5", namespace="default")
    cfg = Config(gossipListen="0.0.0.0:7947", gossipInsecure=True)
    env = {"POD_NAME": "hamid-self", "POD_NAMESPACE": NS}
    seeds = await kubernetes_seeds(cfg, api_client(kubeconfig), env)
    assert seeds == ["10.0.0.1:7947", "10.0.0.2:7947", "[fd00::7]:7947"]
    # POD_IP excludes too (a pod whose name we do not know, e.g. after a rename)
    seeds = await kubernetes_seeds(cfg, api_client(kubeconfig), {"POD_NAMESPACE": NS, "POD_IP": "10.0.0.2"})
    assert seeds == ["10.0.0.1:7947", "10.0.0.9:7947", "[fd00::7]:7947"]
    # the selector is the config's
    cfg = Config(gossipListen="0.0.0.0:7947", gossipInsecure=True, daemonPodSelector="app.kubernetes.io/name=other")
    assert await kubernetes_seeds(cfg, api_client(kubeconfig), env) == ["10.0.0.4:7947"]
    # off: nothing is listed
    cfg = Config(gossipListen="0.0.0.0:7947", gossipInsecure=True, gossipSeedsFromPods=False)
    assert await kubernetes_seeds(cfg, None, env) == []


async def test_pod_seeds_name_the_api_failure(api_server, kubeconfig):
    cfg = Config(gossipListen="0.0.0.0:7947", gossipInsecure=True)
    api = api_client(kubeconfig)
    api_server.stop()
    with pytest.raises(SeedError, match=r"cannot list the daemon pods \('app.kubernetes.io/name=hamid' in namespace "
                                        r"kube-system\).*did not answer"):
        await kubernetes_seeds(cfg, api, {})
    with pytest.raises(SeedError, match="gossipSeedsFromPods needs the API server"):
        await kubernetes_seeds(cfg, None, {})


async def test_seeds_from_a_headless_service_name():
    # localhost resolves through /etc/hosts: a real getaddrinfo, as a Service name through cluster DNS
    assert "127.0.0.1:7947" in service_seeds("localhost", 7947)
    assert "127.0.0.1:7947" not in service_seeds("localhost", 7947, self_ip="127.0.0.1")
    cfg = Config(gossipListen="0.0.0.0:7947", gossipInsecure=True, gossipSeedsFromPods=False,
                 gossipSeedsService="localhost")
    assert "127.0.0.1:7947" in await kubernetes_seeds(cfg, None, {})


def test_a_service_with_no_records_gives_no_seeds_other_lookup_errors_are_named():
    assert service_seeds("no-such-service.invalid", 7947) == []

    def temporary_failure(*_a, **_k):
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    with pytest.raises(SeedError, match="cannot resolve the gossip seeds Service 'hamid-gossip': .*Temporary"):
        service_seeds("hamid-gossip", 7947, resolve=temporary_failure)


def test_gossip_port_errors_name_the_value():
    assert gossip_port("0.0.0.0:7947") == 7947
    with pytest.raises(SeedError, match="need gossipListen"):
        gossip_port(None)
    with pytest.raises(SeedError, match="port 0"):
        gossip_port("0.0.0.0:0")


def test_leader_election_defaults_are_client_gos_and_the_timing_rule_is_enforced():
    c = Config()
    assert (c.leaderElectionLeaseDuration, c.leaderElectionRenewDeadline, c.leaderElectionRetryPeriod) == (15, 10, 2)
    assert c.leaderElectionLeaseName == "hamid-leader" and c.leaderElectionNamespace is None
    assert c.gossipSeedsFromPods is True and c.gossipSeedsService is None
    with pytest.raises(ValidationError, match=r"leaderElectionLeaseDuration 15 s must be greater than "
                                              r"leaderElectionRenewDeadline 15.0 s"):
        Config(leaderElectionRenewDeadline=15)
    with pytest.raises(ValidationError, match=r"leaderElectionRenewDeadline 10.0 s must be greater than 1.2 x "
                                              r"leaderElectionRetryPeriod \(9.0 s = 10.8 s\)"):
        Config(leaderElectionRetryPeriod=9)
    with pytest.raises(ValidationError, match="leaderElectionLeaseDuration"):
        Config(leaderElectionLeaseDuration=2.5)  # whole seconds: the Lease records an integer
    with pytest.raises(ValidationError, match="leaderElectionNamespace"):
        Config(leaderElectionNamespace="Kube_System")
    Config(leaderElectionLeaseDuration=3, leaderElectionRenewDeadline=2, leaderElectionRetryPeriod=0.5)


def test_elector_from_config_identity_and_namespace(api_server, kubeconfig):
    from hamid.kube.election import LeaderElector

    api = api_client(kubeconfig)
    cfg = Config()
    e = LeaderElector.from_config(cfg, api, "node-1", {"POD_NAME": "hamid-x1", "POD_NAMESPACE": NS})
    assert (e.identity, e.namespace, e.pod, e.lease_duration_s) == ("hamid-x1", NS, "hamid-x1", 15)
    e = LeaderElector.from_config(cfg, api, "node-1", {})
    assert (e.identity, e.namespace, e.pod, e.label) == ("node-1", "kube-system", None, None)
    e = LeaderElector.from_config(Config(leaderElectionNamespace="hamid"), api, "node-1", {"POD_NAMESPACE": NS})
    assert e.namespace == "hamid"
