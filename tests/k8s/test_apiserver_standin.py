"""The API-server stand-in (tests/k8s/apiserver.py) checked with real clients:
the official Kubernetes Python client and kubectl (Debian's
``kubernetes-client``, installed by ``make test``; ``KUBECTL=/path`` picks
another binary)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time

import httpx
import pytest
from apiserver import META_MERGE_KEYS, ResourceType, strategic_merge_patch
from kubernetes import client, watch


def pod(name: str, node: str | None = None, labels: dict | None = None, **spec) -> dict:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36",
                                     "env": [{"name": "A", "value": "1"}]}], **spec}}
    if node:
        body["spec"]["nodeName"] = node
    return body


@pytest.fixture
def v1(api_server):
    cfg = client.Configuration(host=api_server.url)
    with client.ApiClient(cfg) as api_client:
        yield client.CoreV1Api(api_client)


def status_of(err: client.ApiException) -> dict:
    return json.loads(err.body)


# -- the Python client -------------------------------------------------------


def test_create_get_list_and_conflicts(api_server, v1):
    created = v1.create_namespaced_pod("default", pod("a", labels={"app": "x"}))
    assert created.metadata.uid and created.metadata.creation_timestamp
    assert created.metadata.generation == 1 and created.status.phase == "Pending"
    rv = int(created.metadata.resource_version)
    got = v1.read_namespaced_pod("a", "default")
    assert got.metadata.resource_version == str(rv)
    assert [p.metadata.name for p in v1.list_namespaced_pod("default").items] == ["a"]

    with pytest.raises(client.ApiException) as e:
        v1.create_namespaced_pod("default", pod("a"))
    assert e.value.status == 409 and status_of(e.value)["reason"] == "AlreadyExists"

    # a write moves the resourceVersion; a replace carrying the old one is a Conflict
    got.metadata.labels["app"] = "y"
    updated = v1.replace_namespaced_pod("a", "default", got)
    assert int(updated.metadata.resource_version) > rv
    got.metadata.labels["app"] = "z"
    with pytest.raises(client.ApiException) as e:
        v1.replace_namespaced_pod("a", "default", got)
    st = status_of(e.value)
    assert e.value.status == 409 and st["kind"] == "Status" and st["reason"] == "Conflict"
    assert "the object has been modified" in st["message"]
    assert v1.read_namespaced_pod("a", "default").metadata.labels == {"app": "y"}

    # a write that changes nothing is no write
    same = v1.replace_namespaced_pod("a", "default", v1.read_namespaced_pod("a", "default"))
    assert same.metadata.resource_version == updated.metadata.resource_version

    with pytest.raises(client.ApiException) as e:
        v1.read_namespaced_pod("missing", "default")
    assert e.value.status == 404 and status_of(e.value)["reason"] == "NotFound"
    with pytest.raises(client.ApiException) as e:
        v1.create_namespaced_pod("nowhere", pod("b"))
    assert e.value.status == 404 and 'namespaces "nowhere" not found' in status_of(e.value)["message"]


def test_pod_spec_is_immutable_and_status_is_its_own_subresource(api_server, v1):
    v1.create_namespaced_pod("default", pod("a"))
    with pytest.raises(client.ApiException) as e:
        v1.patch_namespaced_pod("a", "default", {"spec": {"containers": [{"name": "main", "env": [
            {"name": "A", "value": "2"}]}]}})
    assert e.value.status == 422 and "pod updates may not change fields" in status_of(e.value)["message"]
    # the image may change
    v1.patch_namespaced_pod("a", "default", {"spec": {"containers": [{"name": "main", "image": "busybox:2"}]}})
    # the main resource ignores status, the status subresource ignores spec
    p = v1.patch_namespaced_pod("a", "default", {"status": {"phase": "Running"}})
    assert p.status.phase == "Pending"
    p = v1.patch_namespaced_pod_status("a", "default", {"status": {"phase": "Running"},
                                                        "spec": {"activeDeadlineSeconds": 5}})
    assert p.status.phase == "Running" and p.spec.active_deadline_seconds is None
    assert p.spec.containers[0].image == "busybox:2"


def test_three_patch_types(api_server, v1):
    v1.create_namespaced_pod("default", pod("a", labels={"keep": "1", "drop": "1"}))
    # strategic merge: containers by name, env by name; labels merged
    p = v1.patch_namespaced_pod("a", "default", {
        "metadata": {"labels": {"new": "1"}},
        "spec": {"containers": [{"name": "main", "image": "busybox:2"}],
                 "tolerations": [{"key": "k", "operator": "Exists"}]}})
    assert p.spec.containers[0].image == "busybox:2"
    assert [(e.name, e.value) for e in p.spec.containers[0].env] == [("A", "1")]  # merged, not replaced
    assert p.metadata.labels == {"keep": "1", "drop": "1", "new": "1"}
    # JSON merge patch (RFC 7386): null deletes, lists are replaced
    # (the Python client sends dicts as strategic merge patches; the merge patch goes over plain HTTP)
    r = httpx.patch(f"{api_server.url}/api/v1/namespaces/default/pods/a",
                    content=json.dumps({"metadata": {"labels": {"drop": None}}}),
                    headers={"Content-Type": "application/merge-patch+json"})
    assert r.status_code == 200, r.text
    p = v1.read_namespaced_pod("a", "default")
    assert p.metadata.labels == {"keep": "1", "new": "1"}
    # JSON patch (RFC 6902) with a test that holds, then one that fails: nothing written
    p = v1.patch_namespaced_pod("a", "default", [{"op": "test", "path": "/metadata/labels/keep", "value": "1"},
                                                 {"op": "add", "path": "/metadata/labels/json", "value": "yes"}])
    assert p.metadata.labels["json"] == "yes"
    rv = p.metadata.resource_version
    with pytest.raises(client.ApiException) as e:
        v1.patch_namespaced_pod("a", "default", [{"op": "test", "path": "/metadata/labels/keep", "value": "2"},
                                                 {"op": "remove", "path": "/metadata/labels/keep"}])
    assert e.value.status == 422 and status_of(e.value)["reason"] == "Invalid"
    assert v1.read_namespaced_pod("a", "default").metadata.resource_version == rv
    # a patch carrying a stale resourceVersion is a Conflict too
    with pytest.raises(client.ApiException) as e:
        v1.patch_namespaced_pod("a", "default", {"metadata": {"resourceVersion": "1", "labels": {"x": "1"}}})
    assert e.value.status == 409


def test_strategic_merge_patch_directives():
    keys = {"spec.containers": "name", "spec.containers[].env": "name", "metadata.finalizers": ""}
    orig = {"metadata": {"finalizers": ["a", "b"]},
            "spec": {"containers": [{"name": "x", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
                                    {"name": "y", "image": "i"}], "tolerations": [{"key": "t"}],
                     "affinity": {"a": 1, "b": 2}}}
    out = strategic_merge_patch(orig, {
        "metadata": {"finalizers": ["c"], "$deleteFromPrimitiveList/finalizers": ["a"]},
        "spec": {"$setElementOrder/containers": [{"name": "y"}, {"name": "x"}],
                 "containers": [{"name": "x", "env": [{"name": "B", "$patch": "delete"}, {"name": "C", "value": "3"}]}],
                 "tolerations": [{"key": "u"}],
                 "affinity": {"$patch": "replace", "c": 3}}}, keys)
    assert out["metadata"]["finalizers"] == ["b", "c"]
    assert [c["name"] for c in out["spec"]["containers"]] == ["y", "x"]
    assert out["spec"]["containers"][1]["env"] == [{"name": "A", "value": "1"}, {"name": "C", "value": "3"}]
    assert out["spec"]["tolerations"] == [{"key": "u"}]  # no merge key: replaced
    assert out["spec"]["affinity"] == {"c": 3}
    assert orig["spec"]["containers"][0]["env"][1]["name"] == "B"  # the original is untouched


def test_watch_from_a_resource_version_with_bookmarks(api_server, v1):
    start = v1.create_namespaced_pod("default", pod("a")).metadata.resource_version
    v1.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"n": "1"}}})
    v1.create_namespaced_pod("default", pod("b"))
    v1.delete_namespaced_pod("b", "default")  # not bound: deleted at once
    seen = []
    w = watch.Watch()
    for ev in w.stream(v1.list_namespaced_pod, "default", resource_version=start,
                       allow_watch_bookmarks=True, timeout_seconds=5):
        obj = ev["object"]
        name = obj["metadata"].get("name") if isinstance(obj, dict) else obj.metadata.name
        rv = obj["metadata"]["resourceVersion"] if isinstance(obj, dict) else obj.metadata.resource_version
        seen.append((ev["type"], name, int(rv)))
        if sum(s[0] == "BOOKMARK" for s in seen) == 2:
            w.stop()
    events = [s for s in seen if s[0] != "BOOKMARK"]
    assert [(t, n) for t, n, _ in events] == [("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "b")]
    assert [rv for *_, rv in events] == sorted(rv for *_, rv in events)
    bookmarks = [s for s in seen if s[0] == "BOOKMARK"]
    assert len(bookmarks) == 2  # every 0.2 s, the stream open until then
    assert bookmarks[-1][2] == api_server.resource_version


def test_watch_too_old_is_410_gone_then_relist(api_server, v1):
    old = v1.create_namespaced_pod("default", pod("a")).metadata.resource_version
    v1.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"n": "1"}}})
    api_server.compact()
    with pytest.raises(client.ApiException) as e:
        for _ev in watch.Watch().stream(v1.list_namespaced_pod, "default", resource_version=old,
                                        timeout_seconds=1):
            pass
    assert e.value.status == 410
    # relist, then watch from the list's resourceVersion: only what comes after
    listed = v1.list_namespaced_pod("default")
    assert [p.metadata.labels for p in listed.items] == [{"n": "1"}]
    done = threading.Timer(0.2, lambda: v1.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"n": "2"}}}))
    done.start()
    w = watch.Watch()
    got = []
    for ev in w.stream(v1.list_namespaced_pod, "default", resource_version=listed.metadata.resource_version,
                       timeout_seconds=3):
        got.append((ev["type"], ev["object"].metadata.labels))
        w.stop()
    done.join()
    assert got == [("MODIFIED", {"n": "2"})]


def test_history_overflow_is_410_too(api_server, v1):
    from apiserver import ApiServer

    with ApiServer(history=3) as small:
        cfg = client.Configuration(host=small.url)
        with client.ApiClient(cfg) as c:
            api = client.CoreV1Api(c)
            rv = api.create_namespaced_config_map("default", {"metadata": {"name": "c"}, "data": {"i": "0"}})
            for i in range(1, 5):
                api.patch_namespaced_config_map("c", "default", {"data": {"i": str(i)}})
            resp = api.list_namespaced_config_map("default", watch=True, resource_version=rv.metadata.resource_version,
                                                  timeout_seconds=1, _preload_content=False)
            lines = [json.loads(line) for line in resp.read().decode().splitlines() if line]
    assert [ev["type"] for ev in lines] == ["ERROR"]
    assert lines[0]["object"]["code"] == 410 and lines[0]["object"]["reason"] == "Expired"


def test_field_and_label_selectors_on_list_and_watch(api_server, v1):
    v1.create_namespaced_pod("default", pod("on-n1", node="n1", labels={"tier": "a"}))
    v1.create_namespaced_pod("default", pod("on-n2", node="n2", labels={"tier": "b"}))
    v1.create_namespaced_pod("default", pod("unbound", labels={"tier": "c"}))
    names = lambda items: sorted(p.metadata.name for p in items)  # noqa: E731
    assert names(v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1").items) == ["on-n1"]
    assert names(v1.list_namespaced_pod("default", field_selector="spec.nodeName=").items) == ["unbound"]
    assert names(v1.list_namespaced_pod("default", field_selector="spec.nodeName!=n1,status.phase=Pending")
                 .items) == ["on-n2", "unbound"]
    assert names(v1.list_namespaced_pod("default", label_selector="tier in (a,c)").items) == ["on-n1", "unbound"]
    assert names(v1.list_namespaced_pod("default", label_selector="tier,tier notin (a)").items) == ["on-n2", "unbound"]
    assert names(v1.list_namespaced_pod("default", label_selector="!tier").items) == []
    with pytest.raises(client.ApiException) as e:
        v1.list_namespaced_pod("default", field_selector="spec.foo=1")
    assert e.value.status == 400 and "field label not supported: spec.foo" in status_of(e.value)["message"]

    # a watch on spec.nodeName=n1 sees the unbound pod arrive when it is bound there
    start = v1.list_namespaced_pod("default").metadata.resource_version
    api_server.create(pod("late"))
    bind = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "late"},
            "target": {"kind": "Node", "name": "n1"}}
    v1.create_namespaced_pod_binding("late", "default", bind, _preload_content=False)
    v1.create_namespaced_pod("default", pod("after", node="n1"))
    w = watch.Watch()
    seen = []
    for ev in w.stream(v1.list_namespaced_pod, "default", field_selector="spec.nodeName=n1", resource_version=start,
                       timeout_seconds=5):
        seen.append((ev["type"], ev["object"].metadata.name))
        if len(seen) == 2:
            w.stop()
    assert seen == [("ADDED", "late"), ("ADDED", "after")]  # "late" entered the selection when bound


def test_binding_subresource(api_server, v1):
    v1.create_namespaced_pod("default", pod("a"))
    bind = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "a"},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
    # the client's declared return type (V1Binding) does not fit the real server's Status answer either
    resp = v1.create_namespaced_pod_binding("a", "default", bind, _preload_content=False)
    assert resp.status == 201 and json.loads(resp.data)["status"] == "Success"
    p = v1.read_namespaced_pod("a", "default")
    assert p.spec.node_name == "n1"
    assert [(c.type, c.status) for c in p.status.conditions] == [("PodScheduled", "True")]
    with pytest.raises(client.ApiException) as e:
        v1.create_namespaced_pod_binding("a", "default", {**bind, "target": {"kind": "Node", "name": "n2"}},
                                         _preload_content=False)
    st = status_of(e.value)
    assert e.value.status == 409 and st["reason"] == "Conflict"
    assert st["message"] == 'Operation cannot be fulfilled on pods/binding "a": pod a is already assigned to node "n1"'
    assert v1.read_namespaced_pod("a", "default").spec.node_name == "n1"
    # nodeName cannot be changed by an update, only by a binding
    with pytest.raises(client.ApiException) as e:
        v1.patch_namespaced_pod("a", "default", {"spec": {"nodeName": "n2"}})
    assert e.value.status == 422
    # a gated pod cannot be bound; its gates can only be removed
    v1.create_namespaced_pod("default", pod("g", schedulingGates=[{"name": "hamid.io/place"}]))
    with pytest.raises(client.ApiException) as e:
        v1.create_namespaced_pod_binding("g", "default", {**bind, "metadata": {"name": "g"}}, _preload_content=False)
    assert e.value.status == 409 and "non-empty .spec.schedulingGates" in status_of(e.value)["message"]
    with pytest.raises(client.ApiException) as e:
        v1.patch_namespaced_pod("g", "default", {"spec": {"schedulingGates": [{"name": "another"}]}})
    assert e.value.status == 422 and "only deletion is allowed" in status_of(e.value)["message"]
    v1.patch_namespaced_pod("g", "default", [{"op": "remove", "path": "/spec/schedulingGates"}])
    v1.create_namespaced_pod_binding("g", "default", {**bind, "metadata": {"name": "g"}}, _preload_content=False)
    assert v1.read_namespaced_pod("g", "default").spec.node_name == "n1"


def test_delete_grace_periods(api_server, v1):
    v1.create_namespaced_pod("default", pod("bound", node="n1"))
    v1.create_namespaced_pod("default", pod("unbound"))
    v1.create_namespaced_pod("default", pod("forced", node="n1"))
    v1.delete_namespaced_pod("unbound", "default")  # not on a node: gone at once
    deleting = v1.delete_namespaced_pod("bound", "default")  # default grace: 30 s
    assert deleting.metadata.deletion_timestamp is not None
    assert deleting.metadata.deletion_grace_period_seconds == 30
    assert v1.read_namespaced_pod("bound", "default").metadata.deletion_timestamp is not None
    v1.delete_namespaced_pod("forced", "default", grace_period_seconds=0)
    assert sorted(p.metadata.name for p in v1.list_namespaced_pod("default").items) == ["bound"]
    api_server.finish_deletion("default", "bound")  # what kubelet does
    assert v1.list_namespaced_pod("default").items == []
    # finalizers hold any object until they are removed
    v1.create_namespaced_config_map("default", {"metadata": {"name": "c", "finalizers": ["x/y"]}})
    v1.delete_namespaced_config_map("c", "default")
    assert v1.read_namespaced_config_map("c", "default").metadata.deletion_timestamp is not None
    v1.patch_namespaced_config_map("c", "default", {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/y"]}})
    with pytest.raises(client.ApiException) as e:
        v1.read_namespaced_config_map("c", "default")
    assert e.value.status == 404


def test_paging_with_limit_and_continue(api_server, v1):
    for i in range(5):
        v1.create_namespaced_config_map("default", {"metadata": {"name": f"c{i}"}})
    first = v1.list_namespaced_config_map("default", limit=2)
    assert [c.metadata.name for c in first.items] == ["c0", "c1"] and first.metadata.remaining_item_count == 3
    v1.delete_namespaced_config_map("c3", "default")  # the pages stay one consistent snapshot
    second = v1.list_namespaced_config_map("default", limit=2, _continue=first.metadata._continue)
    third = v1.list_namespaced_config_map("default", limit=2, _continue=second.metadata._continue)
    assert [c.metadata.name for c in second.items + third.items] == ["c2", "c3", "c4"]
    assert third.metadata._continue is None
    again = v1.list_namespaced_config_map("default", limit=2)
    api_server.compact()
    with pytest.raises(client.ApiException) as e:
        v1.list_namespaced_config_map("default", limit=2, _continue=again.metadata._continue)
    assert e.value.status == 410


def test_leases_nodes_and_events(api_server, v1):
    coord = client.CoordinationV1Api(v1.api_client)
    lease = coord.create_namespaced_lease("kube-system", {"metadata": {"name": "hamid"}, "spec": {
        "holderIdentity": "a", "leaseDurationSeconds": 15}})
    lease.spec.holder_identity = "b"
    coord.replace_namespaced_lease("hamid", "kube-system", lease)
    lease.spec.holder_identity = "c"  # still the old resourceVersion: a racing writer loses
    with pytest.raises(client.ApiException) as e:
        coord.replace_namespaced_lease("hamid", "kube-system", lease)
    assert e.value.status == 409
    assert coord.read_namespaced_lease("hamid", "kube-system").spec.holder_identity == "b"

    v1.create_node({"metadata": {"name": "n1"}, "status": {"capacity": {"nvidia.com/gpu": "8"}}})
    node = v1.patch_node_status("n1", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert node.status.capacity == {"nvidia.com/gpu": "8"} and node.status.conditions[0].type == "Ready"
    api_server.set_status("Node", None, "n1", {"allocatable": {"nvidia.com/gpu": "4"}})
    assert v1.read_node("n1").status.allocatable == {"nvidia.com/gpu": "4"}

    # events.k8s.io/v1 and core v1 events are one storage, two shapes
    events = client.EventsV1Api(v1.api_client)
    events.create_namespaced_event("default", {
        "metadata": {"name": "e1"}, "eventTime": "2026-01-01T00:00:00.000000Z", "regarding": {"kind": "Pod", "name": "a"},
        "reason": "Placed", "note": "on n1", "type": "Normal", "action": "Place", "reportingController": "hamid",
        "reportingInstance": "hamid-n1"})
    core = v1.read_namespaced_event("e1", "default")
    assert (core.message, core.involved_object.name, core.reporting_component) == ("on n1", "a", "hamid")
    assert events.read_namespaced_event("e1", "default").note == "on n1"
    assert [e.metadata.name for e in v1.list_namespaced_event(
        "default", field_selector="involvedObject.name=a,reason=Placed").items] == ["e1"]


def test_a_registered_kind_is_served_and_discovered(api_server, v1):
    api_server.register(ResourceType("admissionregistration.k8s.io", "v1", "MutatingWebhookConfiguration",
                                     "mutatingwebhookconfigurations", False, merge_keys=META_MERGE_KEYS,
                                     generation=True))
    groups = {g.name for g in client.ApisApi(v1.api_client).get_api_versions().groups}
    assert "admissionregistration.k8s.io" in groups
    adm = client.AdmissionregistrationV1Api(v1.api_client)
    made = adm.create_mutating_webhook_configuration({"metadata": {"name": "hamid"}, "webhooks": []})
    assert made.metadata.generation == 1
    assert [m.metadata.name for m in adm.list_mutating_webhook_configuration().items] == ["hamid"]
    assert api_server.get("MutatingWebhookConfiguration", None, "hamid")["metadata"]["uid"] == made.metadata.uid
    with pytest.raises(client.ApiException) as e:
        adm.delete_mutating_webhook_configuration("hamid", dry_run="All")
    assert e.value.status == 400 and "dry runs" in status_of(e.value)["message"]


# -- kubectl -------------------------------------------------------------------


def _kubectl() -> str:
    explicit = os.environ.get("KUBECTL")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise RuntimeError(f"KUBECTL={explicit!r} is not an executable file")
        return explicit
    found = shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl not found (make test installs Debian's kubernetes-client; or set KUBECTL=/path)")
    return found


@pytest.fixture
def kubectl(api_server, tmp_path):
    binary = _kubectl()
    kubeconfig = api_server.write_kubeconfig(tmp_path / "kubeconfig")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "KUBECONFIG": kubeconfig}

    def run(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run([binary, *args], input=stdin, capture_output=True, text=True, env=env, timeout=30)
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({out.returncode}): {out.stderr}")
        return out

    run.binary, run.env = binary, env
    return run


MANIFEST = """\
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  containers:
  - name: main
    image: busybox:1.36
    env: [{name: A, value: "1"}]
"""


def test_kubectl_apply_get_patch_delete(api_server, kubectl, tmp_path):
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(MANIFEST)
    assert kubectl("apply", "-f", str(manifest)).stdout.strip() == "pod/web created"
    rv = api_server.get("Pod", "default", "web")["metadata"]["resourceVersion"]
    assert kubectl("apply", "-f", str(manifest)).stdout.strip() == "pod/web unchanged"
    assert api_server.get("Pod", "default", "web")["metadata"]["resourceVersion"] == rv
    # a changed manifest is sent as a strategic merge patch ($setElementOrder and all)
    manifest.write_text(MANIFEST.replace("{app: web}", "{app: web, tier: front}")
                        .replace("busybox:1.36", "busybox:1.37"))
    assert kubectl("apply", "-f", str(manifest)).stdout.strip() == "pod/web configured"
    stored = api_server.get("Pod", "default", "web")
    assert stored["metadata"]["labels"] == {"app": "web", "tier": "front"}
    assert stored["spec"]["containers"][0]["image"] == "busybox:1.37"
    assert stored["spec"]["containers"][0]["env"] == [{"name": "A", "value": "1"}]
    # what the server refuses, kubectl reports
    manifest.write_text(MANIFEST.replace('value: "1"', 'value: "2"'))
    refused = kubectl("apply", "-f", str(manifest), check=False)
    assert refused.returncode != 0 and "pod updates may not change fields" in refused.stderr

    listed = json.loads(kubectl("get", "pods", "-o", "json").stdout)
    assert [p["metadata"]["name"] for p in listed["items"]] == ["web"]
    assert listed["items"][0]["metadata"]["uid"] == stored["metadata"]["uid"]

    kubectl("patch", "pod", "web", "-p", '{"metadata":{"labels":{"s":"1"}}}')
    kubectl("patch", "pod", "web", "--type=merge", "-p", '{"metadata":{"labels":{"app":null}}}')
    kubectl("patch", "pod", "web", "--type=json", "-p", '[{"op":"add","path":"/metadata/labels/j","value":"1"}]')
    assert api_server.get("Pod", "default", "web")["metadata"]["labels"] == {"tier": "front", "s": "1", "j": "1"}
    failed = kubectl("patch", "pod", "web", "--type=json", "-p",
                     '[{"op":"test","path":"/metadata/labels/j","value":"2"}]', check=False)
    assert failed.returncode != 0

    assert kubectl("delete", "pod", "web").stdout.strip() == 'pod "web" deleted'
    assert api_server.list("Pod") == []
    missing = kubectl("get", "pod", "web", check=False)
    assert missing.returncode != 0 and 'pods "web" not found' in missing.stderr


def test_kubectl_get_watch_sees_added_then_modified(api_server, kubectl):
    api_server.create(pod("w1"))
    proc = subprocess.Popen([kubectl.binary, "get", "pods", "-w", "-o", "json", "--output-watch-events"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=kubectl.env)
    try:
        decoder = json.JSONDecoder()
        buf, events = "", []
        deadline = time.monotonic() + 20
        modified = False
        os.set_blocking(proc.stdout.fileno(), False)
        while time.monotonic() < deadline and len(events) < 2:
            try:
                buf += os.read(proc.stdout.fileno(), 65536).decode()
            except BlockingIOError:
                pass
            while buf.strip():
                try:
                    ev, end = decoder.raw_decode(buf.lstrip())
                except ValueError:
                    break
                buf = buf.lstrip()[end:]
                events.append((ev["type"], ev["object"]["metadata"]["name"],
                               ev["object"]["metadata"].get("labels") or {}))
            if events and not modified:
                api_server.update({**api_server.get("Pod", "default", "w1"), "metadata": {
                    **api_server.get("Pod", "default", "w1")["metadata"], "labels": {"seen": "yes"}}})
                modified = True
            time.sleep(0.05)
    finally:
        proc.terminate()
        _out, err = proc.communicate(timeout=10)
    assert events == [("ADDED", "w1", {}), ("MODIFIED", "w1", {"seen": "yes"})], err
