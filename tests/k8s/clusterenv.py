"""A cluster for the tests: one API-server stand-in, N nodes (each a kubelet
stand-in and a real ``hamid run`` with gossip, the peer API and the control
face), and a kube-scheduler stand-in: what a DaemonSet install looks like.

The daemons join one gossip group on loopback (a shared keyring: the peer
API refuses to run without one), elect a leader over a Lease in the API
stand-in, and serve the webhook, which the API stand-in calls as the real
API server would (a MutatingWebhookConfiguration with the CA bundle).
"""

from __future__ import annotations

import base64
import os
import subprocess
import time
from pathlib import Path

from nodeenv import RESOURCE, NodeEnv


from netports import free_port, free_ports  # noqa: E402,F401 - (free_port: the tests import it from here)


# A GPU pod as a user writes it for `kubectl apply` (format with name, mem in MiB, cores in %).
POD_YAML = """apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  containers:
  - name: main
    image: busybox
    resources:
      limits:
        nvidia.com/gpu: "1"
        nvidia.com/gpumem: "{mem}"
        nvidia.com/gpucores: "{cores}"
      requests:
        cpu: 100m
"""


class ClusterEnv:
    def __init__(self, root: Path, api, *, nodes: int = 3, simulate: str = "H100:2", split: int = 10,
                 mode: str = "gate", extra_config: str = "", web: bool = False, front: bool = False,
                 reconcile_interval: float = 1.0, deployed_timings: bool = False, dra: str = "",
                 strategy: str = "envvar") -> None:
        """``dra``: every node's ``draDevices`` (:class:`NodeEnv`); ``strategy``: every node's
        ``deviceListStrategy``;
        ``web``: every daemon serves the web view on loopback, at ``web_ports[i]``;
        ``reconcile_interval``: each daemon's ``reconcileInterval`` (1 s: tests see releases soon;
        the benches pass the daemon's default);
        ``deployed_timings``: gossip and leader election at the daemon's defaults (gossip every
        0.2 s, probes every 1 s, a Lease of 15 s tried every 2 s) instead of the tests' quick ones
        (0.05 s, 0.5 s, 3 s, 0.5 s: a test sees a member or a leader change soon), for benches: at
        50 daemons the quick ones are 100 Lease reads a second at the API server and four times the
        gossip, a load no deployed cluster carries;
        ``front``: each daemon's webhook and extender ports served by ``hamid front``
        with no capabilities, as in the chart (:class:`NodeEnv`)."""
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.api = api
        self.mode = mode
        from hamid.webhook.certs import ensure

        # one serving certificate for every daemon, as the chart mounts one Secret into each pod
        self.tls = ensure(root / "tls", ["127.0.0.1", "hamid-webhook.kube-system.svc"])
        # extender mode: kube-scheduler's client certificate from the same CA, as the chart makes it
        from hamid.webhook.certs import Issued, issue

        ca = Issued((root / "tls" / "ca.key").read_bytes(), (root / "tls" / "ca.pem").read_bytes())
        client = issue(ca, ["system:kube-scheduler"], client=True)
        self.client_cert, self.client_key = root / "tls" / "client.crt", root / "tls" / "client.key"
        self.client_cert.write_bytes(client.cert_pem)
        self.client_key.write_bytes(client.key_pem)
        os.chmod(self.client_key, 0o600)
        if mode == "extender":
            extra_config = (f"extenderClientCAFile: {self.tls.ca}\nextenderClientCertFile: {self.client_cert}\n"
                            f"extenderClientKeyFile: {self.client_key}\n{extra_config}")
        key = root / "gossip.key"
        key.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
        os.chmod(key, 0o600)
        ports = free_ports(5 * nodes)
        self.ports = [tuple(ports[4 * i:4 * i + 4]) for i in range(nodes)]
        first_gossip = f"127.0.0.1:{self.ports[0][0]}"
        self.web_ports = ports[4 * nodes:] if web else []
        self.nodes: list[NodeEnv] = []
        quick_gossip = "" if deployed_timings else "gossipProbeInterval: 0.5\ngossipInterval: 0.05\n"
        quick_lease = "" if deployed_timings else ("leaderElectionLeaseDuration: 3\nleaderElectionRenewDeadline: 2\n"
                                                   "leaderElectionRetryPeriod: 0.5\n")
        from hamid.config.schema import Config

        self.lease_retry_s = Config().leaderElectionRetryPeriod if deployed_timings else 0.5
        for i in range(nodes):
            gossip, peer, webhook, extender = self.ports[i]
            web_line = f"webListen: 127.0.0.1:{self.web_ports[i]}\n" if web else ""
            cfg = (f"gossipListen: 127.0.0.1:{gossip}\ngossipKeyFile: {key}\n"
                   f"gossipJoin: [{first_gossip}]\n{quick_gossip}"
                   f"peerListen: 127.0.0.1:{peer}\n"
                   f"controlMode: {mode}\nwebhookListen: 127.0.0.1:{webhook}\nextenderListen: 127.0.0.1:{extender}\n"
                   f"webhookCertFile: {self.tls.cert}\nwebhookKeyFile: {self.tls.key}\n"
                   f"{quick_lease}{web_line}{extra_config}")
            self.nodes.append(NodeEnv(root / f"n{i}", api, node=f"node-{i}", simulate=simulate, split=split,
                                      reconcile_interval=reconcile_interval, dra=dra, strategy=strategy,
                                      extra_config=cfg, front=front))

    def extender_tls(self) -> dict:
        """kube-scheduler's tlsConfig for this cluster's extender."""
        return {"certFile": str(self.client_cert), "keyFile": str(self.client_key), "caFile": str(self.tls.ca),
                "serverName": "hamid-webhook.kube-system.svc"}

    def start(self, webhook: bool = True) -> "ClusterEnv":
        try:
            for n in self.nodes:
                n.start()
            if webhook:
                self.register_webhook()
            self.wait_converged()
        except BaseException:
            self.stop()  # no daemon outlives a failed start
            raise
        return self

    def wait_converged(self, timeout: float = 180.0) -> None:  # a wait, not a bound: machines share cores
        """Until every daemon's gossip holds every node alive with its capacity: a daemon joins the group
        only once all its listeners are bound, so right after start the leader may not see the last node."""
        from hamid.localapi.client import LocalClient

        want = {n.node for n in self.nodes}
        deadline = time.time() + timeout
        for n in self.nodes:
            while True:
                try:
                    with LocalClient(n.state, timeout=5) as c:
                        members = c.cluster()["members"]
                    if {m["name"] for m in members if m["state"] == "alive" and m["capacity"]} >= want:
                        break
                except Exception:  # the daemon still starting
                    pass
                if time.time() > deadline:
                    raise AssertionError(f"{n.node} does not see every node in gossip after {timeout} s")
                time.sleep(0.1)

    def _webhook_endpoint(self, namespace: str, name: str, port: int) -> str:
        """The Service ``hamid-webhook`` as kube-proxy would route it: to a daemon that runs."""
        for i, n in enumerate(self.nodes):
            if n.proc is not None and n.proc.poll() is None:
                return f"127.0.0.1:{self.ports[i][2]}"
        raise ConnectionError("no daemon runs")

    def register_webhook(self, failure_policy: str = "Fail") -> None:
        """hamid's MutatingWebhookConfiguration, as the chart installs it: pods CREATE and UPDATE,
        through the Service every daemon backs, with the CA of the shared certificate."""
        self.api.webhooks.service_resolver = self._webhook_endpoint
        try:
            self.api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}})
        except Exception:
            pass  # there already
        self.api.create({"apiVersion": "v1", "kind": "Service",
                         "metadata": {"name": "hamid-webhook", "namespace": "kube-system"},
                         "spec": {"selector": {"app.kubernetes.io/name": "hamid"},
                                  "ports": [{"port": 443, "targetPort": 9443}]}})
        self.api.create({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "hamid"},
            "webhooks": [{
                "name": "pods.hamid.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                "failurePolicy": failure_policy, "timeoutSeconds": 10,
                "clientConfig": {"service": {"namespace": "kube-system", "name": "hamid-webhook",
                                             "path": "/mutate", "port": 443},
                                 "caBundle": base64.b64encode(self.tls.ca.read_bytes()).decode()},
                "rules": [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"]}],
                "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                                            "operator": "NotIn", "values": ["kube-system"]}]},
            }]})

    def stop(self) -> None:
        for n in self.nodes:
            try:
                n.stop()
            except Exception:
                pass

    def leader(self, timeout: float = 15.0) -> int:
        """The index of the node whose daemon holds the Lease."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                lease = self.api.get("Lease", "kube-system", "hamid-leader")
                holder = (lease.get("spec") or {}).get("holderIdentity")
                for i, n in enumerate(self.nodes):
                    if holder == n.node and n.proc is not None:
                        return i
            except Exception:
                pass
            time.sleep(0.1)
        raise AssertionError("no leader elected")

    def kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        kubectl = os.environ.get("KUBECTL", "kubectl")
        return subprocess.run([kubectl, "--kubeconfig", self.nodes[0].kubeconfig, *args], input=stdin,
                              capture_output=True, text=True, timeout=60)


__all__ = ["POD_YAML", "ClusterEnv", "RESOURCE", "free_port"]
