"""The Helm chart installed as an operator installs it, on the stand-ins.

1. ``kubectl apply`` (Debian's kubectl) of the manifests Helm's own SDK
   renders from ``charts/hamid`` to the API-server stand-in, served over
   HTTPS with service-account tokens and RBAC enforced, so the daemons get
   exactly the rights the chart's roles grant them.
2. The DaemonSet's pods made as the DaemonSet controller makes them and
   started as kubelet starts them (:mod:`podrunner`): the chart's command,
   arguments, downward-API environment, config file from the ConfigMap, the
   Secrets, the host paths (each node with its own, its kubelet stand-in's
   sockets at ``/var/lib/kubelet/...``), the service-account token, each pod
   in its own network namespace with its own pod IP.
3. They come up, find each other through the pod list, elect a leader, serve
   the webhook behind the chart's Service with the chart's certificate, and
   place a GPU pod applied with kubectl: gated, placed, bound by the
   kube-scheduler stand-in, admitted by its node's kubelet stand-in and
   started with its limits. No request of theirs was refused by RBAC.

Also: an upgrade keeps the gossip keyring and the webhook certificate (Helm's
``lookup`` answered by the stand-in through the SDK's server dry-run, then the
upgrade applied with kubectl).
"""

from __future__ import annotations

import base64

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from clusterenv import POD_YAML

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra (make test installs it)")

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "hamid"
NS = "kube-system"
SA_USER = f"system:serviceaccount:{NS}:hamid"

# Values a test cluster needs: simulated GPUs, and the timings of the other cluster tests
# (a 3 s lease instead of 15 s, fast gossip) so that the test runs in seconds.
TEST_VALUES = {"config": {
    "simulate": "H100:2", "healthCheckInterval": 0.2, "reconcileInterval": 1,
    "leaderElectionLeaseDuration": 3, "leaderElectionRenewDeadline": 2, "leaderElectionRetryPeriod": 0.5,
    "gossipProbeInterval": 0.5, "gossipInterval": 0.05}}

def render(values: dict, *, helm_owned: bool = True) -> list[dict]:
    """The chart's manifests as ``helm install`` sends them (with the ownership annotations
    Helm puts on what it creates, so a later Helm run may adopt them)."""
    out = helm.Chart.load(str(CHART)).render(values, name="hamid", namespace=NS)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        for d in yaml.safe_load_all(text):
            if d:
                if helm_owned:
                    d["metadata"].setdefault("annotations", {}).update(
                        {"meta.helm.sh/release-name": "hamid", "meta.helm.sh/release-namespace": NS})
                docs.append(d)
    return docs


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([os.environ.get("KUBECTL", "kubectl"), "--kubeconfig", kubeconfig, *args], input=stdin,
                          capture_output=True, text=True, timeout=120)


def apply(kubeconfig: str, docs: list[dict], tmp: Path) -> str:
    f = tmp / f"manifests-{time.monotonic_ns()}.yaml"
    f.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    r = kubectl(kubeconfig, "apply", "-f", str(f))
    assert r.returncode == 0, r.stderr
    return r.stdout


def need_kubectl() -> None:
    if not shutil.which(os.environ.get("KUBECTL", "kubectl")):
        pytest.skip("kubectl is not installed (make test installs Debian's kubernetes-client)")


def test_an_upgrade_keeps_the_gossip_keyring_and_the_webhook_certificate(tmp_path):
    """``helm upgrade`` renders with ``lookup`` against the cluster: the Secrets made at install
    come back unchanged (and the caBundle with them) while the config change goes through."""
    need_kubectl()
    from apiserver import ApiServer

    with ApiServer() as api:
        kc = api.write_kubeconfig(tmp_path / "admin.kubeconfig")
        apply(kc, render({}), tmp_path)  # the install
        keys = api.get("Secret", NS, "hamid-gossip")["data"]
        tls = api.get("Secret", NS, "hamid-webhook-tls")["data"]
        ca = api.get("MutatingWebhookConfiguration", None, "hamid")["webhooks"][0]["clientConfig"]["caBundle"]
        assert ca == tls["ca.crt"]

        cfg = helm.Config(kubeconfig_path=kc, namespace=NS, storage_driver="memory")
        try:
            # the upgrade's render, lookup answered by the cluster (server dry run: nothing written)
            got = cfg.install(str(CHART), "hamid", {"config": {"deviceSplitCount": 4}}, namespace=NS,
                              dry_run="server")
        finally:
            cfg.close()
        upgrade = [d for d in yaml.safe_load_all(got["manifest"]) if d]
        assert "deviceSplitCount: 10" in api.get("ConfigMap", NS, "hamid-config")["data"]["config.yaml"]  # dry run
        secrets = {d["metadata"]["name"]: d["data"] for d in upgrade if d["kind"] == "Secret"}
        assert secrets["hamid-gossip"] == keys
        assert secrets["hamid-webhook-tls"] == tls
        hook = next(d for d in upgrade if d["kind"] == "MutatingWebhookConfiguration")
        assert hook["webhooks"][0]["clientConfig"]["caBundle"] == ca
        for d in upgrade:
            d["metadata"].setdefault("annotations", {})["meta.helm.sh/release-name"] = "hamid"
        apply(kc, upgrade, tmp_path)
        assert api.get("Secret", NS, "hamid-gossip")["data"] == keys
        assert api.get("Secret", NS, "hamid-webhook-tls")["data"] == tls
        assert "deviceSplitCount: 4" in api.get("ConfigMap", NS, "hamid-config")["data"]["config.yaml"]

        # a fresh install (nothing to look up) gets a key of its own
        cfg = helm.Config(kubeconfig_path=kc, namespace=NS, storage_driver="memory")
        try:
            fresh = cfg.install(str(CHART), "other", {}, namespace="default", dry_run="server")
        finally:
            cfg.close()
        other = {d["metadata"]["name"]: d["data"] for d in yaml.safe_load_all(fresh["manifest"])
                 if d and d["kind"] == "Secret"}
        assert other["other-hamid-gossip"] != keys


def wait_leader(api, names: set[str], other_than: str | None = None, timeout: float = 30.0) -> str:
    """The pod holding the chart's Lease once it is one of ``names`` (and not ``other_than``) and
    its pod carries the leader label, alone among ``names`` (what the extender Service selects)."""
    deadline = time.time() + timeout
    holder = None
    while time.time() < deadline:
        try:
            holder = api.get("Lease", NS, "hamid-leader")["spec"].get("holderIdentity")
        except Exception:
            holder = None
        if holder in names and holder != other_than:
            labelled = {n for n in names
                        if api.get("Pod", NS, n)["metadata"].get("labels", {}).get("hamid.io/leader") == "true"}
            if labelled == {holder}:
                return holder
        time.sleep(0.1)
    raise AssertionError(f"no leader among {sorted(names)} (other than {other_than!r}): the Lease names {holder!r}")


def free_node_port() -> int:
    import random
    import socket

    for _ in range(100):
        port = random.randint(30000, 32767)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in the NodePort range")


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.parametrize("mode", ["gate", "extender"])
def test_the_chart_applied_with_kubectl_runs_as_daemonset_pods_and_places_a_gpu_pod(tmp_path, mode):
    need_kubectl()
    from podrunner import Image, PodNetwork, PodRunner

    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, mount namespaces)")
    missing = PodNetwork.missing_tools()
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (make test installs them)")
    from apiserver import ApiServer
    from kubelet import KubeletStandIn
    from scheduler import SchedulerStandIn

    from hamid.shimlimits import decode

    nodes = ["gpu-0", "gpu-1", "gpu-2"]
    kubelets = {n: KubeletStandIn(Path(tempfile.mkdtemp(prefix="hk-")), node_name=n) for n in nodes}
    with PodNetwork() as net, ApiServer(tls=True, host=net.gateway, authorize=True, bookmark_interval=0.2) as api:
        kc = api.write_kubeconfig(tmp_path / "admin.kubeconfig")
        runner = PodRunner(api, net, tmp_path / "pods", images={"*": Image(path=str(REPO / ".venv" / "bin"))},
                           host_path=lambda node, path: {
                               "/var/lib/kubelet/device-plugins": kubelets[node].root / "device-plugins",
                               "/var/lib/kubelet/pod-resources": kubelets[node].root / "pod-resources",
                               "/dev": "/dev"}.get(path))
        sched = None
        try:
            with runner:
                api.webhooks.service_resolver = runner.service_resolver  # kube-proxy's part for the webhook
                for k in kubelets.values():
                    k.start()
                values = dict(TEST_VALUES, mode=mode)
                if mode == "extender":  # the NodePort the test's kube-proxy relay may take on this machine
                    port = free_node_port()
                    values["extender"] = {"nodePort": port, "urlPrefix": f"https://127.0.0.1:{port}",
                                          "schedulerTLSDir": str(tmp_path / "scheduler-tls")}
                out = apply(kc, render(values), tmp_path)
                assert "daemonset.apps/hamid created" in out, out
                for n in nodes:
                    runner.register_node(n, labels={"gpu": "on"})
                pods = runner.pods_for(api.get("DaemonSet", NS, "hamid"), nodes)
                assert [p["spec"]["nodeName"] for p in pods] == nodes
                for p in pods:
                    runner.start(p)
                for p in pods:
                    runner.wait_ready(p, timeout=60)  # the chart's readiness probe: the webhook answers

                # each daemon registered with its node's kubelet: 2 GPUs x deviceSplitCount 10
                for n, k in kubelets.items():
                    k.wait_for_devices("nvidia.com/gpu", 20, timeout=30)
                    n_dev = str(len(k.healthy("nvidia.com/gpu")))
                    api.set_status("Node", None, n, {"capacity": {"nvidia.com/gpu": n_dev},
                                                     "allocatable": {"nvidia.com/gpu": n_dev}})

                # a leader elected over the chart's Lease, its pod alone labelled for the extender Service
                names = {p["metadata"]["name"] for p in pods}
                holder = wait_leader(api, names)

                config = None
                if mode == "extender":  # what the operator gives kube-scheduler: the chart's own file
                    config = yaml.safe_load(api.get("ConfigMap", NS, "hamid-scheduler-config")["data"]["config.yaml"])
                    runner.expose_node_port(NS, "hamid-extender")  # kube-proxy: the NodePort to the leader's pod
                    # the operator copies kube-scheduler's TLS files out of the Secrets (contrib/kubelet/README.md)
                    tls_dir = tmp_path / "scheduler-tls"
                    tls_dir.mkdir()
                    client = api.get("Secret", NS, "hamid-extender-client")["data"]
                    for name, data in (("extender-client.crt", client["tls.crt"]),
                                       ("extender-client.key", client["tls.key"]),
                                       ("extender-ca.crt", api.get("Secret", NS, "hamid-webhook-tls")["data"]["ca.crt"])):
                        (tls_dir / name).write_bytes(base64.b64decode(data))
                sched = SchedulerStandIn(api, config=config, period=0.2).start()

                # kubectl through the chart's webhook (Service + chart-generated certificate)
                bad = kubectl(kc, "apply", "-f", "-", stdin=POD_YAML.format(name="bad", mem=4000, cores=-5))
                assert bad.returncode != 0 and 'admission webhook "pods.hamid.io" denied the request' in bad.stderr, \
                    bad.stderr
                ok = kubectl(kc, "apply", "-f", "-", stdin=POD_YAML.format(name="good", mem=6000, cores=30))
                assert ok.returncode == 0, ok.stderr
                node = sched.wait_bound("default", "good", timeout=60)
                pod = api.get("Pod", "default", "good")
                assert pod["metadata"]["annotations"]["hami.io/vgpu-node"] == node
                assert not pod["spec"].get("schedulingGates")
                assert pod["spec"]["nodeName"] == node

                # kubelet's side: admitted on that node, started with its limits
                got = kubelets[node].admit(pod)
                assert got.admitted, got.message
                cfg = kubelets[node].start_container(pod, "main")
                inside = Path(cfg.mount("/usr/local/vgpu/hamid.limits").host_path)
                state = runner.host_path(node, "/var/lib/hamid")
                limits = decode((state / inside.relative_to("/var/lib/hamid")).read_bytes())
                (d,) = limits.devices
                assert (d.memory_bytes >> 20, d.sm_percent) == (6000, 30)

                # a rolling update replaces that node's daemon: the running GPU pod keeps its limits file
                # and its reservation, the new daemon re-registers with kubelet and still releases the
                # pod when it ends
                from hamid.localapi.client import LocalClient

                limits_file = state / inside.relative_to("/var/lib/hamid")
                before = limits_file.read_bytes()
                daemon = next(p for p in pods if p["spec"]["nodeName"] == node)
                runner.stop(daemon)  # SIGTERM, as the rollout's deletion of the old pod
                runner.restart(daemon)
                runner.wait_ready(daemon, timeout=60)
                kubelets[node].wait_for_devices("nvidia.com/gpu", 20, timeout=30)
                assert limits_file.read_bytes() == before
                uid = pod["metadata"]["uid"]
                with LocalClient(state) as c:
                    assert [r["owner"] for r in c.reservations()] == [f"pod:{uid}"]
                kubelets[node].remove_pod(pod)
                api.delete("Pod", "default", "good", grace_period=0)
                deadline = time.time() + 15
                while time.time() < deadline:
                    with LocalClient(state) as c:
                        if not c.reservations():
                            break
                    time.sleep(0.1)
                with LocalClient(state) as c:
                    assert c.reservations() == [], "the restarted daemon did not release the deleted pod"

                # RBAC: the daemons did their work with the chart's roles, and nothing was refused
                mine = [a for a in api.audit if a.get("user") == SA_USER]
                denied = [a for a in mine if not a.get("allowed")]
                assert not denied, [(a.get("verb"), a.get("resource"), a.get("subresource"), a.get("namespace"),
                                     a.get("name")) for a in denied[:5]]
                used = {(a.get("verb"), a.get("resource"), a.get("subresource") or "") for a in mine}
                needs = [("update", "leases", ""), ("watch", "pods", ""), ("patch", "nodes", "status")]
                needs += [("update", "pods", "")] if mode == "gate" else [("create", "pods", "binding"),
                                                                         ("patch", "pods", "")]
                for need in needs:
                    assert need in used, (need, sorted(used))

                # failover: the leader's daemon SIGKILLed; another pod takes the Lease and the label
                # (the extender Service follows it), and places the next pod
                holder = wait_leader(api, names)  # now (the rolling update may have moved the Lease)
                runner.kill(next(p for p in pods if p["metadata"]["name"] == holder))
                t0 = time.time()
                new = wait_leader(api, names, other_than=holder, timeout=30)
                print(f"{mode}: {new} took over from {holder} in {time.time() - t0:.1f} s")
                ok = kubectl(kc, "apply", "-f", "-", stdin=POD_YAML.format(name="after", mem=2000, cores=10))
                assert ok.returncode == 0, ok.stderr
                try:
                    node = sched.wait_bound("default", "after", timeout=60)
                except TimeoutError:  # what the surviving daemons said, for whoever reads the failure
                    for p in pods:
                        obj = api.get("Pod", NS, p["metadata"]["name"])
                        print(f"--- {p['metadata']['name']} on {p['spec']['nodeName']}: labels "
                              f"{obj['metadata'].get('labels')}, conditions {obj.get('status', {}).get('conditions')}")
                        print("\n".join(runner.logs(p).splitlines()[-60:]))
                    raise
                killed = next(p for p in pods if p["metadata"]["name"] == holder)["spec"]["nodeName"]
                print(f"{mode}: 'after' bound to {node} {time.time() - t0:.1f} s after the kill of {killed}'s daemon")
                assert node != killed, "placed on the node whose daemon was killed"
                after = api.get("Pod", "default", "after")
                assert after["metadata"]["annotations"]["hami.io/vgpu-node"] == node
                got = kubelets[node].admit(after)
                assert got.admitted, got.message
        finally:
            if sched is not None:
                sched.stop()
            for k in kubelets.values():
                k.stop()
                shutil.rmtree(k.root, ignore_errors=True)
