"""The Helm chart (charts/hamid), rendered and linted by Helm's own Go SDK
(the ``helm-python-sdk`` wheel), every manifest validated by
``kubernetes-validate`` in strict mode against each Kubernetes minor from 1.29
to the newest it knows, and the config file the chart writes read by hamid's
own config loader.

What an operator relies on: ``helm install`` renders a DaemonSet and nothing
that runs a scheduler; every mode and option renders manifests the API server
accepts; the ConfigMap is a config ``hamid run --config`` accepts; the values
that the chart owns cannot be overridden into disagreement.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is in the test extra (make test installs it)")
kv = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the test extra")

CHART = Path(__file__).resolve().parents[2] / "charts" / "hamid"
NAMESPACE = "kube-system"

# Every mode and option the values document, each rendered, linted and validated.
VARIANTS = {
    "default": {},
    "extender": {"mode": "extender"},
    "none": {"mode": "none"},
    "admission-policy": {"admissionPolicy": {"enabled": True}},
    "host-network": {"hostNetwork": True, "ports": {"webhook": 9443}},
    "dashboard": {"dashboard": {"enabled": True}},
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    "renamed-resources": {"config": {"resourceCountName": "example.com/vgpu",
                                     "resourceMemoryName": "example.com/vgpu-memory"}},
    "dra": {"dra": {"enabled": True, "extendedResourceName": "gpu.hamid.io/gpu"}, "config": {"draDevices": "all"}},
    "existing-secrets": {"gossip": {"existingSecret": "my-keys"},
                         "webhook": {"certificate": {"existingSecret": "my-tls"}}},
}
# kinds that would run a scheduler or any other workload than the one DaemonSet
FORBIDDEN_KINDS = {"Deployment", "StatefulSet", "ReplicaSet", "ReplicationController", "Job", "CronJob", "Pod"}


def _versions() -> list[str]:
    """1.29.0 up to the newest minor kubernetes-validate has schemas for."""
    newest = tuple(int(x) for x in kv.latest_version().split(".")[:2])
    return [f"1.{m}.0" for m in range(29, newest[1] + 1)]


def render(values: dict | None = None, name: str = "hamid") -> list[dict]:
    out = helm.Chart.load(str(CHART)).render(values or {}, name=name, namespace=NAMESPACE)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append(doc)
    return docs


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name or ''}: {len(found)} rendered"
    return found[0]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_renders_one_daemonset_and_no_scheduler_workload(variant):
    docs = render(VARIANTS[variant])
    kinds = [d["kind"] for d in docs]
    assert not FORBIDDEN_KINDS & set(kinds), kinds
    assert kinds.count("DaemonSet") == 1
    ds = one(docs, "DaemonSet")
    c, *rest = ds["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["hamid"] and c["args"][:3] == ["run", "--config", "/etc/hamid/config.yaml"]
    # every port a caller outside the node reaches (webhook, extender, metrics, peer API, gossip) is served
    # by the front container, unprivileged; the privileged daemon serves them only on frontDir's sockets
    (w,) = rest
    mode = VARIANTS[variant].get("mode", "gate")
    assert w["name"] == "front" and w["args"] == ["front", "--config", "/etc/hamid/config.yaml"]
    sc = w["securityContext"]
    assert sc["runAsNonRoot"] and sc["runAsUser"] != 0 and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] and sc["capabilities"] == {"drop": ["ALL"]} and "privileged" not in sc
    mounts = {m["name"]: m for m in w["volumeMounts"]}
    # nothing of the node; the gossip key opens peer and gossip frames
    assert set(mounts) <= {"config", "webhook-tls", "extender-client-ca", "front", "gossip-keys-front"}
    assert all(m.get("readOnly") for m in mounts.values())
    front_ports = {p["name"] for p in w["ports"]}
    assert "metrics" in front_ports and ("webhook" in front_ports) == (mode != "none")
    assert ("extender" in front_ports) == (mode == "extender")
    assert {"peer", "gossip"} <= front_ports
    # the privileged daemon opens no port a peer or a stranger reaches (the web view is for people, opt-in)
    assert {p["name"] for p in c.get("ports", [])} <= {"web"}
    # ready once its local API answers with the gossiped view (no TCP port of its own to probe)
    assert c["readinessProbe"]["exec"]["command"][:3] == ["hamid", "status", "--cluster"]
    vols = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert vols["front"]["emptyDir"]["medium"] == "Memory"
    assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["front"] == mounts["front"]["mountPath"]
    cfg = yaml.safe_load(one(docs, "ConfigMap", "hamid-config")["data"]["config.yaml"])
    assert cfg["frontDir"] == mounts["front"]["mountPath"] and cfg["frontGroup"] == sc["runAsGroup"]
    if mode == "extender":  # the client CA, never the daemon's client key
        assert vols["extender-client-ca"]["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    if mode != "none":
        assert w["readinessProbe"]["httpGet"]["port"] == "webhook"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint_strict_is_clean(variant):
    for version in (_versions()[0], _versions()[-1]):
        got = helm.lint(str(CHART), VARIANTS[variant], strict=True, namespace=NAMESPACE, kube_version=version)
        assert got["errors"] == [], got
        # severities: 1 info, 2 warning, 3 error; strict lint fails on warnings, and so do we
        assert [m for m in got["messages"] if m["severity"] >= 2] == [], got


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_manifest_validates_strictly_against_every_supported_kubernetes(variant):
    docs = render(VARIANTS[variant])
    for version in _versions():
        for doc in docs:
            if doc["kind"].startswith("MutatingAdmissionPolicy") and version < "1.36.0":
                continue  # the option says 1.36 and newer; the next test shows older ones refuse it
            if doc["kind"].startswith("ValidatingAdmissionPolicy") and version < "1.30.0":
                continue  # rendered only where the API server serves it (1.30+): see the node-restriction test
            if doc["kind"] == "DeviceClass" and version < "1.34.0":
                continue  # rendered only where the API server serves resource.k8s.io/v1 (1.34+)
            if doc["kind"] == "ServiceMonitor":
                continue  # a CRD (Prometheus Operator): test_service_monitor_scrapes_the_metrics_port checks it
            try:
                kv.validate(doc, version, strict=True)
            except (kv.ValidationError, kv.SchemaNotFoundError) as e:
                pytest.fail(f"{variant}: {doc['kind']} {doc['metadata']['name']} invalid for {version}: {e}")


def test_the_admission_policy_exists_only_from_kubernetes_1_36():
    docs = render({"admissionPolicy": {"enabled": True}})
    policy = one(docs, "MutatingAdmissionPolicy")
    binding = one(docs, "MutatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    with pytest.raises((kv.ValidationError, kv.SchemaNotFoundError)):
        kv.validate(policy, "1.35.0", strict=True)
    kv.validate(policy, "1.36.0", strict=True)
    # CEL sees the configured resource names (a renamed count resource is still gated)
    renamed = render({"admissionPolicy": {"enabled": True}, "config": {"resourceCountName": "example.com/vgpu"}})
    cond = one(renamed, "MutatingAdmissionPolicy")["spec"]["matchConditions"][0]["expression"]
    assert '"example.com/vgpu"' in cond and '"nvidia.com/gpumem"' in cond
    # off by default, and only meaningful in gate mode
    assert not by_kind(render(), "MutatingAdmissionPolicy")
    assert not by_kind(render({"mode": "extender", "admissionPolicy": {"enabled": True}}), "MutatingAdmissionPolicy")


def _config_of(docs: list[dict]) -> dict:
    return yaml.safe_load(one(docs, "ConfigMap", "hamid-config")["data"]["config.yaml"])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_configmap_is_a_config_hamid_run_accepts(variant, tmp_path):
    from hamid.config import load_config

    docs = render(VARIANTS[variant])
    path = tmp_path / "config.yaml"
    path.write_text(one(docs, "ConfigMap", "hamid-config")["data"]["config.yaml"])
    c = load_config(path)
    values = VARIANTS[variant]
    assert c.kubernetes is True
    assert c.controlMode == values.get("mode", "gate")
    assert c.stateDir == "/var/lib/hamid" and c.kubeletDir == "/var/lib/kubelet"
    assert c.gossipKeyFile == "/etc/hamid/gossip/gossip.keys"
    assert c.gossipListen == "0.0.0.0:7947" and c.peerListen == "0.0.0.0:7948"
    assert c.daemonPodSelector == "app.kubernetes.io/name=hamid,app.kubernetes.io/instance=hamid"
    for k, v in values.get("config", {}).items():
        assert getattr(c, k) == v
    if c.controlMode != "none":
        assert (c.webhookCertFile, c.webhookKeyFile) == ("/etc/hamid/webhook-tls/tls.crt",
                                                         "/etc/hamid/webhook-tls/tls.key")
    # the files the config names are where the DaemonSet mounts them
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["/etc/hamid/config.yaml"]["subPath"] == "config.yaml"
    gossip = volumes[mounts["/etc/hamid/gossip"]["name"]]["secret"]
    assert {"key": "gossip.keys", "path": "gossip.keys"} in gossip["items"]
    assert gossip["secretName"] == values.get("gossip", {}).get("existingSecret", "hamid-gossip")
    # the web view: on, behind the token the chart mounts where the config says
    assert c.webListen == "0.0.0.0:7949" and c.webTokenFile == "/etc/hamid/web/token"
    web = volumes[mounts["/etc/hamid/web"]["name"]]["secret"]
    assert {"key": "token", "path": "token"} in web["items"] and web["defaultMode"] == 0o400
    assert {"name": "web", "containerPort": 7949, "protocol": "TCP"} in pod["containers"][0]["ports"]
    if c.controlMode != "none":
        tls = volumes[mounts["/etc/hamid/webhook-tls"]["name"]]["secret"]
        assert {i["path"] for i in tls["items"]} == {"tls.crt", "tls.key"} | (
            {"ca.crt"} if c.controlMode == "extender" else set())  # the CA a follower checks the leader with
    for path in (c.stateDir, f"{c.kubeletDir}/device-plugins", f"{c.kubeletDir}/pod-resources", c.cdiSpecDir):
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path  # same path inside and out


def test_a_key_the_chart_owns_is_refused_in_config_naming_the_value_to_set():
    with pytest.raises(helm.HelmError) as e:
        render({"config": {"gossipListen": "0.0.0.0:1234"}})
    assert "config.gossipListen is set by the chart" in str(e.value)


def test_the_webhook_listens_where_managed_control_planes_reach_and_never_on_kubelets_port():
    docs = render()
    assert yaml.safe_load(one(docs, "ConfigMap", "hamid-config")["data"]["config.yaml"])["webhookListen"] == \
        "0.0.0.0:10250"  # pod network: the port GKE private clusters' firewall lets the API server reach
    with pytest.raises(helm.HelmError) as e:
        render({"hostNetwork": True})
    assert "kubelet's own port" in str(e.value) and "ports.webhook" in str(e.value)


def test_values_outside_what_is_accepted_are_refused_by_the_schema():
    for bad, words in (({"mode": "scheduler"}, "mode"), ({"webhook": {"failurePolicy": "Maybe"}}, "failurePolicy"),
                       ({"extender": {"nodePort": 80}}, "nodePort"), ({"ports": {"gossip": 0}}, "gossip")):
        with pytest.raises(helm.HelmError) as e:
            render(bad)
        assert words in str(e.value), (bad, str(e.value))


def test_generated_secrets_are_usable_by_the_daemon(tmp_path):
    from cryptography import x509

    from hamid.keyring import Keyring

    docs = render()
    keys = base64.b64decode(one(docs, "Secret", "hamid-gossip")["data"]["gossip.keys"])
    (tmp_path / "gossip.keys").write_bytes(keys)
    ring = Keyring.load(tmp_path / "gossip.keys")
    assert ring.open(ring.seal(b"hello")) == b"hello"
    assert len(base64.b64decode(keys.decode().strip())) == 32
    # two installs never share a key
    again = render()
    assert one(again, "Secret", "hamid-gossip")["data"] != one(docs, "Secret", "hamid-gossip")["data"]

    token = base64.b64decode(one(docs, "Secret", "hamid-web")["data"]["token"]).decode()
    f = tmp_path / "token"
    f.write_text(token)
    f.chmod(0o400)  # the DaemonSet's defaultMode
    from hamid.web.guard import load_token

    assert load_token(str(f)) == token and len(token) == 40
    assert one(again, "Secret", "hamid-web")["data"] != one(docs, "Secret", "hamid-web")["data"]

    tls = one(docs, "Secret", "hamid-webhook-tls")
    cert = x509.load_pem_x509_certificate(base64.b64decode(tls["data"]["tls.crt"]))
    ca = x509.load_pem_x509_certificate(base64.b64decode(tls["data"]["ca.crt"]))
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "hamid-webhook.kube-system.svc" in names  # the name the API server checks for a service reference
    cert.verify_directly_issued_by(ca)
    hook = one(docs, "MutatingWebhookConfiguration")["webhooks"][0]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca.public_bytes(
        __import__("cryptography.hazmat.primitives.serialization", fromlist=["Encoding"]).Encoding.PEM)
    assert hook["clientConfig"]["service"] == {"name": "hamid-webhook", "namespace": NAMESPACE, "path": "/mutate",
                                               "port": 443}
    # the daemon's own namespace and kube-system are never sent to the webhook (the daemons must
    # start while no webhook answers), and no pod can opt itself out (no objectSelector)
    expr = hook["namespaceSelector"]["matchExpressions"][0]
    assert expr["operator"] == "NotIn" and {"kube-system"} <= set(expr["values"])
    assert "objectSelector" not in hook


def test_rbac_grants_each_mode_only_what_it_uses():
    def rules(docs, kind):
        out = set()
        for role in by_kind(docs, kind):
            for r in role["rules"]:
                for g in r["apiGroups"]:
                    for res in r["resources"]:
                        for v in r["verbs"]:
                            out.add((g, res, v))
        return out

    gate, ext, none = render(), render({"mode": "extender"}), render({"mode": "none"})
    assert ("", "pods", "update") in rules(gate, "ClusterRole") and ("", "pods/binding", "create") not in rules(
        gate, "ClusterRole")
    assert ("", "pods/binding", "create") in rules(ext, "ClusterRole") and ("", "pods", "update") not in rules(
        ext, "ClusterRole")
    assert ("coordination.k8s.io", "leases", "update") in rules(gate, "Role")
    assert not by_kind(none, "Role")
    for docs in (gate, ext, none):  # every daemon's gossip takes only Node names as members (hamid/kube/nodes.py)
        assert {("", "nodes", "list"), ("", "nodes", "watch")} <= rules(docs, "ClusterRole")
    # namespace GPU quotas: the leader follows ResourceQuotas in both modes (read only)
    for docs in (gate, ext):
        assert {("", "resourcequotas", "list"), ("", "resourcequotas", "watch")} <= rules(docs, "ClusterRole")
        assert not {v for g, res, v in rules(docs, "ClusterRole") if res == "resourcequotas"} - {"list", "watch"}
    assert ("", "resourcequotas", "list") not in rules(none, "ClusterRole")
    for docs in (gate, ext, none):
        every = rules(docs, "ClusterRole") | rules(docs, "Role")
        assert not any("*" in rule for rule in every), every  # no wildcards
        assert not any(res == "secrets" for _, res, _ in every)  # the daemons read no Secret through the API


def test_rolling_update_keeps_gpu_pods_alive_and_restarts_on_config_change():
    ds = one(render(), "DaemonSet")
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}
    spec = ds["spec"]["template"]["spec"]
    # the state (ledger, shim, limits files) is on the host: what running pods keep across a restart
    state = next(v for v in spec["volumes"] if v["name"] == "state")
    assert state["hostPath"] == {"path": "/var/lib/hamid", "type": "DirectoryOrCreate"}
    a = ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    b = one(render({"config": {"deviceSplitCount": 4}}), "DaemonSet")["spec"]["template"]["metadata"][
        "annotations"]["checksum/config"]
    assert a != b


def test_extender_mode_renders_what_kube_scheduler_needs():
    docs = render({"mode": "extender"})
    svc = one(docs, "Service", "hamid-extender")
    assert svc["spec"]["selector"]["hamid.io/leader"] == "true"
    assert svc["spec"]["type"] == "NodePort" and svc["spec"]["ports"][0]["nodePort"] == 31999
    cfg = yaml.safe_load(one(docs, "ConfigMap", "hamid-scheduler-config")["data"]["config.yaml"])
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    (ext,) = cfg["extenders"]
    assert ext["urlPrefix"] == "https://127.0.0.1:31999" and ext["nodeCacheCapable"] is True
    assert ext["enableHTTPS"] is True and ext["tlsConfig"]["serverName"] == "hamid-webhook.kube-system.svc"
    # only kube-scheduler may call the extender: the daemons require its client certificate
    secret = one(docs, "Secret", "hamid-extender-client")
    client = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    client.verify_directly_issued_by(ca)
    assert ExtendedKeyUsageOID.CLIENT_AUTH in client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    daemon_cfg = yaml.safe_load(one(docs, "ConfigMap", "hamid-config")["data"]["config.yaml"])
    assert daemon_cfg["extenderClientCAFile"] == "/etc/hamid/extender-client/ca.crt"
    assert daemon_cfg["extenderServerCAFile"] == "/etc/hamid/webhook-tls/ca.crt"
    ds = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in ds["containers"][0]["volumeMounts"]}
    assert mounts["extender-client"] == "/etc/hamid/extender-client"
    vols = {v["name"]: v for v in ds["volumes"]}
    assert vols["extender-client"]["secret"]["secretName"] == "hamid-extender-client"
    assert {"key": "ca.crt", "path": "ca.crt"} in vols["webhook-tls"]["secret"]["items"]
    assert {m["name"] for m in ext["managedResources"]} == {
        "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores",
        "nvidia.com/priority"}
    # the same configuration as contrib/kubelet/ gives kube-scheduler by hand
    contrib = yaml.safe_load((CHART.parents[1] / "contrib" / "kubelet" / "scheduler-config.yaml").read_text())
    assert cfg == contrib
    assert not by_kind(render(), "Service") or all(
        s["metadata"]["name"] != "hamid-extender" for s in by_kind(render(), "Service"))


def test_dashboard_configmap_carries_the_dashboard_file():
    docs = render({"dashboard": {"enabled": True}})
    cm = one(docs, "ConfigMap", "hamid-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["hamid.json"]) == json.loads((CHART / "dashboards" / "hamid.json").read_text())
    assert not [d for d in render() if d["metadata"]["name"] == "hamid-dashboard"]


def test_the_config_value_is_checked_with_the_daemons_own_schema():
    from hamid.config.chartschema import CHART_SCHEMA, updated

    doc = json.loads(CHART_SCHEMA.read_text())
    assert doc == updated(doc), "values.schema.json is stale: run python -m hamid.config.chartschema"
    for config, needle in (({"devicesplitcount": 3}, "additional properties 'devicesplitcount' not allowed"),
                           ({"deviceSplitCount": "x"}, "/config/deviceSplitCount"),
                           ({"nodeconfig": [{"name": "n", "operatingMode": "mix"}]},
                            "/config/nodeconfig/0/operatingMode")):
        with pytest.raises(Exception, match=needle):
            render({"config": config})
    render({"config": {"deviceSplitCount": 4, "nodeconfig": [{"name": "n", "operatingMode": "mig"}]}})


def test_service_monitor_scrapes_the_metrics_port():
    assert not by_kind(render(), "ServiceMonitor")  # off by default: it needs the operator's CRDs
    docs = render({"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}})
    sm = one(docs, "ServiceMonitor")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1" and sm["metadata"]["labels"]["release"] == "prom"
    svc = one(docs, "Service", "hamid-metrics")
    ds = one(docs, "DaemonSet")
    # the Service selects the daemon's pods, and the ServiceMonitor selects the Service
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    (ep,) = sm["spec"]["endpoints"]
    (port,) = svc["spec"]["ports"]
    assert ep["port"] == port["name"] == "metrics" and ep["path"] == "/metrics"
    (c,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "front"]  # serves /metrics
    assert {"name": "metrics", "containerPort": port["port"], "protocol": "TCP"} in c["ports"]
    assert port["targetPort"] == "metrics"


def test_the_admission_policy_gates_exactly_the_gpu_pods_its_cel_selects():
    """The policy's matchConditions evaluated by a CEL implementation (cel-python) on the pods a
    user creates; the stand-in API server does not run CEL, so this is where the expressions are
    checked. The mutation (ApplyConfiguration's typed object construction, Kubernetes-specific) is
    only parsed."""
    celpy = pytest.importorskip("celpy", reason="cel-python is in the test extra")
    docs = render({"admissionPolicy": {"enabled": True}, "config": {"resourceCountName": "example.com/vgpu"}})
    policy = one(docs, "MutatingAdmissionPolicy")
    env = celpy.Environment()
    conditions = [env.program(env.compile(c["expression"])) for c in policy["spec"]["matchConditions"]]

    def gated(pod: dict) -> bool:
        return all(bool(p.evaluate({"object": celpy.json_to_cel(pod)})) for p in conditions)

    def pod(limits=None, init_limits=None, **spec) -> dict:
        p = {"spec": {"containers": [{"name": "main", "image": "x"}], **spec}}
        if limits is not None:
            p["spec"]["containers"][0]["resources"] = {"limits": limits}
        if init_limits is not None:
            p["spec"]["initContainers"] = [{"name": "init", "image": "x", "resources": {"limits": init_limits}}]
        return p

    assert gated(pod({"example.com/vgpu": "1"}))
    assert gated(pod({"nvidia.com/gpumem": "4096", "cpu": "1"}))
    assert gated(pod({"cpu": "1"}, init_limits={"nvidia.com/gpucores": "30"}))
    assert not gated(pod({"nvidia.com/gpu": "1"}))  # renamed: this install does not own nvidia.com/gpu
    assert not gated(pod())
    assert not gated(pod({"cpu": "1", "memory": "1Gi"}))
    assert not gated(pod({"example.com/vgpu": "1"}, nodeName="gpu-node-1"))  # gates cannot sit beside nodeName
    assert not gated(pod({"example.com/vgpu": "1"}, schedulingGates=[{"name": "hamid.io/placement"}]))
    assert gated(pod({"example.com/vgpu": "1"}, schedulingGates=[{"name": "other.io/gate"}]))
    (mutation,) = policy["spec"]["mutations"]
    assert mutation["patchType"] == "ApplyConfiguration"
    env.compile(mutation["applyConfiguration"]["expression"])  # parses as CEL
    assert '"hamid.io/placement"' in mutation["applyConfiguration"]["expression"]


def test_each_daemon_may_change_only_its_own_nodes_status():
    """RBAC grants patch nodes/status for every node; the ValidatingAdmissionPolicy narrows it to the
    node in the daemon's pod-bound token (its CEL evaluated with cel-python, as the API server would)."""
    celpy = pytest.importorskip("celpy", reason="cel-python is in the test extra")
    docs = render()
    policy = one(docs, "ValidatingAdmissionPolicy", "hamid-own-node-status")
    binding = one(docs, "ValidatingAdmissionPolicyBinding", "hamid-own-node-status")
    assert binding["spec"] == {"policyName": "hamid-own-node-status", "validationActions": ["Deny"]}
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
                      "resources": ["nodes", "nodes/status"]}]
    env = celpy.Environment()
    (match,) = [env.program(env.compile(c["expression"])) for c in policy["spec"]["matchConditions"]]
    (rule,) = [env.program(env.compile(v["expression"])) for v in policy["spec"]["validations"]]

    def request(user: str, node: str | None) -> dict:
        extra = {"authentication.kubernetes.io/node-name": [node]} if node else {}
        return {"request": celpy.json_to_cel({"userInfo": {"username": user, "extra": extra}}),
                "object": celpy.json_to_cel({"metadata": {"name": "gpu-1"}})}

    daemon = f"system:serviceaccount:{NAMESPACE}:hamid"
    assert bool(match.evaluate(request(daemon, "gpu-1")))
    assert not bool(match.evaluate(request("system:node:gpu-1", "gpu-1")))  # kubelet is NodeRestriction's
    assert bool(rule.evaluate(request(daemon, "gpu-1")))
    assert not bool(rule.evaluate(request(daemon, "gpu-2")))  # another node's daemon
    assert not bool(rule.evaluate(request(daemon, None)))  # a token not bound to a pod
    assert not by_kind(render({"nodeRestriction": {"enabled": False}}), "ValidatingAdmissionPolicy")
    for version in ("1.30.0", _versions()[-1]):
        kv.validate(policy, version, strict=True)


def test_the_network_policy_admits_daemons_to_gossip_and_the_peer_api_only():
    docs = render({"networkPolicy": {"controlPlaneCIDRs": ["10.0.0.0/24"]}})
    np = one(docs, "NetworkPolicy", "hamid")
    ds = one(docs, "DaemonSet")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in np["spec"]["podSelector"]["matchLabels"].items())
    peers, control, metrics = np["spec"]["ingress"]
    assert {p["port"] for p in peers["ports"]} == {7947, 7948}
    (sel,) = peers["from"]
    assert all(pod_labels[k] == v for k, v in sel["podSelector"]["matchLabels"].items())
    assert {p["port"] for p in control["ports"]} == {10250} and control["from"] == [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    assert {p["port"] for p in metrics["ports"]} == {9394} and "from" not in metrics
    ext = one(render({"mode": "extender"}), "NetworkPolicy")
    assert {p["port"] for p in ext["spec"]["ingress"][1]["ports"]} == {10250, 9998}
    assert ds["spec"]["template"]["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
