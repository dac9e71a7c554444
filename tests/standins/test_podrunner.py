"""The pod runner (tests/standins/podrunner.py), kubelet's pod start as a stand-in,
with a small DaemonSet of its own (Python one-liners, not hamid) applied to
the API-server stand-in (HTTPS, RBAC on) by a real kubectl: the environment
from every source and kubelet's ``$(VAR)`` expansion, the volumes seen at their
paths inside and not on the host, the service-account token used by the
official client's in-cluster loader, pods on two nodes reaching each other and
the API server on their own network, readiness in the pod's status, restarts,
deletion. The first tests need neither root nor a network."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import jwt
import pytest
from apiserver import ApiError, ApiServer
from podrunner import (DAEMONSET_TOLERATIONS, SERVICE_ACCOUNT_MOUNT, Image, PodNetwork, PodRunner, PodStartError,
                       atomic_write, daemon_should_run, daemonset_pod, expand, install_serviceaccount_admission,
                       mapping_for)

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"

# ---------------------------------------------------------------------------
# no root needed


# (input, expected) with A=a, B=b, EMPTY="" defined; kubelet's expansion table
EXPANSIONS = [
    ("$(A)", "a"),
    ("___$(B)___", "___b___"),
    ("$(A)-$(B)", "a-b"),
    ("$(EMPTY)", ""),
    ("$$(A)", "$(A)"),             # $$ escapes the operator
    ("$$$(A)", "$a"),
    ("$$$$(A)", "$$(A)"),
    ("$(UNKNOWN)", "$(UNKNOWN)"),  # an unknown name is left as written
    ("x-$(UNKNOWN)-$(A)", "x-$(UNKNOWN)-a"),
    ("$A", "$A"),                  # not an expression
    ("$(A", "$(A"),                # no closer
    ("$(", "$("),
    ("$()", "$()"),
    ("$", "$"),                    # a trailing operator
    ("a$", "a$"),
    ("$$", "$"),
    ("$(A)$", "a$"),
    ("$(A)$(", "a$("),
    ("f00-$$A", "f00-$A"),
    ("$(A)$(B)$(A)", "aba"),
    ("$((A))", "$((A))"),          # the name is "(A", unknown: kept whole
    ("ünï$(A)cödé", "ünïacödé"),
]


@pytest.mark.parametrize("text,want", EXPANSIONS)
def test_expand_follows_kubelets_rules(text, want):
    assert expand(text, mapping_for({"A": "a", "B": "b", "EMPTY": ""})) == want


def test_expand_sees_variables_declared_so_far():
    """In env values kubelet's mapping reads the map being filled: an earlier
    variable is known, a later one is not yet; the first context wins."""
    env: dict[str, str] = {}
    mapping = mapping_for(env, {"SVC": "svc", "A": "shadowed"})
    env["A"] = expand("a", mapping)
    env["B"] = expand("$(A)/$(C)/$(SVC)", mapping)
    env["C"] = "c"
    assert env["B"] == "a/$(C)/svc"


DS = {"apiVersion": "apps/v1", "kind": "DaemonSet",
      "metadata": {"name": "agent", "namespace": "ops", "uid": "ds-uid", "generation": 3,
                   "annotations": {"deprecated.daemonset.template.generation": "2"}},
      "spec": {"selector": {"matchLabels": {"app": "agent"}},
               "template": {"metadata": {"labels": {"app": "agent"}, "annotations": {"a": "1"}},
                            "spec": {"nodeSelector": {"gpu": "yes"},
                                     "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                                      "effect": "NoExecute", "tolerationSeconds": 5},
                                                     {"key": "dedicated", "operator": "Equal", "value": "gpu",
                                                      "effect": "NoSchedule"}],
                                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                                         "nodeSelectorTerms": [{"matchExpressions": [
                                             {"key": "zone", "operator": "In", "values": ["a", "b"]}]}]}}},
                                     "containers": [{"name": "c", "image": "x"}]}}}}


def test_daemonset_pod_is_what_the_controller_creates():
    pod = daemonset_pod(DS, "node-7")
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["generateName"] == "agent-" and "name" not in meta and meta["namespace"] == "ops"
    assert meta["labels"]["app"] == "agent" and meta["labels"]["pod-template-generation"] == "2"
    assert meta["labels"]["controller-revision-hash"] == daemonset_pod(DS, "node-8")["metadata"]["labels"][
        "controller-revision-hash"]
    assert meta["annotations"] == {"a": "1"}
    assert meta["ownerReferences"] == [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent",
                                        "uid": "ds-uid", "controller": True, "blockOwnerDeletion": True}]
    # the required node affinity is replaced by the node's name; the scheduler binds, not the controller
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-7"]}]}]}
    assert "nodeName" not in spec
    # the default tolerations: the pod's own not-ready one (tolerationSeconds) is replaced by the unbounded one
    tols = spec["tolerations"]
    for t in DAEMONSET_TOLERATIONS:
        assert tols.count(t) == 1, t
    assert {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"} in tols
    assert not any(t.get("tolerationSeconds") for t in tols)
    assert len(tols) == len(DAEMONSET_TOLERATIONS) + 1
    # the template itself is not touched
    assert "matchExpressions" in str(DS["spec"]["template"]["spec"]["affinity"])
    host = dict(DS, spec=dict(DS["spec"], template={"spec": {"hostNetwork": True, "containers": []}}))
    assert {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists", "effect": "NoSchedule"} in \
        daemonset_pod(host, "n")["spec"]["tolerations"]


def test_daemonset_runs_only_where_the_template_fits():
    def node(labels, taints=()):
        return {"metadata": {"name": "n", "labels": labels}, "spec": {"taints": list(taints)}}
    ok = {"gpu": "yes", "zone": "a"}
    assert daemon_should_run(DS, node(ok)) == (True, "")
    assert not daemon_should_run(DS, node({"zone": "a"}))[0]  # nodeSelector
    assert not daemon_should_run(DS, node({"gpu": "yes", "zone": "c"}))[0]  # affinity
    assert daemon_should_run(DS, node(ok, [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]))[0]
    refused = daemon_should_run(DS, node(ok, [{"key": "other", "value": "x", "effect": "NoExecute"}]))
    assert refused == (False, "taint other=x:NoExecute not tolerated")
    # the DaemonSet defaults tolerate the node-condition taints, PreferNoSchedule never blocks
    assert daemon_should_run(DS, node(ok, [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                                           {"key": "other", "effect": "PreferNoSchedule"}]))[0]


def test_serviceaccount_admission_mounts_the_token_as_the_plugin_does(api_server):
    api = api_server
    install_serviceaccount_admission(api)
    install_serviceaccount_admission(api)  # once only
    assert len(api.admission_hooks) == 1

    def pod(name, **spec):
        return api.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                           "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "x"}],
                                    "initContainers": [{"name": "i", "image": "x"}], **spec}})

    p = pod("plain")
    assert p["spec"]["serviceAccountName"] == "default"
    assert api.get("ServiceAccount", "default", "default")  # made as the serviceaccounts controller would
    [vol] = [v for v in p["spec"]["volumes"] if v["name"].startswith("kube-api-access-")]
    assert len(vol["name"]) == len("kube-api-access-") + 5
    assert vol["projected"]["defaultMode"] == 420
    srcs = vol["projected"]["sources"]
    assert srcs[0] == {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}
    assert srcs[1]["configMap"]["name"] == "kube-root-ca.crt"
    for c in p["spec"]["containers"] + p["spec"]["initContainers"]:
        assert {"name": vol["name"], "readOnly": True, "mountPath": SERVICE_ACCOUNT_MOUNT} in c["volumeMounts"]

    assert "volumes" not in pod("off", automountServiceAccountToken=False)["spec"]
    api.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "quiet", "namespace": "default"},
                "automountServiceAccountToken": False})
    assert "volumes" not in pod("sa-off", serviceAccountName="quiet")["spec"]
    assert pod("pod-wins", serviceAccountName="quiet", automountServiceAccountToken=True)["spec"]["volumes"]
    with pytest.raises(ApiError) as e:
        pod("nosa", serviceAccountName="ghost")
    assert e.value.code == 403
    assert 'error looking up service account default/ghost: serviceaccount "ghost" not found' in e.value.message


def test_atomic_write_is_kubelets_layout(tmp_path):
    d = tmp_path / "vol"
    atomic_write(d, {"a.txt": (b"1", 0o644), "sub/b.txt": (b"2", 0o400)})
    assert os.readlink(d / "..data").startswith("..") and os.readlink(d / "a.txt") == "..data/a.txt"
    assert os.readlink(d / "sub") == "..data/sub"
    assert (d / "sub" / "b.txt").read_text() == "2"
    assert oct((d / "sub" / "b.txt").stat().st_mode & 0o777) == oct(0o400)
    first = os.readlink(d / "..data")
    atomic_write(d, {"a.txt": (b"3", 0o644)})  # a new generation; "sub" is gone, the old generation too
    assert (d / "a.txt").read_text() == "3" and not os.path.lexists(d / "sub")
    assert not (d / first).exists()
    with pytest.raises(PodStartError, match="must not contain '..'"):
        atomic_write(d, {"../x": (b"", 0o644)})


# ---------------------------------------------------------------------------
# a DaemonSet on the pod network (root, ip, unshare, kubectl)

PROGRAM = """\
import http.server, json, os, signal, socket, sys
open("whoami", "w").write(os.environ["NODE_NAME"])
print("REPORT " + json.dumps({"argv": sys.argv[1:], "env": dict(os.environ), "hostname": socket.gethostname(),
                              "cwd": os.getcwd()}), flush=True)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path != "/ready" or os.path.exists("/var/lib/demo/ready")
        body = os.environ["POD_NAME"].encode()
        self.send_response(200 if ok else 503)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
http.server.ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
"""

SCRATCH = f"/hamid-podrunner-scratch-{os.getpid()}"  # per test process: two suites at once each make and remove their own
MANIFEST = """\
apiVersion: v1
kind: Namespace
metadata: {name: demo}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: demo, namespace: demo}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: demo, namespace: demo}
rules: [{apiGroups: [""], resources: [pods], verbs: [get, list]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: demo, namespace: demo}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: demo}
subjects: [{kind: ServiceAccount, name: demo, namespace: demo}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: demo-config, namespace: demo}
data: {config.yaml: "listen: 8080\\n", other.txt: other}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: demo-env, namespace: demo}
data: {FROM_ENVFROM: cm-value, OVERRIDE: from-envFrom, "bad key": skipped}
---
apiVersion: v1
kind: Secret
metadata: {name: demo-secret, namespace: demo}
stringData: {password: s3cret, user: demo-user}
---
apiVersion: v1
kind: Service
metadata: {name: demo-web, namespace: demo}
spec: {selector: {app: demo}, ports: [{name: http, port: 80, targetPort: web}]}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: demo, namespace: demo}
spec:
  selector: {matchLabels: {app: demo}}
  template:
    metadata:
      labels: {app: demo, tier: test}
      annotations: {demo/note: hello}
    spec:
      serviceAccountName: demo
      terminationGracePeriodSeconds: 3
      containers:
      - name: demo
        image: demo:1
        command: [python3, -c, PROGRAM]
        args: ["$(POD_IP)", "$$(POD_IP)", "$(UNDEFINED_VAR)", "pre-$(NODE_NAME)-post", "$(COMPOSED)"]
        workingDir: /var/lib/demo
        ports: [{name: web, containerPort: 8080}]
        resources: {limits: {memory: 64Mi}}
        env:
        - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
        - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
        - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
        - {name: POD_UID, valueFrom: {fieldRef: {fieldPath: metadata.uid}}}
        - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
        - {name: POD_IPS, valueFrom: {fieldRef: {fieldPath: status.podIPs}}}
        - {name: HOST_IP, valueFrom: {fieldRef: {fieldPath: status.hostIP}}}
        - {name: SA_NAME, valueFrom: {fieldRef: {fieldPath: spec.serviceAccountName}}}
        - {name: LABEL_TIER, valueFrom: {fieldRef: {fieldPath: "metadata.labels['tier']"}}}
        - {name: NOTE, valueFrom: {fieldRef: {fieldPath: "metadata.annotations['demo/note']"}}}
        - {name: COMPOSED, value: "$(POD_NAME)@$(NODE_NAME)/$(LATER)/$$(POD_NAME)/$(KUBERNETES_SERVICE_HOST)"}
        - {name: LATER, value: later}
        - {name: OVERRIDE, value: from-env}
        - {name: FROM_CM, valueFrom: {configMapKeyRef: {name: demo-config, key: other.txt}}}
        - {name: FROM_SECRET, valueFrom: {secretKeyRef: {name: demo-secret, key: password}}}
        - {name: OPTIONAL_MISSING, valueFrom: {configMapKeyRef: {name: demo-config, key: nope, optional: true}}}
        - {name: MEM_MI, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}
        envFrom:
        - configMapRef: {name: demo-env}
        - {prefix: S_, secretRef: {name: demo-secret}}
        readinessProbe: {httpGet: {path: /ready, port: web}, periodSeconds: 1, failureThreshold: 1}
        volumeMounts:
        - {name: config, mountPath: /etc/demo}
        - {name: config, mountPath: /etc/demo-sub/config.yaml, subPath: config.yaml}
        - {name: items, mountPath: /etc/demo-items}
        - {name: secret, mountPath: /etc/demo-secret}
        - {name: secret-default, mountPath: /etc/demo-secret-default}
        - {name: state, mountPath: /var/lib/demo}
        - {name: frozen, mountPath: /var/lib/demo-ro, readOnly: true}
        - {name: scratch, mountPath: /hamid-podrunner-scratch}
        - {name: podinfo, mountPath: /etc/podinfo}
        - {name: bundle, mountPath: /etc/bundle}
      volumes:
      - {name: config, configMap: {name: demo-config}}
      - {name: items, configMap: {name: demo-config, items: [{key: config.yaml, path: sub/renamed.yaml, mode: 384}]}}
      - name: secret
        secret:
          secretName: demo-secret
          defaultMode: 288
          items: [{key: password, path: pw, mode: 256}, {key: user, path: user}]
      - {name: secret-default, secret: {secretName: demo-secret}}
      - {name: state, hostPath: {path: /var/lib/demo, type: DirectoryOrCreate}}
      - {name: frozen, hostPath: {path: /var/lib/demo-ro, type: DirectoryOrCreate}}
      - {name: scratch, emptyDir: {}}
      - name: podinfo
        downwardAPI:
          items:
          - {path: labels, fieldRef: {fieldPath: metadata.labels}}
          - {path: name, fieldRef: {fieldPath: metadata.name}}
      - name: bundle
        projected:
          sources:
          - configMap: {name: demo-config, items: [{key: other.txt, path: cm/other.txt}]}
          - secret: {name: demo-secret, items: [{key: user, path: secret/user}]}
          - downwardAPI: {items: [{path: ns, fieldRef: {fieldPath: metadata.namespace}}]}
          - serviceAccountToken: {path: token, expirationSeconds: 600, audience: demo-aud}
""".replace("PROGRAM", json.dumps(PROGRAM))

HOST_PATHS = ["/etc/demo", "/etc/demo-sub", "/etc/demo-items", "/etc/demo-secret", "/etc/demo-secret-default",
              "/etc/podinfo", "/etc/bundle", "/var/lib/demo", "/var/lib/demo-ro",
              "/run/secrets/kubernetes.io/serviceaccount"]


def _needs() -> list[str]:
    missing = PodNetwork.missing_tools()
    if shutil.which("kubectl") is None and not os.environ.get("KUBECTL"):
        missing.append("kubectl (Debian package kubernetes-client)")
    return missing


@dataclass
class Cluster:
    net: PodNetwork
    api: ApiServer
    runner: PodRunner
    root: Path
    kubeconfig: str

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        binary = os.environ.get("KUBECTL") or shutil.which("kubectl")
        out = subprocess.run([binary, "--kubeconfig", self.kubeconfig, *args], capture_output=True, text=True,
                             timeout=60, env={"PATH": os.environ.get("PATH", ""), "HOME": str(self.root)})
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({out.returncode}): {out.stderr}")
        return out

    def apply_demo(self) -> dict:
        manifest = self.root / "demo.yaml"
        manifest.write_text(MANIFEST)
        self.kubectl("apply", "-f", str(manifest))
        return self.api.get("DaemonSet", "demo", "demo")

    def node_dir(self, node: str, path: str) -> Path:
        return self.runner.host_path(node, path)

    def report(self, pod: dict) -> dict:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            lines = [ln for ln in self.runner.logs(pod).splitlines() if ln.startswith("REPORT ")]
            if lines:
                return json.loads(lines[-1][len("REPORT "):])
            time.sleep(0.05)
        raise AssertionError(f"no report from {pod['metadata']['name']}: {self.runner.logs(pod)}")


@pytest.fixture
def cluster(tmp_path):
    missing = _needs()
    if missing:
        pytest.skip(f"the pod runner needs {', '.join(missing)}")
    preexisting = [p for p in HOST_PATHS + [SCRATCH] if os.path.lexists(p)]
    with PodNetwork() as net:
        with ApiServer(bookmark_interval=0.2, tls=True, host=net.gateway, authorize=True) as api:
            runner = PodRunner(api, net, tmp_path / "pods", images={"demo:1": Image(path=str(VENV_BIN))},
                               backoff=0.5, close_grace=3)
            try:
                yield Cluster(net, api, runner, tmp_path, api.write_kubeconfig(tmp_path / "kubeconfig"))
            finally:
                runner.close()
    # nothing of the pods is left on the host
    assert [p for p in HOST_PATHS + [SCRATCH] if os.path.lexists(p)] == preexisting
    assert str(tmp_path) not in Path("/proc/self/mountinfo").read_text()
    assert f"hpr-{net.tag}-" not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert subprocess.run(["ip", "link", "show", net.bridge], capture_output=True).returncode != 0


def _eventually(fn, want, timeout: float = 5):
    deadline = time.monotonic() + timeout
    while (got := fn()) != want:
        assert time.monotonic() < deadline, f"{got} != {want}"
        time.sleep(0.02)


def _wait_listening(host: str, port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {host}:{port}"
            time.sleep(0.05)


def _exec_json(cluster: Cluster, pod: dict, program: str) -> dict:
    out = cluster.runner.exec(pod, ["python3", "-c", program])
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.root
def test_env_and_command_as_kubelet_builds_them(cluster):
    ds = cluster.apply_demo()
    [pod] = cluster.runner.pods_for(ds, ["node-a"])
    pod = cluster.runner.start(pod)
    name, ip = pod["metadata"]["name"], pod["status"]["podIP"]
    gw, port = cluster.net.gateway, cluster.api.port
    r = cluster.report(pod)
    env = r["env"]
    assert ip == cluster.runner.ip(pod) and ip.startswith(f"10.{cluster.net.octet}.0.")
    want = {
        "NODE_NAME": "node-a", "POD_NAME": name, "POD_NAMESPACE": "demo", "POD_UID": pod["metadata"]["uid"],
        "POD_IP": ip, "POD_IPS": ip, "HOST_IP": gw, "SA_NAME": "demo", "LABEL_TIER": "test", "NOTE": "hello",
        "COMPOSED": f"{name}@node-a/$(LATER)/$(POD_NAME)/{gw}",  # LATER is declared after COMPOSED
        "LATER": "later", "OVERRIDE": "from-env", "FROM_CM": "other", "FROM_SECRET": "s3cret", "MEM_MI": "64",
        "FROM_ENVFROM": "cm-value", "S_password": "s3cret", "S_user": "demo-user",
        "KUBERNETES_SERVICE_HOST": gw, "KUBERNETES_SERVICE_PORT": str(port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(port), "KUBERNETES_PORT": f"tcp://{gw}:{port}",
        f"KUBERNETES_PORT_{port}_TCP_ADDR": gw, "HOSTNAME": name,
    }
    assert {k: env.get(k) for k in want} == want
    assert "OPTIONAL_MISSING" not in env and "bad key" not in env
    svc = cluster.api.get("Service", "demo", "demo-web")["spec"]["clusterIP"]
    assert env["DEMO_WEB_SERVICE_HOST"] == svc and env["DEMO_WEB_SERVICE_PORT_HTTP"] == "80"
    assert env["DEMO_WEB_PORT_80_TCP"] == f"tcp://{svc}:80"
    assert env["PATH"].startswith(f"{VENV_BIN}:")
    assert r["argv"] == [ip, "$(POD_IP)", "$(UNDEFINED_VAR)", "pre-node-a-post", want["COMPOSED"]]
    assert r["hostname"] == name and r["cwd"] == "/var/lib/demo"
    events = [e for e in cluster.api.list("Event", "demo") if e["reason"] == "InvalidEnvironmentVariableNames"]
    assert events and "[bad key]" in events[0]["message"]


CHECK = """\
import json, os, stat
paths = %s
out = {}
for p in paths:
    try:
        st = os.stat(p)
        out[p] = {"mode": oct(stat.S_IMODE(st.st_mode)),
                  "data": open(p).read() if stat.S_ISREG(st.st_mode) else sorted(os.listdir(p))}
    except OSError as e:
        out[p] = {"error": e.strerror}
def write(p):
    try:
        with open(p, "w") as f:
            f.write("x")
        return "ok"
    except OSError as e:
        return e.strerror
out["write"] = {p: write(p) for p in ["/var/lib/demo-ro/x", "/etc/demo/x", "/var/lib/demo/x",
                                       "/hamid-podrunner-scratch/x"]}
print(json.dumps(out))
"""
MANIFEST = MANIFEST.replace("/hamid-podrunner-scratch", SCRATCH)
CHECK = CHECK.replace("/hamid-podrunner-scratch", SCRATCH)


@pytest.mark.root
def test_volumes_are_at_their_paths_inside_and_not_on_the_host(cluster):
    ds = cluster.apply_demo()
    pod_a, pod_b = cluster.runner.pods_for(ds, ["node-a", "node-b"])
    for p in (pod_a, pod_b):
        cluster.runner.start(p)
        cluster.report(p)  # the program ran (it writes whoami first)
    sa = f"{SERVICE_ACCOUNT_MOUNT}/"
    paths = ["/etc/demo/config.yaml", "/etc/demo/other.txt", "/etc/demo-sub/config.yaml",
             "/etc/demo-items/sub/renamed.yaml", "/etc/demo-secret/pw", "/etc/demo-secret/user",
             "/etc/demo-secret-default/password", "/etc/podinfo/labels", "/etc/podinfo/name",
             "/etc/bundle/cm/other.txt", "/etc/bundle/secret/user", "/etc/bundle/ns", "/etc/bundle/token",
             sa + "token", sa + "ca.crt", sa + "namespace", "/var/lib/demo/whoami", "/etc/demo"]
    seen = _exec_json(cluster, pod_a, CHECK % json.dumps(paths))
    data = {p: seen[p].get("data", seen[p].get("error")) for p in paths}
    mode = {p: seen[p].get("mode") for p in paths}
    assert data["/etc/demo/config.yaml"] == data["/etc/demo-sub/config.yaml"] == "listen: 8080\n"
    assert data["/etc/demo/other.txt"] == "other" and data["/etc/demo-items/sub/renamed.yaml"] == "listen: 8080\n"
    # kubelet's layout: ..<timestamp>, ..data, one link a key
    assert data["/etc/demo"][0].startswith("..20") and data["/etc/demo"][1:] == ["..data", "config.yaml", "other.txt"]
    assert data["/etc/demo-secret/pw"] == "s3cret" and data["/etc/demo-secret/user"] == "demo-user"
    assert (mode["/etc/demo/config.yaml"], mode["/etc/demo-items/sub/renamed.yaml"]) == ("0o644", "0o600")
    assert (mode["/etc/demo-secret/pw"], mode["/etc/demo-secret/user"]) == ("0o400", "0o440")
    assert mode["/etc/demo-secret-default/password"] == "0o644"  # defaultMode 420, as kubelet
    assert data["/etc/podinfo/name"] == pod_a["metadata"]["name"]
    assert data["/etc/podinfo/labels"].splitlines()[0] == 'app="demo"'
    assert 'tier="test"' in data["/etc/podinfo/labels"]
    assert (data["/etc/bundle/cm/other.txt"], data["/etc/bundle/secret/user"], data["/etc/bundle/ns"]) == \
        ("other", "demo-user", "demo")
    bundle_claims = jwt.decode(data["/etc/bundle/token"], options={"verify_signature": False})
    assert bundle_claims["aud"] == ["demo-aud"]
    assert bundle_claims["kubernetes.io"]["pod"]["name"] == pod_a["metadata"]["name"]
    assert bundle_claims["exp"] - bundle_claims["iat"] == 600
    assert data[sa + "namespace"] == "demo" and data[sa + "ca.crt"] == cluster.api.ca_pem.decode()
    assert jwt.decode(data[sa + "token"], options={"verify_signature": False})["sub"] == \
        "system:serviceaccount:demo:demo"
    assert mode[sa + "token"] == "0o644"
    assert data["/var/lib/demo/whoami"] == "node-a"
    writes = seen["write"]
    assert writes["/var/lib/demo-ro/x"] == writes["/etc/demo/x"] == "Read-only file system"
    assert writes["/var/lib/demo/x"] == writes[SCRATCH + "/x"] == "ok"
    # each node has its own host directories; the pods wrote there, not to the host's real paths
    assert (cluster.node_dir("node-a", "/var/lib/demo") / "whoami").read_text() == "node-a"
    assert (cluster.node_dir("node-b", "/var/lib/demo") / "whoami").read_text() == "node-b"
    assert (cluster.node_dir("node-a", "/var/lib/demo") / "x").read_text() == "x"
    assert not (cluster.node_dir("node-b", "/var/lib/demo") / "x").exists()
    for p in HOST_PATHS:
        if p not in ("/run/secrets/kubernetes.io/serviceaccount",):
            assert not os.path.lexists(p), f"{p} appeared on the host"
    assert not os.path.exists("/run/secrets/kubernetes.io/serviceaccount/token")
    assert os.path.isdir(SCRATCH)  # a missing top-level directory: made, removed at close
    assert os.listdir(SCRATCH) == []  # the emptyDir is mounted over it inside only
    mounts = Path("/proc/self/mountinfo").read_text()
    assert " /etc/demo " not in mounts and str(cluster.root) not in mounts


@pytest.mark.root
def test_in_cluster_client_works_with_the_mounted_token(cluster):
    """The official client's in-cluster loader finds the token, ca.crt and
    KUBERNETES_SERVICE_HOST/PORT kubelet gave the pod and talks to the API
    server over HTTPS on the pod network with the service account's RBAC."""
    ds = cluster.apply_demo()
    [pod] = cluster.runner.pods_for(ds, ["node-a"])
    cluster.runner.start(pod)
    name = pod["metadata"]["name"]
    program = f"""
import json
from kubernetes import client, config
from kubernetes.client.rest import ApiException
config.load_incluster_config()
v1 = client.CoreV1Api()
me = v1.read_namespaced_pod({name!r}, "demo")
try:
    v1.list_namespaced_secret("demo")
    denied = None
except ApiException as e:
    denied = e.status
print(json.dumps({{"ip": me.status.pod_ip, "node": me.spec.node_name, "host": v1.api_client.configuration.host,
                  "secrets": denied}}))
"""
    got = _exec_json(cluster, pod, program)
    assert got == {"ip": cluster.runner.ip(pod), "node": "node-a",
                   "host": f"https://{cluster.net.gateway}:{cluster.api.port}", "secrets": 403}


@pytest.mark.root
def test_two_nodes_reach_each_other_and_the_api_and_nothing_else(cluster):
    ds = cluster.apply_demo()
    pod_a, pod_b = cluster.runner.pods_for(ds, ["node-a", "node-b"])
    assert [p["spec"]["nodeName"] for p in (pod_a, pod_b)] == ["node-a", "node-b"]
    for p in (pod_a, pod_b):
        cluster.runner.start(p)
    ip_b = cluster.runner.ip(pod_b)
    assert cluster.runner.ip(pod_a) != ip_b
    _wait_listening(ip_b, 8080)
    others = [a for a in subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True)
              .stdout.split() if a.count(".") == 3 and "/" in a]
    outside = [a.split("/")[0] for a in others
               if not a.startswith("127.") and not a.startswith(f"10.{cluster.net.octet}.0.")]
    listener = socket.create_server(("0.0.0.0", 0))
    lport = listener.getsockname()[1]
    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                listener.accept()[0].close()
    threading.Thread(target=accept, daemon=True).start()
    program = f"""
import json, socket, ssl, urllib.request
def tcp(host, port):
    try:
        socket.create_connection((host, port), timeout=2).close()
        return "ok"
    except OSError as e:
        return type(e).__name__
ctx = ssl.create_default_context(cafile="{SERVICE_ACCOUNT_MOUNT}/ca.crt")
version = json.load(urllib.request.urlopen("https://{cluster.net.gateway}:{cluster.api.port}/version", context=ctx))
print(json.dumps({{"peer": urllib.request.urlopen("http://{ip_b}:8080/", timeout=5).read().decode(),
                  "api": version["gitVersion"], "bridge": tcp("{cluster.net.gateway}", {lport}),
                  "outside": {{a: tcp(a, {lport}) for a in {outside!r}}}}}))
"""
    got = _exec_json(cluster, pod_a, program)
    listener.close()
    assert got["peer"] == pod_b["metadata"]["name"]
    assert got["api"].startswith("v1.")
    assert got["bridge"] == "ok"
    assert all(v != "ok" for v in got["outside"].values()), got["outside"]


@pytest.mark.root
@pytest.mark.slow  # several seconds of real time: whole suite only (make test-fast skips it)
def test_readiness_probe_flips_ready_in_the_pods_status(cluster):
    ds = cluster.apply_demo()
    pod_a, pod_b = cluster.runner.pods_for(ds, ["node-a", "node-b"])
    for p in (pod_a, pod_b):
        cluster.runner.start(p)
    time.sleep(1.5)  # a probe or more ran: /ready answers 503 while the flag file is missing
    got = cluster.api.get("Pod", "demo", pod_a["metadata"]["name"])
    assert {c["type"]: c["status"] for c in got["status"]["conditions"]} == {
        "PodReadyToStartContainers": "True", "Initialized": "True", "ContainersReady": "False", "Ready": "False",
        "PodScheduled": "True"}
    assert got["status"]["phase"] == "Running" and got["status"]["containerStatuses"][0]["started"] is True
    assert cluster.api.get("DaemonSet", "demo", "demo")["status"]["numberReady"] == 0
    flag = cluster.node_dir("node-a", "/var/lib/demo") / "ready"
    flag.write_text("")
    t0 = time.monotonic()
    ready = cluster.runner.wait_ready(pod_a, timeout=30)
    assert time.monotonic() - t0 < 10  # periodSeconds 1: a probe soon after the flag (room for a busy machine)
    assert ready["status"]["containerStatuses"][0]["ready"] is True
    def ds_numbers() -> tuple:
        st = cluster.api.get("DaemonSet", "demo", "demo")["status"]
        return st["desiredNumberScheduled"], st["numberReady"], st["numberUnavailable"]
    _eventually(ds_numbers, (2, 1, 1))  # the DaemonSet's status follows the pods' (as its controller, a bit later)
    assert cluster.runner.service_resolver("demo", "demo-web", 80) == f"{cluster.runner.ip(pod_a)}:8080"
    flag.unlink()
    cluster.runner.wait_ready(pod_a, timeout=5, ready=False)
    _eventually(ds_numbers, (2, 0, 2))
    unhealthy = [e["message"] for e in cluster.api.list("Event", "demo")
                 if e["reason"] == "Unhealthy" and e["involvedObject"]["name"] == pod_a["metadata"]["name"]]
    assert "Readiness probe failed: HTTP probe failed with statuscode: 503" in unhealthy


@pytest.mark.root
def test_restarts_in_place_crash_backoff_and_deletion(cluster):
    ds = cluster.apply_demo()
    [pod] = cluster.runner.pods_for(ds, ["node-a"])
    cluster.runner.start(pod)
    name, ip = pod["metadata"]["name"], cluster.runner.ip(pod)
    cluster.report(pod)
    assert cluster.runner.exec(pod, ["sh", "-c", f"echo kept > {SCRATCH}/f"]).returncode == 0

    after = cluster.runner.restart(pod)  # in place: same pod, IP and volumes
    assert after["metadata"]["uid"] == pod["metadata"]["uid"] and after["status"]["podIP"] == ip
    cs = after["status"]["containerStatuses"][0]
    assert cs["restartCount"] == 1 and cs["lastState"]["terminated"]["exitCode"] == 0  # SIGTERM: sys.exit(0)
    assert cluster.runner.exec(pod, ["cat", f"{SCRATCH}/f"]).stdout == "kept\n"
    deadline = time.monotonic() + 10
    while cluster.runner.logs(pod).count("REPORT ") < 2:  # the program ran again, same log file
        assert time.monotonic() < deadline, cluster.runner.logs(pod)
        time.sleep(0.05)

    # a crash: restarted at once the first time, then after the back-off (0.5 s here)
    def restarts() -> int:
        return cluster.api.get("Pod", "demo", name)["status"]["containerStatuses"][0]["restartCount"]

    for want in (2, 3):
        t0 = time.monotonic()
        cluster.runner.send_signal(pod, signal.SIGKILL)
        while restarts() < want:
            assert time.monotonic() - t0 < 10, cluster.api.get("Pod", "demo", name)["status"]
            time.sleep(0.02)
        took = time.monotonic() - t0
    assert took >= 0.5
    cs = cluster.api.get("Pod", "demo", name)["status"]["containerStatuses"][0]
    assert cs["lastState"]["terminated"]["exitCode"] == 137 and cs["lastState"]["terminated"]["reason"] == "Error"
    assert any(e["reason"] == "BackOff" for e in cluster.api.list("Event", "demo"))

    # kubectl delete: kubelet stops the container (SIGTERM) and finishes the deletion
    cluster.kubectl("delete", "pod", "-n", "demo", name, "--wait=false")
    deadline = time.monotonic() + 10
    while True:
        try:
            cluster.api.get("Pod", "demo", name)
        except ApiError as e:
            assert e.code == 404
            break
        assert time.monotonic() < deadline, "the deleted pod was never finished"
        time.sleep(0.05)
    with pytest.raises(KeyError):
        cluster.runner.ip(pod)
    assert f"hpr-{cluster.net.tag}-" not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                            text=True).stdout


@pytest.mark.root
def test_stop_kills_after_the_grace_period_and_errors_name_the_cause(cluster):
    api, runner = cluster.api, cluster.runner

    def pod(name, **extra):
        spec = {"terminationGracePeriodSeconds": 1, "nodeName": "node-a",
                "containers": [{"name": "c", "image": "demo:1", "command": ["python3", "-c", (
                    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\n"
                    "time.sleep(1000)")]}]}
        spec.update(extra)
        return api.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                           "spec": spec})

    p = pod("stubborn")
    runner.start(p)
    deadline = time.monotonic() + 10
    while "up" not in runner.logs(p):  # SIGTERM is ignored from now on
        assert time.monotonic() < deadline
        time.sleep(0.02)
    t0 = time.monotonic()
    runner.stop(p)
    took = time.monotonic() - t0
    assert 1 <= took < 10  # the grace period (1 s) waited, then killed (room for a busy machine)
    cs = api.get("Pod", "default", "stubborn")["status"]["containerStatuses"][0]
    assert cs["state"]["terminated"]["exitCode"] == 137 and not runner.running(p)
    time.sleep(0.5)
    assert not runner.running(p)  # stopped by kubelet: not restarted

    with pytest.raises(PodStartError, match=r"hostPath type check failed: /no/such/dir \(node node-a: .*\) is "
                                            r"not a directory"):
        runner.start(pod("nodir", volumes=[{"name": "v", "hostPath": {"path": "/no/such/dir", "type": "Directory"}}]))
    with pytest.raises(PodStartError, match=r'image "busybox:1" is not one the runner knows'):
        runner.start(pod("noimage", containers=[{"name": "c", "image": "busybox:1", "command": ["true"]}]))
    with pytest.raises(PodStartError, match=r'exec: "no-such-binary": No such file or directory in \$PATH'):
        runner.start(pod("nobinary", containers=[{"name": "c", "image": "demo:1", "command": ["no-such-binary"]}]))
    with pytest.raises(PodStartError, match=r"couldn't find key nope in ConfigMap default/kube-root-ca.crt"):
        runner.start(pod("nokey", containers=[{"name": "c", "image": "demo:1", "command": ["true"], "env": [
            {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "kube-root-ca.crt", "key": "nope"}}}]}]))
    assert sorted(p.key for p in runner.pods.values()) == ["default/stubborn"]  # failed starts left nothing
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert netns.count(f"hpr-{cluster.net.tag}-") == 1


@pytest.mark.root
def test_init_container_startup_and_liveness_probes(cluster):
    """The init container runs to completion first (its file is there for the
    main one), the startup probe (exec, inside the container) gates the others,
    a failing liveness probe gets the container killed and restarted."""
    api, runner = cluster.api, cluster.runner
    work = {"name": "work", "mountPath": "/var/tmp/podrunner-work"}
    pod = api.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probed", "namespace": "default"},
                      "spec": {"nodeName": "node-a", "terminationGracePeriodSeconds": 1,
                               "volumes": [{"name": "work", "emptyDir": {}}],
                               "initContainers": [{"name": "init", "image": "demo:1", "volumeMounts": [work],
                                                   "command": ["sh", "-c",
                                                              "echo from-init > /var/tmp/podrunner-work/init.txt"]}],
                               "containers": [{
                                   "name": "main", "image": "demo:1", "volumeMounts": [work],
                                   "command": ["sh", "-c", "cat /var/tmp/podrunner-work/init.txt; exec sleep 1000"],
                                   "startupProbe": {"exec": {"command": ["test", "-s",
                                                                         "/var/tmp/podrunner-work/init.txt"]},
                                                    "periodSeconds": 1},
                                   "livenessProbe": {"tcpSocket": {"port": 9}, "periodSeconds": 1,
                                                     "failureThreshold": 2}}]}})
    started = runner.start(pod)
    init = started["status"]["initContainerStatuses"][0]
    assert init["state"]["terminated"]["exitCode"] == 0 and init["state"]["terminated"]["reason"] == "Completed"
    assert {c["type"]: c["status"] for c in started["status"]["conditions"]}["Initialized"] == "True"
    deadline = time.monotonic() + 15
    while True:
        cs = api.get("Pod", "default", "probed")["status"]["containerStatuses"][0]
        if cs["restartCount"] >= 1 and cs["started"]:  # restarted, and its startup probe passed again
            break
        assert time.monotonic() < deadline, cs
        time.sleep(0.02)
    assert cs["ready"] is True and "running" in cs["state"]  # no readiness probe: ready once started
    assert cs["lastState"]["terminated"]["exitCode"] == 143  # SIGTERM (sleep's default action)
    _eventually(lambda: runner.logs(pod, "main").count("from-init") >= 2, True)  # each start read the init's file
    events = [(e["reason"], e["message"]) for e in api.list("Event", "default")
              if e["involvedObject"]["name"] == "probed"]
    assert ("Killing", "Container main failed liveness probe, will be restarted") in events
    assert any(r == "Unhealthy" and m.startswith("Liveness probe failed: ") for r, m in events)
    assert not any(m.startswith("Startup probe failed") for _r, m in events)


@pytest.mark.root
def test_leftovers_of_a_dead_test_process_are_swept(tmp_path):
    """A test process killed mid-run leaves its bridge and pod namespaces; the
    next pod network removes them (and only those of dead processes)."""
    if PodNetwork.missing_tools():
        pytest.skip(f"the pod runner needs {', '.join(PodNetwork.missing_tools())}")
    dead = subprocess.Popen(["true"])
    dead.wait()
    ns, br = f"hpr-{dead.pid}z-7", f"hpb{dead.pid}z"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    subprocess.run(["ip", "link", "add", br, "type", "bridge"], check=True)
    try:
        with PodNetwork() as net:
            assert ns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
            assert subprocess.run(["ip", "link", "show", br], capture_output=True).returncode != 0
            sb = net.add_pod("x")
            assert subprocess.run(["ip", "-n", sb.netns, "-4", "-o", "addr", "show", "eth0"], capture_output=True,
                                  text=True).stdout.split()[3] == f"{sb.ip}/24"
        assert sb.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", br], capture_output=True)


@pytest.mark.root
def test_loopback_api_is_reached_through_a_relay_and_a_node_port_through_the_ready_pod(tmp_path):
    """An API server on 127.0.0.1 (plain HTTP) is still KUBERNETES_SERVICE_HOST:PORT
    on the bridge (kube-proxy's relay); a NodePort Service on the host reaches the
    Ready pod its selector picks."""
    missing = PodNetwork.missing_tools()
    if missing:
        pytest.skip(f"the pod runner needs {', '.join(missing)}")
    with PodNetwork() as net, ApiServer() as api, \
            PodRunner(api, net, tmp_path / "pods", images={"demo:1": Image(path=str(VENV_BIN))},
                      max_probe_period=0.2) as runner:
        assert runner.api_host == net.gateway and runner.api_port != api.port
        svc = api.create({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
                          "spec": {"type": "NodePort", "selector": {"app": "web"},
                                   "ports": [{"port": 80, "targetPort": "http"}]}})
        pod = api.create({"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": "web", "namespace": "default", "labels": {"app": "web"}},
                          "spec": {"nodeName": "node-a", "containers": [{
                              "name": "web", "image": "demo:1", "workingDir": "/etc/podinfo",
                              "command": ["python3", "-m", "http.server", "8080"],
                              "ports": [{"name": "http", "containerPort": 8080}],
                              "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 60,
                                                 "initialDelaySeconds": 60},  # capped to 0.2 s here
                              "volumeMounts": [{"name": "info", "mountPath": "/etc/podinfo"}]}],
                              "volumes": [{"name": "info", "downwardAPI": {"items": [
                                  {"path": "me", "fieldRef": {"fieldPath": "metadata.name"}}]}}]}})
        with pytest.raises(ConnectionError, match="no ready endpoint"):
            runner.service_resolver("default", "web", 80)
        runner.start(pod)
        runner.wait_ready(pod, timeout=5)
        out = runner.exec(pod, ["python3", "-c", (
            "import json, os, urllib.request\n"
            "e = os.environ\n"
            "u = 'http://%s:%s/version' % (e['KUBERNETES_SERVICE_HOST'], e['KUBERNETES_SERVICE_PORT'])\n"
            "print(json.load(urllib.request.urlopen(u, timeout=5))['gitVersion'])")])
        assert out.returncode == 0 and out.stdout.startswith("v1."), out.stderr
        host, port = runner.expose_node_port("default", "web")
        assert (host, port) == ("127.0.0.1", svc["spec"]["ports"][0]["nodePort"])
        import urllib.request
        assert urllib.request.urlopen(f"http://{host}:{port}/me", timeout=5).read() == b"web"


@pytest.mark.root
def test_pods_for_names_an_unfit_node_follows_node_labels_and_makes_one_pod_a_node(cluster):
    api, runner = cluster.api, cluster.runner
    ds = api.create({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "gpu", "namespace": "default"},
                     "spec": {"selector": {"matchLabels": {"app": "gpu"}},
                              "template": {"metadata": {"labels": {"app": "gpu"}},
                                           "spec": {"nodeSelector": {"gpu": "on"},
                                                    "containers": [{"name": "c", "image": "demo:1"}]}}}})
    with pytest.raises(ValueError, match="does not run on node node-x: node selector gpu=on does not match"):
        runner.pods_for(ds, ["node-x"])
    assert runner.pods_for(ds, ["node-x"], skip_unfit=True) == []
    assert api.get("Node", None, "node-x")["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.")
    runner.register_node("node-x", labels={"gpu": "on"})  # as `kubectl label node node-x gpu=on`
    [pod] = runner.pods_for(ds, ["node-x"])
    assert pod["spec"]["nodeName"] == "node-x" and pod["status"]["conditions"][-1]["type"] == "PodScheduled"
    assert [p["metadata"]["name"] for p in runner.pods_for(ds, ["node-x"])] == [pod["metadata"]["name"]]
    assert len(api.list("Pod", "default")) == 1
    status = api.get("DaemonSet", "default", "gpu")["status"]
    assert (status["desiredNumberScheduled"], status["currentNumberScheduled"], status["numberReady"]) == (1, 1, 0)
