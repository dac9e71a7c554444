"""The API-server stand-in (tests/standins/apiserver/) checked with real clients:
the official Kubernetes Python client and kubectl (Debian's
``kubernetes-client``, installed by ``make test``; ``KUBECTL=/path`` picks
another binary)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
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
    api_server.register(ResourceType("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", False,
                                     ("pc",), merge_keys=META_MERGE_KEYS))
    groups = {g.name for g in client.ApisApi(v1.api_client).get_api_versions().groups}
    assert {"scheduling.k8s.io", "admissionregistration.k8s.io"} <= groups
    sched = client.SchedulingV1Api(v1.api_client)
    made = sched.create_priority_class({"metadata": {"name": "high"}, "value": 1000})
    assert [m.metadata.name for m in sched.list_priority_class().items] == ["high"]
    assert api_server.get("PriorityClass", None, "high")["metadata"]["uid"] == made.metadata.uid
    with pytest.raises(ValueError, match="already registered"):
        api_server.register(ResourceType("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", False))
    with pytest.raises(client.ApiException) as e:
        sched.delete_priority_class("high", dry_run="All")
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


# -- admission webhooks --------------------------------------------------------


def _certs(tmp_path, name: str, sans: list[str]):
    """A CA and a serving certificate it signed (PEM files); returns
    (ca_pem_bytes, cert_path, key_path)."""
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name}-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
          .not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    alt = [x509.IPAddress(ipaddress.ip_address(s)) if s[0].isdigit() else x509.DNSName(s) for s in sans]
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .sign(ca_key, hashes.SHA256()))
    cert_path, key_path = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    os.chmod(key_path, 0o600)
    return ca.public_bytes(serialization.Encoding.PEM), str(cert_path), str(key_path)


class Webhook:
    """A tiny HTTPS admission webhook for the tests: ``decide(request) ->
    response fields`` (uid added); every review received is kept."""

    def __init__(self, cert: str, key: str, decide):
        import ssl
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        outer = self
        self.decide, self.reviews, self.paths = decide, [], []

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.reviews.append(review)
                outer.paths.append(self.path)
                resp = {"uid": review["request"]["uid"], **outer.decide(review["request"])}
                data = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": resp}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def tls(tmp_path):
    import base64

    ca, cert, key = _certs(tmp_path, "hook", ["127.0.0.1", "hook.webhooks.svc"])
    wrong_ca, _c, _k = _certs(tmp_path, "other", ["127.0.0.1"])
    return {"ca": base64.b64encode(ca).decode(), "wrong_ca": base64.b64encode(wrong_ca).decode(),
            "cert": cert, "key": key}


@pytest.fixture
def webhook(tls):
    made = []

    def start(decide):
        w = Webhook(tls["cert"], tls["key"], decide)
        made.append(w)
        return w

    yield start
    for w in made:
        w.close()


def b64patch(ops: list) -> str:
    import base64
    return base64.b64encode(json.dumps(ops).encode()).decode()


def mwc(name: str, url: str, ca: str, kind: str = "MutatingWebhookConfiguration", **hook) -> dict:
    wh = {"name": f"{name}.hamid.io", "clientConfig": {"url": url, "caBundle": ca},
          "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
          "sideEffects": "None", "admissionReviewVersions": ["v1"], **hook}
    return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": name},
            "webhooks": [wh]}


def test_mutating_webhook_over_https_patches_the_pod(api_server, v1, webhook, tls):
    seen_ns = []

    def decide(req):
        # a webhook may read from the API server while it is being called: no lock is held
        seen_ns.append(httpx.get(f"{api_server.url}/api/v1/namespaces/{req['namespace']}").json()["metadata"]["name"])
        return {"allowed": True, "patchType": "JSONPatch", "patch": b64patch([
            {"op": "add", "path": "/metadata/labels/hamid.io~1seen", "value": "yes"},
            {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": "hamid.io/placement"}]}])}

    hook = webhook(decide)
    made = client.AdmissionregistrationV1Api(v1.api_client).create_mutating_webhook_configuration(
        mwc("hamid", f"https://127.0.0.1:{hook.port}/mutate", tls["ca"]))
    wh = made.webhooks[0]  # the real server's defaults are stored
    assert (wh.failure_policy, wh.timeout_seconds, wh.match_policy, wh.reinvocation_policy) == \
           ("Fail", 10, "Equivalent", "Never")
    assert wh.rules[0].scope == "*"

    created = v1.create_namespaced_pod("default", pod("p", labels={"app": "x"}))
    assert created.metadata.labels == {"app": "x", "hamid.io/seen": "yes"}
    assert [g.name for g in created.spec.scheduling_gates] == ["hamid.io/placement"]
    assert [(c.type, c.reason) for c in created.status.conditions] == [("PodScheduled", "SchedulingGated")]
    assert seen_ns == ["default"]
    (review,) = hook.reviews
    req = review["request"]
    assert review["apiVersion"] == "admission.k8s.io/v1" and review["kind"] == "AdmissionReview"
    assert req["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert req["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert (req["operation"], req["namespace"], req["name"], req["dryRun"]) == ("CREATE", "default", "p", False)
    assert req["oldObject"] is None and "subResource" not in req and req["uid"]
    assert req["userInfo"]["username"] == "system:admin"
    assert req["object"]["metadata"]["labels"] == {"app": "x"}
    assert "uid" not in req["object"]["metadata"]  # set after admission, as the real server does
    assert req["options"] == {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}
    assert hook.paths == ["/mutate?timeout=10s"]

    # not in the rules: not called (an UPDATE, a configmap, the pod's status)
    v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"more": "1"}}})
    v1.create_namespaced_config_map("default", {"metadata": {"name": "c"}})
    api_server.set_status("Pod", "default", "p", {"phase": "Pending"})
    assert len(hook.reviews) == 1


def test_webhook_caBundle_is_verified_and_failure_policy_decides(api_server, v1, webhook, tls):
    hook = webhook(lambda req: {"allowed": True, "patchType": "JSONPatch", "patch": b64patch([
        {"op": "add", "path": "/metadata/annotations", "value": {"mutated": "1"}}])})
    adm = client.AdmissionregistrationV1Api(v1.api_client)
    url = f"https://127.0.0.1:{hook.port}/m"
    adm.create_mutating_webhook_configuration(mwc("wrong", url, tls["wrong_ca"]))
    with pytest.raises(client.ApiException) as e:
        v1.create_namespaced_pod("default", pod("a"))
    st = status_of(e.value)
    assert e.value.status == 500 and st["reason"] == "InternalError"
    assert st["message"].startswith(f'Internal error occurred: failed calling webhook "wrong.hamid.io": failed to '
                                    f'call webhook: Post "{url}?timeout=10s": tls: failed to verify certificate')
    assert hook.reviews == [] and api_server.list("Pod") == []

    # Ignore: the pod is admitted untouched
    adm.patch_mutating_webhook_configuration("wrong", {"webhooks": [{"name": "wrong.hamid.io",
                                                                      "failurePolicy": "Ignore"}]})
    assert v1.create_namespaced_pod("default", pod("a")).metadata.annotations is None

    # the right CA: called and applied
    adm.delete_mutating_webhook_configuration("wrong")
    adm.create_mutating_webhook_configuration(mwc("right", url, tls["ca"]))
    assert v1.create_namespaced_pod("default", pod("b")).metadata.annotations == {"mutated": "1"}

    # nothing listening, Fail: refused; a webhook that times out: refused with the deadline
    adm.delete_mutating_webhook_configuration("right")
    with socket_closed_port() as dead:
        adm.create_mutating_webhook_configuration(mwc("dead", f"https://127.0.0.1:{dead}/m", tls["ca"]))
        with pytest.raises(client.ApiException) as e:
            v1.create_namespaced_pod("default", pod("c"))
        assert e.value.status == 500 and 'failed calling webhook "dead.hamid.io"' in status_of(e.value)["message"]
    adm.delete_mutating_webhook_configuration("dead")
    slow = webhook(lambda req: time.sleep(1.5) or {"allowed": True})
    adm.create_mutating_webhook_configuration(mwc("slow", f"https://127.0.0.1:{slow.port}/m", tls["ca"],
                                                  timeoutSeconds=1))
    with pytest.raises(client.ApiException) as e:
        v1.create_namespaced_pod("default", pod("d"))
    assert status_of(e.value)["message"].endswith("context deadline exceeded")


@contextlib.contextmanager
def socket_closed_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    yield port


def test_webhook_denial_reaches_the_client_and_kubectl(api_server, v1, webhook, tls, kubectl, tmp_path):
    def decide(req):
        gpus = req["object"]["metadata"].get("annotations", {}).get("gpu")
        if gpus == "bad":
            return {"allowed": False, "status": {"message": 'annotation gpu: "bad" is not a number; accepted: 1-8'}}
        if gpus == "forbidden":
            return {"allowed": False, "status": {"code": 403, "reason": "Forbidden", "message": "not here"}}
        if gpus == "silent":
            return {"allowed": False}
        return {"allowed": True, "warnings": ['no GPU requested: "hamid" leaves this pod alone']}

    hook = webhook(decide)
    client.AdmissionregistrationV1Api(v1.api_client).create_mutating_webhook_configuration(
        mwc("hamid", f"https://127.0.0.1:{hook.port}/m", tls["ca"]))
    bad = pod("a")
    bad["metadata"]["annotations"] = {"gpu": "bad"}
    with pytest.raises(client.ApiException) as e:
        v1.create_namespaced_pod("default", bad)
    assert e.value.status == 400  # no code from the webhook: 400
    assert status_of(e.value)["message"] == ('admission webhook "hamid.hamid.io" denied the request: annotation '
                                             'gpu: "bad" is not a number; accepted: 1-8')
    bad["metadata"]["annotations"] = {"gpu": "forbidden"}
    with pytest.raises(client.ApiException) as e:
        v1.create_namespaced_pod("default", bad)
    assert e.value.status == 403 and status_of(e.value)["reason"] == "Forbidden"
    bad["metadata"]["annotations"] = {"gpu": "silent"}
    with pytest.raises(client.ApiException) as e:
        v1.create_namespaced_pod("default", bad)
    assert status_of(e.value)["message"] == 'admission webhook "hamid.hamid.io" denied the request without explanation'

    manifest = tmp_path / "pod.yaml"
    manifest.write_text(MANIFEST.replace("labels: {app: web}", "labels: {app: web}\n  annotations: {gpu: bad}"))
    out = kubectl("apply", "-f", str(manifest), check=False)
    assert out.returncode != 0
    assert ('admission webhook "hamid.hamid.io" denied the request: annotation gpu: "bad" is not a number; '
            'accepted: 1-8') in out.stderr
    assert api_server.list("Pod") == []
    manifest.write_text(MANIFEST)
    done = kubectl("apply", "-f", str(manifest))
    assert done.stdout.strip() == "pod/web created"
    assert 'Warning: no GPU requested: "hamid" leaves this pod alone' in done.stderr  # the webhook's warning


def test_webhook_selectors_service_reference_and_validating(api_server, v1, webhook, tls):
    hook = webhook(lambda req: {"allowed": True, "patchType": "JSONPatch", "patch": b64patch([
        {"op": "add", "path": "/metadata/annotations", "value": {"hooked": req["operation"]}}])})
    adm = client.AdmissionregistrationV1Api(v1.api_client)
    cfg = mwc("svc", "", tls["ca"], namespaceSelector={"matchLabels": {"hamid.io/enabled": "true"}},
              objectSelector={"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]})
    cfg["webhooks"][0]["clientConfig"] = {"service": {"namespace": "webhooks", "name": "hook", "path": "/m"},
                                          "caBundle": tls["ca"]}
    made = adm.create_mutating_webhook_configuration(cfg)
    assert made.webhooks[0].client_config.service.port == 443
    v1.create_namespace({"metadata": {"name": "gpu", "labels": {"hamid.io/enabled": "true"}}})
    v1.create_namespace({"metadata": {"name": "webhooks"}})

    # outside the namespace selector, or opted out by the object selector: not called
    assert v1.create_namespaced_pod("default", pod("a")).metadata.annotations is None
    assert v1.create_namespaced_pod("gpu", pod("b", labels={"skip": "1"})).metadata.annotations is None
    # selected, but no Service: the call fails (failurePolicy Fail)
    with pytest.raises(client.ApiException) as e:
        v1.create_namespaced_pod("gpu", pod("c"))
    assert 'failed calling webhook "svc.hamid.io": failed to call webhook: service "hook" not found' in \
        status_of(e.value)["message"]
    v1.create_namespaced_service("webhooks", {"metadata": {"name": "hook"}, "spec": {"ports": [{"port": 443}]}})
    # no resolver: no cluster network to reach it
    with pytest.raises(client.ApiException) as e:
        v1.create_namespaced_pod("gpu", pod("c"))
    assert "no service_resolver was set" in status_of(e.value)["message"]
    calls = []

    def resolve(ns, name, port):
        calls.append((ns, name, port))
        return f"127.0.0.1:{hook.port}"

    api_server.webhooks.service_resolver = resolve
    assert v1.create_namespaced_pod("gpu", pod("c")).metadata.annotations == {"hooked": "CREATE"}
    assert calls == [("webhooks", "hook", 443)] and hook.paths == ["/m?timeout=10s"]

    # the certificate must name <svc>.<ns>.svc: a service of another name is refused
    v1.create_namespaced_service("webhooks", {"metadata": {"name": "other"}, "spec": {"ports": [{"port": 443}]}})
    adm.patch_mutating_webhook_configuration("svc", [{"op": "replace", "path": "/webhooks/0/clientConfig/service/name",
                                                      "value": "other"}])
    with pytest.raises(client.ApiException) as e:
        v1.create_namespaced_pod("gpu", pod("d"))
    assert "tls: failed to verify certificate" in status_of(e.value)["message"]
    adm.delete_mutating_webhook_configuration("svc")

    # a validating webhook on UPDATE: sees old and new, may deny, may not patch
    def check(req):
        assert req["oldObject"]["metadata"]["name"] == req["object"]["metadata"]["name"]
        ok = req["object"]["metadata"].get("labels", {}).get("tier") != "bad"
        return {"allowed": ok, "status": {"message": "tier bad"}}

    val = webhook(check)
    vcfg = mwc("val", f"https://127.0.0.1:{val.port}/v", tls["ca"], kind="ValidatingWebhookConfiguration")
    vcfg["webhooks"][0]["rules"][0]["operations"] = ["UPDATE"]
    adm.create_validating_webhook_configuration(vcfg)
    v1.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"tier": "good"}}})
    with pytest.raises(client.ApiException) as e:
        v1.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"tier": "bad"}}})
    assert status_of(e.value)["message"] == 'admission webhook "val.hamid.io" denied the request: tier bad'
    assert v1.read_namespaced_pod("a", "default").metadata.labels == {"tier": "good"}
    assert [r["request"]["operation"] for r in val.reviews] == ["UPDATE", "UPDATE"]


def test_webhook_configurations_are_validated(api_server, v1, tls):
    adm = client.AdmissionregistrationV1Api(v1.api_client)
    bad = mwc("bad", "http://127.0.0.1:1/m", tls["ca"], timeoutSeconds=31)
    del bad["webhooks"][0]["sideEffects"]  # the Python client refuses to send this: plain HTTP
    r = httpx.post(f"{api_server.url}/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations", json=bad)
    msg = r.json()["message"]
    assert r.status_code == 422 and r.json()["reason"] == "Invalid"
    assert "webhooks[0].clientConfig.url: Invalid value: \"http://127.0.0.1:1/m\": 'https' is the only allowed" in msg
    assert "webhooks[0].sideEffects: Required value: must specify one of None, NoneOnDryRun" in msg
    assert "webhooks[0].timeoutSeconds: Invalid value: 31: the timeout value must be between 1 and 30" in msg
    unsupported = mwc("x", "https://127.0.0.1:1/m", tls["ca"], reinvocationPolicy="IfNeeded")
    with pytest.raises(client.ApiException) as e:
        adm.create_mutating_webhook_configuration(unsupported)
    assert 'implements "Never" only' in status_of(e.value)["message"]


# -- scheduling gates (KEP-3521/3838) and Lease races ----------------------------


def _req_terms(*terms) -> dict:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def test_gated_pod_placement_may_only_narrow(api_server, v1):
    zone = {"key": "zone", "operator": "In", "values": ["a", "b"]}
    gpu = {"key": "gpu", "operator": "Exists"}
    host = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    v1.create_namespaced_pod("default", pod("g", schedulingGates=[{"name": "hamid.io/placement"}, {"name": "x/y"}],
                                            nodeSelector={"pool": "gpu"},
                                            affinity=_req_terms({"matchExpressions": [zone]}, {"matchExpressions": [gpu]})))

    def refused(patch, text):
        with pytest.raises(client.ApiException) as e:
            v1.patch_namespaced_pod("g", "default", patch)
        assert e.value.status == 422, e.value.body
        assert text in status_of(e.value)["message"]

    # nodeSelector: only additions
    refused([{"op": "replace", "path": "/spec/nodeSelector/pool", "value": "cpu"}],
            "spec.nodeSelector: Invalid value: ")
    refused([{"op": "remove", "path": "/spec/nodeSelector/pool"}],
            "only additions to spec.nodeSelector are allowed (no mutations or deletions)")
    v1.patch_namespaced_pod("g", "default", {"spec": {"nodeSelector": {"rack": "r1"}}})
    # required terms: neither added nor removed; each term may only gain requirements (appended)
    path = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
    refused([{"op": "add", "path": f"{path}/-", "value": {"matchExpressions": [gpu]}}],
            "no additions/deletions to non-empty NodeSelectorTerms list are allowed while pod is gated")
    refused([{"op": "remove", "path": f"{path}/1"}], "no additions/deletions to non-empty NodeSelectorTerms")
    refused([{"op": "replace", "path": f"{path}/0/matchExpressions/0/values", "value": ["a", "b", "c"]}],
            "nodeSelectorTerms[0]: Invalid value: ")
    refused([{"op": "add", "path": f"{path}/0/matchExpressions/0", "value": gpu}],  # inserted before: a mutation
            "only additions are allowed (no mutations or deletions) while pod is gated")
    # preferred terms are free; other affinity stays immutable
    v1.patch_namespaced_pod("g", "default", [{"op": "add", "path": "/spec/affinity/nodeAffinity/"
                                              "preferredDuringSchedulingIgnoredDuringExecution",
                                              "value": [{"weight": 1, "preference": {"matchExpressions": [gpu]}}]}])
    refused([{"op": "add", "path": "/spec/affinity/podAffinity", "value": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone", "labelSelector": {}}]}}],
        "pod updates may not change fields")
    # the leader's update: narrow each term to the node and drop its gate in one write
    p = v1.read_namespaced_pod("g", "default").to_dict()
    body = api_server.get("Pod", "default", "g")
    for term in body["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]:
        term["matchFields"] = [host]
    body["spec"]["schedulingGates"] = [{"name": "x/y"}]
    assert p["metadata"]["resource_version"] == body["metadata"]["resourceVersion"]
    done = v1.replace_namespaced_pod("g", "default", body)
    assert [t.match_fields[0].values for t in
            done.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms] \
        == [["n1"], ["n1"]]
    # the last gate goes with a narrowing; after that, placement is frozen
    v1.patch_namespaced_pod("g", "default", {"spec": {"schedulingGates": None, "nodeSelector": {"last": "1"}}})
    refused({"spec": {"nodeSelector": {"later": "1"}}}, "pod updates may not change fields")
    # a pod gated with no required affinity may get any
    v1.create_namespaced_pod("default", pod("h", schedulingGates=[{"name": "hamid.io/placement"}]))
    v1.patch_namespaced_pod("h", "default", {"spec": {"schedulingGates": None,
                                                      "affinity": _req_terms({"matchFields": [host]})}})
    assert v1.read_namespaced_pod("h", "default").spec.scheduling_gates is None


def test_lease_racing_writers_exactly_one_wins(api_server, v1):
    coord = client.CoordinationV1Api(v1.api_client)
    coord.create_namespaced_lease("kube-system", {"metadata": {"name": "race"}, "spec": {"holderIdentity": ""}})
    seen = coord.read_namespaced_lease("race", "kube-system")

    def slow_admission(rt, op, obj, old):  # widen the read-to-write window, as a slow webhook would
        time.sleep(0.2)
        return obj

    api_server.admission_hooks.append(slow_admission)
    start = threading.Barrier(8)
    results = []

    def take(i):
        body = seen.to_dict()
        body["spec"]["holder_identity"] = f"n{i}"
        start.wait()
        try:
            coord.replace_namespaced_lease("race", "kube-system", client.V1Lease(
                metadata=client.V1ObjectMeta(name="race", resource_version=seen.metadata.resource_version),
                spec=client.V1LeaseSpec(holder_identity=f"n{i}")))
            results.append(("won", i))
        except client.ApiException as e:
            results.append((e.status, i))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for r, i in results if r == "won"]
    assert len(winners) == 1 and sorted(r for r, _ in results if r != "won") == [409] * 7
    assert coord.read_namespaced_lease("race", "kube-system").spec.holder_identity == f"n{winners[0]}"


def test_webhook_rules_for_subresources(api_server, v1, webhook, tls):
    hook = webhook(lambda req: {"allowed": req["object"].get("target", {}).get("name") != "forbidden-node"})
    cfg = mwc("sub", f"https://127.0.0.1:{hook.port}/v", tls["ca"], kind="ValidatingWebhookConfiguration")
    cfg["webhooks"][0]["rules"] = [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                    "resources": ["pods/binding"]},
                                   {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                                    "resources": ["pods/status"]}]
    client.AdmissionregistrationV1Api(v1.api_client).create_validating_webhook_configuration(cfg)
    v1.create_namespaced_pod("default", pod("a"))  # "pods/binding" and "pods/status" do not match pods itself
    assert hook.reviews == []
    bind = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "a"},
            "target": {"kind": "Node", "name": "forbidden-node"}}
    with pytest.raises(client.ApiException) as e:
        v1.create_namespaced_pod_binding("a", "default", bind, _preload_content=False)
    assert e.value.status == 400 and "denied the request" in status_of(e.value)["message"]
    req = hook.reviews[-1]["request"]
    assert (req["operation"], req["subResource"], req["kind"]["kind"], req["resource"]["resource"]) == \
        ("CREATE", "binding", "Binding", "pods")
    v1.create_namespaced_pod_binding("a", "default", {**bind, "target": {"kind": "Node", "name": "n1"}},
                                     _preload_content=False)
    api_server.set_status("Pod", "default", "a", {"phase": "Running"})
    req = hook.reviews[-1]["request"]
    assert (req["operation"], req["subResource"], req["object"]["status"]["phase"]) == ("UPDATE", "status", "Running")
    assert req["oldObject"]["status"]["phase"] == "Pending" and len(hook.reviews) == 3


def test_webhooks_see_who_asks(api_server, v1, webhook, tls, tmp_path):
    hook = webhook(lambda req: {"allowed": True})
    cfg = mwc("who", f"https://127.0.0.1:{hook.port}/v", tls["ca"], kind="ValidatingWebhookConfiguration")
    client.AdmissionregistrationV1Api(v1.api_client).create_validating_webhook_configuration(cfg)
    api_server.add_token("hamid-token", "system:serviceaccount:kube-system:hamid", ["system:serviceaccounts"])
    from kubernetes import config as kconfig
    sa = client.CoreV1Api(kconfig.new_client_from_config(api_server.write_kubeconfig(tmp_path / "kc", "hamid-token")))
    sa.create_namespaced_pod("default", pod("by-sa"))
    v1.create_namespaced_pod("default", pod("by-admin"))  # no known token: system:admin
    assert [(r["request"]["name"], r["request"]["userInfo"]) for r in hook.reviews] == [
        ("by-sa", {"username": "system:serviceaccount:kube-system:hamid",
                   "groups": ["system:serviceaccounts", "system:authenticated"]}),
        ("by-admin", {"username": "system:admin", "groups": ["system:masters", "system:authenticated"]})]


# -- more kinds: ServiceAccount, RBAC, DaemonSet, NodePort and headless Services ----------------

RBAC = "rbac.authorization.k8s.io/v1"
SA_USER = "system:serviceaccount:kube-system:hamid"

CHART_LIKE = """\
apiVersion: v1
kind: ServiceAccount
metadata: {name: hamid, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: hamid}
rules:
- {apiGroups: [""], resources: [pods], verbs: [get, list, watch, patch]}
- {apiGroups: [""], resources: [pods/binding], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: hamid}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: hamid}
subjects:
- {kind: ServiceAccount, name: hamid, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: hamid-leases, namespace: kube-system}
rules:
- {apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create, update]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: hamid-leases, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: hamid-leases}
subjects:
- {kind: ServiceAccount, name: hamid}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: hamid, namespace: kube-system}
spec:
  selector:
    matchLabels: {app.kubernetes.io/name: hamid}
  template:
    metadata:
      labels: {app.kubernetes.io/name: hamid}
    spec:
      serviceAccountName: hamid
      containers:
      - name: hamid
        image: hamid:1
        command: [hamid]
        ports: [{name: webhook, containerPort: 9443}]
---
apiVersion: v1
kind: Service
metadata: {name: hamid-extender, namespace: kube-system}
spec:
  type: NodePort
  selector: {hamid.io/leader: "true"}
  ports: [{name: http, port: 9998, nodePort: 31999}]
---
apiVersion: v1
kind: Service
metadata: {name: hamid-metrics, namespace: kube-system}
spec:
  type: NodePort
  selector: {app.kubernetes.io/name: hamid}
  ports: [{name: metrics, port: 9394}]
---
apiVersion: v1
kind: Service
metadata: {name: hamid-gossip, namespace: kube-system}
spec:
  clusterIP: None
  selector: {app.kubernetes.io/name: hamid}
  ports: [{name: gossip, port: 7947}]
"""
CHART_OBJECTS = ["serviceaccount/hamid", "clusterrole.rbac.authorization.k8s.io/hamid",
                 "clusterrolebinding.rbac.authorization.k8s.io/hamid", "role.rbac.authorization.k8s.io/hamid-leases",
                 "rolebinding.rbac.authorization.k8s.io/hamid-leases", "daemonset.apps/hamid",
                 "service/hamid-extender", "service/hamid-metrics", "service/hamid-gossip"]


@pytest.fixture
def secure_api():
    """The stand-in as a cluster runs it: HTTPS with its own CA, every request authenticated and authorized."""
    from apiserver import ApiServer

    with ApiServer(tls=True, authorize=True, bookmark_interval=0.2) as api:
        yield api


def kubectl_on(kubeconfig: str, tmp_path):
    binary = _kubectl()
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path), "KUBECONFIG": kubeconfig}

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run([binary, *args], capture_output=True, text=True, env=env, timeout=30)
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({out.returncode}): {out.stderr}")
        return out

    return run


def client_for(api, tmp_path, token: str | None = None) -> client.ApiClient:
    from kubernetes import config as kconfig
    name = f"kc-{abs(hash(token))}" if token else "kc-admin"
    path = api.write_kubeconfig(tmp_path / name, **({"token": token} if token else {}))
    return kconfig.new_client_from_config(path)


def test_kubectl_applies_gets_and_deletes_each_new_kind(secure_api, tmp_path):
    kubectl = kubectl_on(secure_api.write_kubeconfig(tmp_path / "kubeconfig"), tmp_path)
    manifest = tmp_path / "chart.yaml"
    manifest.write_text(CHART_LIKE)
    assert kubectl("apply", "-f", str(manifest)).stdout.split("\n")[:-1] == [f"{o} created" for o in CHART_OBJECTS]
    assert kubectl("apply", "-f", str(manifest)).stdout.split("\n")[:-1] == [f"{o} unchanged" for o in CHART_OBJECTS]

    got = {f"{o['kind']}/{o['metadata']['name']}": o
           for o in json.loads(kubectl("get", "-f", str(manifest), "-o", "json").stdout)["items"]}
    assert sorted(got) == sorted(["ServiceAccount/hamid", "ClusterRole/hamid", "ClusterRoleBinding/hamid",
                                  "Role/hamid-leases", "RoleBinding/hamid-leases", "DaemonSet/hamid",
                                  "Service/hamid-extender", "Service/hamid-metrics", "Service/hamid-gossip"])
    ds = got["DaemonSet/hamid"]
    assert ds["metadata"]["generation"] == 1
    assert ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"] == "1"
    assert ds["spec"]["updateStrategy"] == {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    assert ds["spec"]["revisionHistoryLimit"] == 10
    assert ds["status"] == {"currentNumberScheduled": 0, "numberMisscheduled": 0, "desiredNumberScheduled": 0,
                            "numberReady": 0}
    assert ds["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert got["ClusterRoleBinding/hamid"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "hamid", "namespace": "kube-system"}]
    # the NodePort given is kept, a missing one allocated in the range; headless stays headless
    assert got["Service/hamid-extender"]["spec"]["ports"][0]["nodePort"] == 31999
    allocated = got["Service/hamid-metrics"]["spec"]["ports"][0]["nodePort"]
    assert 30000 <= allocated <= 32767 and allocated != 31999
    assert got["Service/hamid-metrics"]["spec"]["externalTrafficPolicy"] == "Cluster"
    assert got["Service/hamid-gossip"]["spec"]["clusterIP"] == "None"
    assert got["Service/hamid-gossip"]["spec"]["clusterIPs"] == ["None"]

    # a changed template: generation and template generation move; the allocated nodePort survives apply
    manifest.write_text(CHART_LIKE.replace("hamid:1", "hamid:2"))
    out = kubectl("apply", "-f", str(manifest)).stdout
    assert "daemonset.apps/hamid configured" in out and "service/hamid-metrics unchanged" in out
    ds = secure_api.get("DaemonSet", "kube-system", "hamid")
    assert ds["metadata"]["generation"] == 2
    assert ds["metadata"]["annotations"]["deprecated.daemonset.template.generation"] == "2"
    assert secure_api.get("Service", "kube-system", "hamid-metrics")["spec"]["ports"][0]["nodePort"] == allocated

    # kubectl names each kind by its short name and finds it through discovery
    names = kubectl("get", "ds,sa,svc", "-n", "kube-system", "-o", "name").stdout.split()
    assert names == ["daemonset.apps/hamid", "serviceaccount/hamid", "service/hamid-extender",
                     "service/hamid-gossip", "service/hamid-metrics"]
    roles = kubectl("get", "clusterroles", "-o", "name").stdout.split()
    assert "clusterrole.rbac.authorization.k8s.io/hamid" in roles
    assert "clusterrole.rbac.authorization.k8s.io/system:discovery" in roles  # the bootstrap policy is there

    out = kubectl("delete", "-f", str(manifest)).stdout.split("\n")[:-1]
    assert out == [f'{o.split("/")[0]} "{o.split("/")[1]}" deleted' for o in CHART_OBJECTS]
    missing = kubectl("get", "daemonset", "hamid", "-n", "kube-system", check=False)
    assert missing.returncode != 0 and 'daemonsets.apps "hamid" not found' in missing.stderr
    assert secure_api.list("ServiceAccount", "kube-system") == []


def daemonset(labels: dict | None, selector, **spec) -> dict:
    body = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "d"},
            "spec": {"template": {"metadata": {"labels": labels},
                                  "spec": {"containers": [{"name": "c", "image": "i:1"}], **spec}}}}
    if selector is not None:
        body["spec"]["selector"] = selector
    return body


def test_daemonset_selector_errors_generation_and_status(api_server, v1):
    apps = client.AppsV1Api(v1.api_client)

    def refused(body) -> str:
        with pytest.raises(client.ApiException) as e:
            apps.create_namespaced_daemon_set("default", body)
        assert e.value.status == 422 and status_of(e.value)["reason"] == "Invalid"
        return status_of(e.value)["message"]

    assert refused(daemonset({"app": "a"}, {"matchLabels": {"app": "b"}})) == (
        'DaemonSet "d" is invalid: spec.template.metadata.labels: Invalid value: map[string]string{"app":"a"}: '
        '`selector` does not match template `labels`')
    # apps/v1 has no default selector: none selects nothing (over plain HTTP: the client requires one)
    r = httpx.post(f"{api_server.url}/apis/apps/v1/namespaces/default/daemonsets", json=daemonset({"app": "a"}, None))
    assert r.status_code == 422 and r.json()["message"] == (
        'DaemonSet "d" is invalid: spec.template.metadata.labels: Invalid value: map[string]string{"app":"a"}: '
        '`selector` does not match template `labels`')
    assert refused(daemonset({"app": "a"}, {})) == (
        'DaemonSet "d" is invalid: spec.selector: Invalid value: v1.LabelSelector{MatchLabels:map[string]string(nil), '
        'MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: empty selector is invalid for daemonset')
    assert refused(daemonset({"app": "a"}, {"matchExpressions": [{"key": "app", "operator": "In"}]})) == (
        'DaemonSet "d" is invalid: spec.selector.matchExpressions[0].values: Required value: must be specified '
        "when `operator` is 'In' or 'NotIn'")
    assert 'spec.template.spec.restartPolicy: Unsupported value: "Never": supported values: "Always"' in refused(
        daemonset({"app": "a"}, {"matchLabels": {"app": "a"}}, restartPolicy="Never"))

    made = apps.create_namespaced_daemon_set("default", daemonset(
        {"app": "a", "tier": "x"}, {"matchExpressions": [{"key": "app", "operator": "In", "values": ["a"]}]}))
    assert made.metadata.generation == 1 and made.status.number_ready == 0
    # the selector is immutable in apps/v1, with the real message
    with pytest.raises(client.ApiException) as e:
        apps.patch_namespaced_daemon_set("d", "default", {"spec": {"selector": {"matchLabels": {"tier": "x"}}}})
    assert status_of(e.value)["message"] == (
        'DaemonSet "d" is invalid: spec.selector: Invalid value: v1.LabelSelector{MatchLabels:map[string]string{'
        '"tier":"x"}, MatchExpressions:[]v1.LabelSelectorRequirement{v1.LabelSelectorRequirement{Key:"app", '
        'Operator:"In", Values:[]string{"a"}}}}: field is immutable')
    # status is its own subresource; a spec change moves the generation, a label change does not
    patched = apps.patch_namespaced_daemon_set("d", "default", {"status": {"numberReady": 3},
                                                                "metadata": {"labels": {"l": "1"}}})
    assert patched.status.number_ready == 0 and patched.metadata.generation == 1
    patched = apps.patch_namespaced_daemon_set_status("d", "default", {"status": {
        "numberReady": 3, "desiredNumberScheduled": 3, "observedGeneration": 1}})
    assert patched.status.number_ready == 3 and patched.metadata.generation == 1
    patched = apps.patch_namespaced_daemon_set("d", "default", {"spec": {"minReadySeconds": 5}})
    assert patched.metadata.generation == 2 and patched.status.number_ready == 3
    assert patched.metadata.annotations["deprecated.daemonset.template.generation"] == "1"  # template unchanged
    apps.delete_namespaced_daemon_set("d", "default")
    assert apps.list_namespaced_daemon_set("default").items == []


def service(name: str, type_: str = "NodePort", **port) -> dict:
    return {"metadata": {"name": name}, "spec": {"type": type_, "selector": {"app": name},
                                                 "ports": [{"name": "p", "port": 80, **port}]}}


def test_nodeport_range_allocation_and_updates(api_server, v1):
    def refused(body) -> str:
        with pytest.raises(client.ApiException) as e:
            v1.create_namespaced_service("default", body)
        assert e.value.status == 422 and status_of(e.value)["reason"] == "Invalid"
        return status_of(e.value)["message"]

    assert refused(service("far", nodePort=40000)) == (
        'Service "far" is invalid: spec.ports[0].nodePort: Invalid value: 40000: provided port is not in the valid '
        'range. The range of valid ports is 30000-32767')
    assert refused(service("cip", "ClusterIP", nodePort=31000)) == (
        "Service \"cip\" is invalid: spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'")
    kept = v1.create_namespaced_service("default", service("kept", nodePort=31999))
    assert kept.spec.ports[0].node_port == 31999 and kept.spec.cluster_ip.startswith("10.96.")
    assert refused(service("again", nodePort=31999)) == (
        'Service "again" is invalid: spec.ports[0].nodePort: Invalid value: 31999: provided port is already '
        'allocated')
    auto = v1.create_namespaced_service("default", service("auto"))
    assert 30000 <= auto.spec.ports[0].node_port <= 32767 and auto.spec.ports[0].node_port != 31999
    # a replace that leaves out the allocated values keeps them; the clusterIP may not change
    body = service("auto")
    body["metadata"]["resourceVersion"] = auto.metadata.resource_version
    replaced = v1.replace_namespaced_service("auto", "default", body)
    assert replaced.spec.ports[0].node_port == auto.spec.ports[0].node_port
    assert replaced.spec.cluster_ip == auto.spec.cluster_ip
    with pytest.raises(client.ApiException) as e:
        v1.patch_namespaced_service("auto", "default", {"spec": {"clusterIP": "10.96.9.9",
                                                                 "clusterIPs": ["10.96.9.9"]}})
    assert status_of(e.value)["message"] == (
        'Service "auto" is invalid: spec.clusterIPs[0]: Invalid value: []string{"10.96.9.9"}: may not change once set')
    # once deleted, its node port is free again
    v1.delete_namespaced_service("kept", "default")
    assert v1.create_namespaced_service("default", service("again", nodePort=31999)).spec.ports[0].node_port == 31999
    headless = v1.create_namespaced_service("default", {"metadata": {"name": "gossip"}, "spec": {
        "clusterIP": "None", "selector": {"app": "x"}, "ports": [{"port": 7947}]}})
    assert headless.spec.cluster_ip == "None" and headless.spec.cluster_ips == ["None"]
    assert headless.spec.type == "ClusterIP"
    assert refused({"metadata": {"name": "9lives"}, "spec": {"ports": [{"port": 1}]}}).startswith(
        'Service "9lives" is invalid: metadata.name: Invalid value: "9lives": a DNS-1035 label must consist of')


# -- HTTPS, service-account tokens, RBAC -----------------------------------------------------


def rbac(kind: str, name: str, namespace: str | None = None, **body) -> dict:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": RBAC, "kind": kind, "metadata": meta, **body}


def binding(kind: str, name: str, role_kind: str, role: str, subjects: list, namespace: str | None = None) -> dict:
    return rbac(kind, name, namespace, roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                                                "name": role}, subjects=subjects)


SA_SUBJECT = {"kind": "ServiceAccount", "name": "hamid", "namespace": "kube-system"}


def test_in_cluster_config_over_https_with_a_service_account_token(secure_api, tmp_path):
    from kubernetes.config.incluster_config import InClusterConfigLoader

    from hamid.webhook.face import service_account_user

    secure_api.create({"apiVersion": "v1", "kind": "ServiceAccount",
                       "metadata": {"name": "hamid", "namespace": "kube-system"}})
    sa_uid = secure_api.get("ServiceAccount", "kube-system", "hamid")["metadata"]["uid"]
    # what kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount/
    token_file, ca_file = tmp_path / "token", tmp_path / "ca.crt"
    token_file.write_text(secure_api.issue_token("kube-system", "hamid"))
    ca_file.write_bytes(secure_api.ca_pem)
    assert service_account_user(str(token_file)) == SA_USER  # hamid's webhook reads its own name from it

    cfg = client.Configuration()
    InClusterConfigLoader(token_filename=str(token_file), cert_filename=str(ca_file), environ={
        "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(secure_api.port)}).load_and_set(cfg)
    assert cfg.host == f"https://127.0.0.1:{secure_api.port}"
    with client.ApiClient(cfg) as api_client:
        v1 = client.CoreV1Api(api_client)
        with pytest.raises(client.ApiException) as e:
            v1.list_namespaced_pod("default")
        assert e.value.status == 403 and status_of(e.value) == {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden",
            "message": f'pods is forbidden: User "{SA_USER}" cannot list resource "pods" in API group "" in the '
                       f'namespace "default"', "details": {"kind": "pods"}, "code": 403}
        secure_api.create(rbac("ClusterRole", "pod-reader", rules=[
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]))
        secure_api.create(binding("ClusterRoleBinding", "hamid-reads", "ClusterRole", "pod-reader", [SA_SUBJECT]))
        assert v1.list_namespaced_pod("default").items == []
        assert client.VersionApi(api_client).get_code().minor == "30"  # discovery: any authenticated user

    # the audit shows what the client needed, and which binding allowed it
    decisions = [(a["user"], a["verb"], a["resource"], a["namespace"], a["allowed"]) for a in secure_api.audit]
    assert decisions == [(SA_USER, "list", "pods", "default", False), (SA_USER, "list", "pods", "default", True),
                         (SA_USER, "get", "", "", True)]
    assert secure_api.audit[1]["reason"] == ('RBAC: allowed by ClusterRoleBinding "hamid-reads" of ClusterRole '
                                             '"pod-reader" to ServiceAccount "kube-system/hamid"')
    assert secure_api.audit[2]["path"] == "/version/"

    # the server's certificate is verified: no trust without the CA, and it names the in-cluster service
    from cryptography import x509
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{secure_api.url}/version", verify=ssl.create_default_context())
    cert = x509.load_pem_x509_certificate(ssl.get_server_certificate(("127.0.0.1", secure_api.port)).encode())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"kubernetes.default.svc", "kubernetes.default.svc.cluster.local"} <= set(
        names.get_values_for_type(x509.DNSName))

    # a token of a service account that is gone (or was recreated: another uid) no longer authenticates
    secure_api.delete("ServiceAccount", "kube-system", "hamid")
    secure_api.create({"apiVersion": "v1", "kind": "ServiceAccount",
                       "metadata": {"name": "hamid", "namespace": "kube-system"}})
    assert secure_api.get("ServiceAccount", "kube-system", "hamid")["metadata"]["uid"] != sa_uid
    r = httpx.get(f"{secure_api.url}/api/v1/namespaces/default/pods",
                  verify=ssl.create_default_context(cafile=str(ca_file)),
                  headers={"Authorization": f"Bearer {token_file.read_text()}"})
    assert r.status_code == 401 and r.json() == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                                 "status": "Failure", "message": "Unauthorized",
                                                 "reason": "Unauthorized", "code": 401}


def test_rbac_grants_exactly_its_rules(secure_api, tmp_path):
    api = secure_api
    api.create({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "hamid", "namespace": "kube-system"}})
    api.create(pod("p"))
    api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mine", "namespace": "default"}})
    api.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other", "namespace": "default"}})
    api.create(rbac("Role", "worker", "default", rules=[
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["mine"],
         "verbs": ["get", "list", "update", "create"]}]))
    api.create(binding("RoleBinding", "worker", "Role", "worker", [SA_SUBJECT], "default"))
    sa = client.CoreV1Api(client_for(api, tmp_path, api.issue_token("kube-system", "hamid")))

    def denied(call, *args, **kwargs) -> str:
        with pytest.raises(client.ApiException) as e:
            call(*args, **kwargs)
        assert e.value.status == 403 and status_of(e.value)["reason"] == "Forbidden"
        return status_of(e.value)["message"]

    who = f'User "{SA_USER}"'
    # exactly its verbs
    assert [p.metadata.name for p in sa.list_namespaced_pod("default").items] == ["p"]
    assert sa.read_namespaced_pod("p", "default").metadata.name == "p"
    assert denied(sa.delete_namespaced_pod, "p", "default") == (
        f'pods "p" is forbidden: {who} cannot delete resource "pods" in API group "" in the namespace "default"')
    # a subresource is its own resource: pods/status granted does not grant pods, nor the reverse
    assert sa.patch_namespaced_pod_status("p", "default", {"status": {"phase": "Running"}}).status.phase == "Running"
    assert denied(sa.patch_namespaced_pod, "p", "default", {"metadata": {"labels": {"a": "b"}}}) == (
        f'pods "p" is forbidden: {who} cannot patch resource "pods" in API group "" in the namespace "default"')
    assert denied(sa.create_namespaced_pod_binding, "p", "default", {
        "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}}) == (
        f'pods "p" is forbidden: {who} cannot create resource "pods/binding" in API group "" in the namespace '
        f'"default"')
    # resourceNames: only the named object; a list only with a metadata.name field selector naming it;
    # never a create (the name is not known when it is authorized)
    assert sa.read_namespaced_config_map("mine", "default").metadata.name == "mine"
    assert denied(sa.read_namespaced_config_map, "other", "default").startswith('configmaps "other" is forbidden')
    assert denied(sa.list_namespaced_config_map, "default") == (
        f'configmaps is forbidden: {who} cannot list resource "configmaps" in API group "" in the namespace '
        f'"default"')
    assert [c.metadata.name for c in sa.list_namespaced_config_map(
        "default", field_selector="metadata.name=mine").items] == ["mine"]
    assert denied(sa.create_namespaced_config_map, "default", {"metadata": {"name": "mine2"}}) == (
        f'configmaps is forbidden: {who} cannot create resource "configmaps" in API group "" in the namespace '
        f'"default"')
    # a RoleBinding grants in its own namespace only; the cluster scope is its own message
    assert denied(sa.list_namespaced_pod, "kube-system").endswith('in the namespace "kube-system"')
    assert denied(sa.list_pod_for_all_namespaces) == (
        f'pods is forbidden: {who} cannot list resource "pods" in API group "" at the cluster scope')
    # watches go through the same check
    w = watch.Watch()
    first = next(iter(w.stream(sa.list_namespaced_pod, "default", timeout_seconds=2)))
    assert first["type"] == "ADDED" and first["object"].metadata.name == "p"
    w.stop()
    assert denied(lambda: next(iter(watch.Watch().stream(sa.list_node, timeout_seconds=1)))) == (
        f'nodes is forbidden: {who} cannot watch resource "nodes" in API group "" at the cluster scope')
    assert [a["verb"] for a in api.audit if a["resource"] == "nodes"] == ["watch"]

    # a ClusterRole through a RoleBinding: its rules, in that namespace only
    coord = client.CoordinationV1Api(sa.api_client)
    api.create(rbac("ClusterRole", "lease-editor", rules=[
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]}]))
    api.create(binding("RoleBinding", "leases", "ClusterRole", "lease-editor", [SA_SUBJECT], "kube-system"))
    lease = {"metadata": {"name": "hamid"}, "spec": {"holderIdentity": "n1"}}
    assert coord.create_namespaced_lease("kube-system", lease).spec.holder_identity == "n1"
    assert denied(coord.create_namespaced_lease, "default", lease) == (
        f'leases.coordination.k8s.io is forbidden: {who} cannot create resource "leases" in API group '
        f'"coordination.k8s.io" in the namespace "default"')

    # groups: every service account of kube-system may read nodes
    assert denied(sa.read_node, "n1") == (
        f'nodes "n1" is forbidden: {who} cannot get resource "nodes" in API group "" at the cluster scope')
    api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    api.create(rbac("ClusterRole", "node-reader", rules=[{"apiGroups": [""], "resources": ["nodes"],
                                                          "verbs": ["get"]}]))
    api.create(binding("ClusterRoleBinding", "ks-nodes", "ClusterRole", "node-reader", [
        {"kind": "Group", "name": "system:serviceaccounts:kube-system"}]))
    assert sa.read_node("n1").metadata.name == "n1"

    # a binding to a role that does not exist: the real reason is appended
    api.create(binding("RoleBinding", "ghostly", "Role", "ghost", [SA_SUBJECT], "default"))
    assert denied(sa.delete_namespaced_pod, "p", "default").endswith(
        ': RBAC: role.rbac.authorization.k8s.io "ghost" not found')


def test_authentication_anonymous_discovery_and_unknown_tokens(secure_api, tmp_path):
    ca = tmp_path / "ca.crt"
    ca.write_bytes(secure_api.ca_pem)
    secure_api.create({"apiVersion": "v1", "kind": "ServiceAccount",
                       "metadata": {"name": "nobody", "namespace": "default"}})
    token = secure_api.issue_token("default", "nobody")

    def get(path: str, token: str | None = None) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(f"{secure_api.url}{path}", verify=ssl.create_default_context(cafile=str(ca)), headers=headers)

    # any authenticated user may read discovery (system:discovery, system:basic-user's bindings)
    for path in ("/api", "/api/v1", "/apis", "/apis/apps/v1", "/apis/rbac.authorization.k8s.io", "/version",
                 "/openapi/v2", "/healthz"):
        assert get(path, token).status_code == 200, path
    # anonymous: only what system:public-info-viewer allows
    for path in ("/healthz", "/livez", "/readyz", "/version"):
        assert get(path).status_code == 200, path
    r = get("/api")
    assert r.status_code == 403 and r.json() == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden",
        "message": 'forbidden: User "system:anonymous" cannot get path "/api"', "details": {}, "code": 403}
    assert get("/api/v1/namespaces/default/pods").json()["message"] == (
        'pods is forbidden: User "system:anonymous" cannot list resource "pods" in API group "" in the namespace '
        '"default"')
    # a token nobody issued, or one signed by another server, is 401
    from apiserver import ApiServer
    other = ApiServer()
    other.create({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody", "namespace": "default"}})
    for bad in ("not-a-token", other.issue_token("default", "nobody"), token[:-4] + "AAAA"):
        r = get("/api", bad)
        assert r.status_code == 401 and r.json()["reason"] == "Unauthorized"
    # the admin kubeconfig's token is system:masters: everything
    assert get("/api/v1/nodes", "standin").status_code == 200


def test_kubectl_with_a_service_account_kubeconfig(secure_api, tmp_path):
    admin = kubectl_on(secure_api.write_kubeconfig(tmp_path / "admin"), tmp_path)
    manifest = tmp_path / "chart.yaml"
    manifest.write_text(CHART_LIKE)
    admin("apply", "-f", str(manifest))
    sa = kubectl_on(secure_api.write_kubeconfig(tmp_path / "sa", token=secure_api.issue_token("kube-system", "hamid")),
                    tmp_path)
    assert sa("get", "pods", "-n", "default").returncode == 0
    refused = sa("delete", "pod", "x", "-n", "default", check=False)
    assert refused.returncode != 0 and refused.stderr.strip() == (
        f'Error from server (Forbidden): pods "x" is forbidden: User "{SA_USER}" cannot delete resource "pods" in '
        f'API group "" in the namespace "default"')
    refused = sa("get", "nodes", check=False)
    assert refused.returncode != 0 and refused.stderr.strip() == (
        f'Error from server (Forbidden): nodes is forbidden: User "{SA_USER}" cannot list resource "nodes" in API '
        f'group "" at the cluster scope')
    refused = sa("apply", "-f", str(manifest), check=False)
    assert refused.returncode != 0 and "cannot get resource \"serviceaccounts\"" in refused.stderr
    # kubectl auth can-i (SelfSubjectAccessReview) and --as (impersonation, itself authorized)
    assert sa("auth", "can-i", "patch", "pods").stdout.strip() == "yes"
    assert sa("auth", "can-i", "delete", "pods", check=False).stdout.strip() == "no"
    assert sa("auth", "can-i", "update", "leases", "-n", "kube-system").stdout.strip() == "yes"
    assert sa("auth", "can-i", "update", "leases", "-n", "default", check=False).stdout.strip() == "no"
    assert admin("auth", "can-i", "create", "pods", "--subresource=binding", "--as", SA_USER).stdout.strip() == "yes"
    assert admin("auth", "can-i", "create", "pods", "--as", SA_USER, check=False).stdout.strip() == "no"
    refused = sa("get", "pods", "--as", "root", check=False)
    assert refused.stderr.strip() == (
        f'Error from server (Forbidden): users "root" is forbidden: User "{SA_USER}" cannot impersonate resource '
        f'"users" in API group "" at the cluster scope')


def test_rbac_objects_are_validated(secure_api, tmp_path):
    rbac_api = client.RbacAuthorizationV1Api(client_for(secure_api, tmp_path))

    def refused(call, *args) -> str:
        with pytest.raises(client.ApiException) as e:
            call(*args)
        assert e.value.status == 422
        return status_of(e.value)["message"]

    assert refused(rbac_api.create_cluster_role_binding, binding(
        "ClusterRoleBinding", "b", "Role", "r", [{"kind": "ServiceAccount", "name": "hamid"}])) == (
        'ClusterRoleBinding "b" is invalid: [roleRef.kind: Unsupported value: "Role": supported values: '
        '"ClusterRole", subjects[0].namespace: Required value]')
    assert refused(rbac_api.create_cluster_role, rbac("ClusterRole", "r", rules=[
        {"verbs": [], "resources": ["pods"]}])) == (
        'ClusterRole "r" is invalid: [rules[0].verbs: Required value: verbs must contain at least one value, '
        'rules[0].apiGroups: Required value: resource rules must supply at least one api group]')
    assert refused(rbac_api.create_namespaced_role, "default", rbac("Role", "r", rules=[
        {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}])) == (
        'Role "r" is invalid: rules[0].nonResourceURLs: Invalid value: []string{"/metrics"}: namespaced rules '
        'cannot apply to non-resource URLs')
    made = rbac_api.create_namespaced_role_binding("default", binding(
        "RoleBinding", "b", "ClusterRole", "view", [{"kind": "User", "name": "alice"}]))
    assert made.subjects[0].api_group == "rbac.authorization.k8s.io"  # defaulted
    made.role_ref.name = "edit"
    assert refused(rbac_api.replace_namespaced_role_binding, "b", "default", made) == (
        'RoleBinding "b" is invalid: roleRef: Invalid value: rbac.RoleRef{APIGroup:"rbac.authorization.k8s.io", '
        'Kind:"ClusterRole", Name:"edit"}: cannot change roleRef')


def test_webhooks_see_the_service_account_user(secure_api, webhook, tls, tmp_path):
    hook = webhook(lambda req: {"allowed": True})
    admin = client.ApiClient(client_for(secure_api, tmp_path).configuration)
    client.AdmissionregistrationV1Api(admin).create_validating_webhook_configuration(
        mwc("who", f"https://127.0.0.1:{hook.port}/v", tls["ca"], kind="ValidatingWebhookConfiguration"))
    secure_api.create({"apiVersion": "v1", "kind": "ServiceAccount",
                       "metadata": {"name": "hamid", "namespace": "kube-system"}})
    sa_uid = secure_api.get("ServiceAccount", "kube-system", "hamid")["metadata"]["uid"]
    secure_api.create(binding("ClusterRoleBinding", "admin", "ClusterRole", "cluster-admin", [SA_SUBJECT]))
    sa = client.CoreV1Api(client_for(secure_api, tmp_path, secure_api.issue_token("kube-system", "hamid")))
    sa.create_namespaced_pod("default", pod("by-sa"))
    info = hook.reviews[-1]["request"]["userInfo"]
    assert (info["username"], info["uid"], info["groups"]) == (
        SA_USER, sa_uid, ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"])
    assert info["extra"]["authentication.kubernetes.io/credential-id"][0].startswith("JTI=")


def test_https_on_every_address_of_a_wildcard_listener(tmp_path):
    """A server on 0.0.0.0 is verified at whichever local address a client
    dials (here 127.0.0.2, as a pod dials the bridge's address), and a
    kubeconfig may name that address."""
    from apiserver import ApiServer

    with ApiServer(tls=True, host="0.0.0.0") as api:
        assert api.url == f"https://127.0.0.1:{api.port}"
        ctx = ssl.create_default_context(cadata=api.ca_pem.decode())
        r = httpx.get(f"https://127.0.0.2:{api.port}/version", verify=ctx)
        assert r.status_code == 200 and r.json()["gitVersion"].startswith("v1.30")
        kubeconfig = api.write_kubeconfig(tmp_path / "kc", server=f"https://127.0.0.2:{api.port}")
        from kubernetes import config as kconfig
        v1 = client.CoreV1Api(kconfig.new_client_from_config(kubeconfig))
        assert v1.read_namespace("kube-system").metadata.name == "kube-system"


def test_bound_and_expiring_tokens_and_access_reviews(secure_api, tmp_path):
    api = secure_api
    api.create({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "hamid", "namespace": "kube-system"}})
    api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    api.create({**pod("hamid-x", node="n1"), "metadata": {"name": "hamid-x", "namespace": "kube-system"}})
    bound = api.issue_token("kube-system", "hamid", pod="hamid-x")
    info = api.authenticate(f"Bearer {bound}")
    assert info["username"] == SA_USER
    assert info["extra"]["authentication.kubernetes.io/pod-name"] == ["hamid-x"]
    assert info["extra"]["authentication.kubernetes.io/node-name"] == ["n1"]
    short = api.issue_token("kube-system", "hamid", expiration_seconds=1)
    other_audience = api.issue_token("kube-system", "hamid", audiences=["vault"])
    assert api.authenticate(f"Bearer {short}")["username"] == SA_USER
    from apiserver import ApiError
    with pytest.raises(ApiError) as e:
        api.authenticate(f"Bearer {other_audience}")  # not for this server's audience
    assert e.value.code == 401
    # a bound token dies with its pod; an expired one with its time
    api.delete("Pod", "kube-system", "hamid-x", grace_period=0)
    time.sleep(2.1)
    for token in (bound, short):
        with pytest.raises(ApiError) as e:
            api.authenticate(f"Bearer {token}")
        assert e.value.code == 401 and e.value.reason == "Unauthorized"

    # SubjectAccessReview (an admin asks for another user) and SelfSubjectRulesReview (kubectl auth can-i --list)
    api.create(rbac("Role", "cm", "default", rules=[{"apiGroups": [""], "resources": ["configmaps"],
                                                     "verbs": ["get"], "resourceNames": ["c"]}]))
    api.create(binding("RoleBinding", "cm", "Role", "cm", [SA_SUBJECT], "default"))
    authz = client.AuthorizationV1Api(client_for(api, tmp_path))

    def sar(**attrs):
        return authz.create_subject_access_review({"spec": {
            "user": SA_USER, "groups": ["system:serviceaccounts", "system:authenticated"],
            "resourceAttributes": attrs}}).status

    assert sar(verb="get", resource="configmaps", namespace="default", name="c").allowed is True
    assert sar(verb="get", resource="configmaps", namespace="default", name="d").allowed is False
    assert sar(verb="get", resource="configmaps", namespace="kube-system", name="c").allowed is False
    mine = client.AuthorizationV1Api(client_for(api, tmp_path, api.issue_token("kube-system", "hamid")))
    rules = mine.create_self_subject_rules_review({"spec": {"namespace": "default"}}).status
    assert {"verbs": ["get"], "api_groups": [""], "resources": ["configmaps"], "resource_names": ["c"]} in [
        {k: v for k, v in r.to_dict().items() if v is not None} for r in rules.resource_rules]
    assert rules.incomplete is False


def test_a_burst_of_new_connections_waits_in_the_listen_queue_not_a_syn_retransmission(api_server):
    """kube-apiserver (Go) listens with the kernel's somaxconn backlog; a client that opens a burst
    of connections while the server is busy (the gate leader opens its 8 pod-update connections at
    once) has them all queued. socketserver's default backlog of 5 dropped the rest's SYNs, which the
    client resends only after its 1 s initial retransmission timeout: one pod placed ~1 s late."""
    import select
    import socket

    gate = threading.Event()
    real = api_server._server._handle_request_noblock

    def held():  # the stand-in too busy to accept, as when its process is starved
        gate.wait(10)
        real()

    api_server._server._handle_request_noblock = held
    socks = []
    try:
        burst = min(32, int(open("/proc/sys/net/core/somaxconn").read()))
        for _ in range(burst):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", api_server.port))
            socks.append(s)
        deadline, pending = time.monotonic() + 0.5, list(socks)
        while pending and time.monotonic() < deadline:
            _, ready, _ = select.select([], pending, [], 0.05)
            pending = [s for s in pending if s not in ready]
        assert not pending, f"{len(pending)} of {burst} connections not established within 0.5 s (listen backlog " \
                            f"{api_server._server.request_queue_size})"
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0 for s in socks)
    finally:
        gate.set()
        api_server._server._handle_request_noblock = real
        for s in socks:
            s.close()


# -- what a real control plane showed that the stand-in used to hide ---------------------------


def test_quantities_are_stored_canonical_and_limits_copied_into_requests(api_server, v1):
    """As a real kube-apiserver 1.36 does: ``nvidia.com/gpumem: "30000"`` comes back as ``"30k"``, and an
    extended resource given only as a limit is a request too (so anything reading pods parses quantities)."""
    from apiserver import canonical_quantity

    body = pod("q")
    body["spec"]["containers"][0]["resources"] = {"limits": {
        "nvidia.com/gpu": "1", "nvidia.com/gpumem": "30000", "nvidia.com/gpucores": "30", "cpu": "0.5",
        "memory": "1024Mi"}}
    v1.create_namespaced_pod("default", body)
    got = api_server.get("Pod", "default", "q")["spec"]["containers"][0]["resources"]
    want = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "30k", "nvidia.com/gpucores": "30", "cpu": "500m",
            "memory": "1Gi"}
    assert got == {"limits": want, "requests": want}
    cases = {"0": "0", "1000": "1k", "1500": "1500", "4096": "4096", "2.5": "2500m", "1e3": "1e3", "30e3": "30e3",
             "1536Mi": "1536Mi", "2048Mi": "2Gi", "1.5Ki": "1536", "100m": "100m", "12G": "12G", "-1000": "-1k"}
    assert {k: canonical_quantity(k) for k in cases} == cases


def test_a_new_node_is_not_ready_tainted_until_the_controller_sees_it_ready(api_server, v1):
    def taints(name: str) -> list:
        return (api_server.get("Node", None, name).get("spec") or {}).get("taints") or []

    not_ready = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
    made = v1.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n-new"}})
    assert made.spec.taints[0].key == "node.kubernetes.io/not-ready"  # in the create's answer already
    time.sleep(0.5)
    assert taints("n-new") == [not_ready]  # no Ready condition: it stays
    api_server.set_status("Node", None, "n-new", {"conditions": [{"type": "Ready", "status": "True"}]})
    deadline = time.monotonic() + 5
    while taints("n-new") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert taints("n-new") == []
    # created Ready (a kubelet posting its status at registration): tainted first, lifted moments later
    v1.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n-ready"},
                    "spec": {"taints": [{"key": "gpu", "value": "x", "effect": "NoSchedule"}]},
                    "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    assert not_ready in taints("n-ready")
    deadline = time.monotonic() + 5
    while not_ready in taints("n-ready") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert taints("n-ready") == [{"key": "gpu", "value": "x", "effect": "NoSchedule"}]


def test_after_a_restart_rbac_answers_403_for_a_moment(secure_api, tmp_path):
    api = secure_api
    api.create({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "hamid", "namespace": "kube-system"}})
    api.create(rbac("ClusterRole", "reader", rules=[{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]))
    api.create(binding("ClusterRoleBinding", "reader", "ClusterRole", "reader", [SA_SUBJECT]))
    api.create(pod("p"))
    sa = client.CoreV1Api(client_for(api, tmp_path, api.issue_token("kube-system", "hamid")))
    admin = client.CoreV1Api(client_for(api, tmp_path))
    url = api.url
    assert [p.metadata.name for p in sa.list_namespaced_pod("default").items] == ["p"]
    api.restart(rbac_sync_s=1.0)
    assert api.url == url
    with pytest.raises(client.ApiException) as e:
        sa.list_namespaced_pod("default")
    assert e.value.status == 403 and status_of(e.value)["reason"] == "Forbidden"
    assert [p.metadata.name for p in admin.list_namespaced_pod("default").items] == ["p"]  # system:masters
    time.sleep(1.1)
    assert [p.metadata.name for p in sa.list_namespaced_pod("default").items] == ["p"]  # caches synced


def test_a_restart_ends_the_old_servers_watches_even_one_not_yet_streaming(api_server):
    """A kube-apiserver that restarts drops every connection, so every watch ends and its client resumes on
    the new server. A watch the old server had accepted but not yet begun streaming (here: held back while
    the restart happens) must end too, not stream on from the old server: the informer of a restart test
    kept such a watch for 15 s and never met the new server's 403s (seen on a busy machine)."""
    rv = api_server.resource_version
    started, events = threading.Event(), []

    def watcher():
        with httpx.stream("GET", f"{api_server.url}/api/v1/namespaces/default/pods", timeout=None,
                          params={"watch": "true", "resourceVersion": str(rv), "timeoutSeconds": "600"}) as r:
            started.set()
            for line in r.iter_lines():
                ev = json.loads(line) if line else {"type": "BOOKMARK"}
                if ev["type"] != "BOOKMARK":
                    events.append(ev)
                    break  # an old server still streaming: the test has its answer

    t = threading.Thread(target=watcher, daemon=True)
    with api_server.hold_watches():  # the watch is accepted (its 200 is out) and waits to start streaming
        t.start()
        started.wait()
        api_server.restart(0.0)
    api_server.create(pod("after"))  # on the new server: the old watch, were it alive, would stream it
    t.join()
    assert events == []
