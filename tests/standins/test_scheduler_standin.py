"""The kube-scheduler stand-in (tests/standins/scheduler.py) against the API-server
stand-in: default filters, the unschedulable condition and event, and
extenders called as a KubeSchedulerConfiguration describes them."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from scheduler import SchedulerStandIn, parse_config, pod_requests


def node(api, name: str, *, cpu="2", memory="4Gi", pods="10", labels=None, taints=None, unschedulable=False,
         **extra) -> dict:
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints or [], **({"unschedulable": True} if unschedulable else {})},
            "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": pods, **extra},
                       "capacity": {"cpu": cpu, "memory": memory, "pods": pods, **extra},
                       "conditions": [{"type": "Ready", "status": "True"}]}}
    api.create(body)
    return ready_node(api, name)


def ready_node(api, name: str) -> dict:
    """The Node once the node lifecycle controller has lifted its not-ready taint (a new Node has it)."""
    deadline = time.monotonic() + 5
    while True:
        got = api.get("Node", None, name)
        if not any(t.get("key") == "node.kubernetes.io/not-ready" for t in got["spec"].get("taints") or ()):
            return got
        assert time.monotonic() < deadline, f"node {name} still has the not-ready taint"
        time.sleep(0.02)


def pod(api, name: str, *, cpu=None, memory=None, node_name=None, init=None, ports=None, res=None, **spec) -> dict:
    requests = {k: v for k, v in {"cpu": cpu, "memory": memory, **(res or {})}.items() if v is not None}
    c = {"name": "main", "image": "busybox:1.36", "resources": {"requests": requests, "limits": dict(res or {})}}
    if ports:
        c["ports"] = ports
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [c], **spec}}
    if init:
        body["spec"]["initContainers"] = init
    if node_name:
        body["spec"]["nodeName"] = node_name
    return api.create(body)


@pytest.fixture
def sched(api_server):
    made = []

    def start(config=None, period=0.2):
        s = SchedulerStandIn(api_server, config=config, period=period).start()
        made.append(s)
        return s

    yield start
    for s in made:
        s.stop()


def wait_failure(s, name: str, timeout: float = 5.0, contains: str = "") -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = s.last_failure("default", name)
        if msg and contains in msg:
            return msg
        time.sleep(0.02)
    raise AssertionError(f"no failure for {name} (last: {s.last_failure('default', name)!r})")


def wait_event(api_server, reason: str, message: str, timeout: float = 30.0) -> None:
    """Waits for an event the scheduler posts after what the test saw (a wait, not a speed bound)."""
    deadline = time.monotonic() + timeout
    while not any(e["reason"] == reason and e["message"] == message for e in api_server.list("Event", "default")):
        if time.monotonic() >= deadline:
            raise AssertionError(f"no {reason} event {message!r}")
        time.sleep(0.02)


def test_binds_what_fits_and_explains_what_does_not(api_server, sched):
    node(api_server, "a", cpu="2")
    node(api_server, "b", cpu="2")
    s = sched()
    pod(api_server, "small", cpu="1500m")
    assert s.wait_bound("default", "small", 5) in ("a", "b")
    pod(api_server, "big", cpu="3")
    msg = wait_failure(s, "big")
    assert msg == "0/2 nodes are available: 2 Insufficient cpu."
    stored = api_server.get("Pod", "default", "big")
    cond = next(c for c in stored["status"]["conditions"] if c["type"] == "PodScheduled")
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Unschedulable", msg)
    events = [e for e in api_server.list("Event", "default") if e["reason"] == "FailedScheduling"]
    assert [(e["involvedObject"]["name"], e["message"], e["type"]) for e in events] == [("big", msg, "Warning")]
    # requests of pods already there count: 1500m used on one node, so 1 cpu fits only on the other
    pod(api_server, "one", cpu="1")
    assert s.wait_bound("default", "one", 5) != api_server.get("Pod", "default", "small")["spec"]["nodeName"]
    # a node that fits appears: the waiting pod is tried again and bound there
    node(api_server, "c", cpu="4")
    assert s.wait_bound("default", "big", 5) == "c"
    assert s.last_failure("default", "big") is None
    # the Scheduled event follows the bind (kube-scheduler's event broadcaster posts it after the binding too)
    wait_event(api_server, "Scheduled", "Successfully assigned default/big to c")
    # gated pods and other schedulers' pods are not touched
    pod(api_server, "gated", schedulingGates=[{"name": "hamid.io/placement"}])
    pod(api_server, "other", schedulerName="hami-scheduler")
    time.sleep(0.6)
    assert api_server.get("Pod", "default", "gated")["spec"].get("nodeName") is None
    assert api_server.get("Pod", "default", "other")["spec"].get("nodeName") is None
    api_server.update({**api_server.get("Pod", "default", "gated"),
                       "spec": {**api_server.get("Pod", "default", "gated")["spec"], "schedulingGates": []}})
    assert s.wait_bound("default", "gated", 5)


def test_each_default_filter_with_its_reason(api_server, sched):
    node(api_server, "n-taint", taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"},
                                        {"key": "soft", "value": "", "effect": "PreferNoSchedule"}])
    node(api_server, "n-cordon", unschedulable=True)
    node(api_server, "n-label", labels={"pool": "cpu"})
    node(api_server, "n-small", cpu="500m", labels={"pool": "gpu"})
    node(api_server, "n-port", labels={"pool": "gpu"})
    pod(api_server, "holder", node_name="n-port", ports=[{"containerPort": 80, "hostPort": 8080}])
    s = sched()
    want = dict(cpu="1", ports=[{"containerPort": 80, "hostPort": 8080}], nodeSelector={"pool": "gpu"})
    pod(api_server, "p", **want)
    assert wait_failure(s, "p") == (
        "0/5 nodes are available: 1 Insufficient cpu, 1 node(s) didn't have free ports for the requested pod ports, "
        "1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {gpu: yes}, "
        "1 node(s) were unschedulable.")

    # tolerating the taint opens that node (its label does not matter: no selector)
    pod(api_server, "tol", cpu="1", tolerations=[{"key": "gpu", "operator": "Equal", "value": "yes",
                                                   "effect": "NoSchedule"}],
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n-taint"]}]}]}}})
    assert s.wait_bound("default", "tol") == "n-taint"
    # required terms are ORed, requirements in a term ANDed
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]},
                              {"key": "pool", "operator": "NotIn", "values": ["gpu"]}]},  # never
        {"matchExpressions": [{"key": "pool", "operator": "Exists"}],
         "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n-port", "n-small"]}]}]}}}
    pod(api_server, "aff", cpu="100m", affinity=aff)
    assert s.wait_bound("default", "aff") == "n-label"
    # the cordoned node takes a pod that tolerates node.kubernetes.io/unschedulable
    pod(api_server, "cordon-ok", tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}],
        nodeSelector={"kubernetes.io/hostname": "n-cordon"})
    assert s.wait_bound("default", "cordon-ok") == "n-cordon"
    # the same host port on another IP of... the same node conflicts (0.0.0.0); another protocol does not
    pod(api_server, "udp", ports=[{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}],
        nodeSelector={"kubernetes.io/hostname": "n-port"})
    assert s.wait_bound("default", "udp") == "n-port"


def test_resources_pods_extended_and_init_containers(api_server, sched):
    node(api_server, "n", cpu="2", memory="1Gi", pods="3", **{"example.com/dev": "2"})
    s = sched()
    # init containers: the largest one against the containers' sum (3 > 2: no fit), sidecars add to both
    pod(api_server, "init-big", cpu="500m", init=[{"name": "i", "image": "x", "resources": {"requests": {"cpu": "3"}}}])
    assert wait_failure(s, "init-big") == "0/1 nodes are available: 1 Insufficient cpu."
    api_server.delete("Pod", "default", "init-big")
    pod(api_server, "init-ok", cpu="1500m", init=[{"name": "i", "image": "x", "resources": {"requests": {"cpu": "2"}}}])
    assert s.wait_bound("default", "init-ok") == "n"
    pod(api_server, "dev", res={"example.com/dev": "2"}, memory="512Mi")
    assert s.wait_bound("default", "dev") == "n"
    pod(api_server, "dev2", res={"example.com/dev": "1"}, memory="600Mi")
    assert wait_failure(s, "dev2") == "0/1 nodes are available: 1 Insufficient example.com/dev, 1 Insufficient memory."
    pod(api_server, "third")
    assert s.wait_bound("default", "third") == "n"
    pod(api_server, "fourth")  # pods: 3 (dev2 is not bound)
    assert wait_failure(s, "fourth") == "0/1 nodes are available: 1 Too many pods."
    # a finished pod frees its place
    api_server.set_status("Pod", "default", "third", {"phase": "Succeeded"})
    assert s.wait_bound("default", "fourth") == "n"


def test_pod_requests_rules():
    c = lambda name, cpu, **kw: {"name": name, "image": "x", "resources": {"requests": {"cpu": cpu}}, **kw}  # noqa: E731
    p = {"spec": {"containers": [c("a", "1"), c("b", "500m")],
                  "initContainers": [c("i1", "2"), c("side", "200m", restartPolicy="Always"), c("i2", "1900m")],
                  "overhead": {"cpu": "100m"}}}
    # containers 1500m + sidecar 200m = 1700m; init: i1 2000m, i2 1900m + 200m = 2100m -> 2100m + overhead
    assert pod_requests(p)["cpu"] == 2200
    assert pod_requests({"spec": {"containers": [{"name": "a", "resources": {"limits": {"memory": "1Ki"}}}]}}) == \
        {"memory": 1024}
    assert pod_requests({"spec": {"containers": [{"name": "a"}]}}, nonzero=True) == \
        {"cpu": 100, "memory": 200 * 1024 * 1024}


# -- extenders -----------------------------------------------------------------


class Extender:
    """A tiny scheduler extender: ``handlers[verb](args) -> (status, body)``;
    every call is kept as (verb, args)."""

    def __init__(self, handlers):
        outer = self
        self.handlers, self.calls = handlers, []

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                args = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                verb = self.path.rsplit("/", 1)[-1]
                outer.calls.append((verb, args))
                status, body = outer.handlers[verb](args)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/scheduler"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def verbs(self, pod_name: str) -> list[str]:
        def name(args):
            return args.get("PodName") or args["Pod"]["metadata"]["name"]
        return [v for v, a in self.calls if name(a) == pod_name]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def extender():
    made = []

    def start(handlers):
        e = Extender(handlers)
        made.append(e)
        return e

    yield start
    for e in made:
        e.close()


GPU = "hamid.io/vgpu"


def test_extender_filter_prioritize_and_bind(api_server, sched, extender):
    for n in ("n1", "n2", "n3"):
        node(api_server, n, cpu="4")
    pod(api_server, "busy", cpu="3", node_name="n3")  # least allocated prefers n1/n2 over n3

    def filter_(args):
        assert "Nodes" not in args and args["Pod"]["metadata"]["name"] and "kind" not in args["Pod"]
        names = args["NodeNames"]
        return 200, {"NodeNames": [n for n in names if n != "n1"],
                     "FailedNodes": {"n1": "GPU memory (4096 MiB requested, at most 2048 free on any GPU)"},
                     "Error": ""}

    def prioritize(args):
        return 200, [{"Host": n, "Score": 10 if n == "n3" else 0} for n in args["NodeNames"]]

    def bind(args):
        r = httpx.post(f"{api_server.url}/api/v1/namespaces/{args['PodNamespace']}/pods/{args['PodName']}/binding",
                       json={"metadata": {"name": args["PodName"], "uid": args["PodUID"]},
                             "target": {"kind": "Node", "name": args["Node"]}})
        return 200, {"Error": "" if r.status_code == 201 else r.text}

    ext = extender({"filter": filter_, "prioritize": prioritize, "bind": bind})
    s = sched({"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration", "extenders": [
        {"urlPrefix": ext.url + "/", "filterVerb": "filter", "prioritizeVerb": "prioritize", "bindVerb": "bind",
         "weight": 2, "nodeCacheCapable": True, "httpTimeout": "2s",
         "managedResources": [{"name": GPU, "ignoredByScheduler": True}]}]})
    # a pod requesting none of the managed resources: the extender is not asked
    pod(api_server, "plain", cpu="100m")
    assert s.wait_bound("default", "plain") in ("n1", "n2")
    assert ext.verbs("plain") == []
    # a GPU pod: filter drops n1, prioritize (x2 x10 = 200) outweighs least allocated, the extender binds
    p = pod(api_server, "gpu", cpu="500m", res={GPU: "1"})
    assert s.wait_bound("default", "gpu") == "n3"
    assert ext.verbs("gpu") == ["filter", "prioritize", "bind"]
    bind_args = ext.calls[-1][1]
    assert bind_args == {"PodName": "gpu", "PodNamespace": "default", "PodUID": p["metadata"]["uid"], "Node": "n3"}
    # no node advertises hamid.io/vgpu: ignoredByScheduler kept NodeResourcesFit out of it

    # FailedNodes reasons join the histogram
    def refuse_all(args):
        return 200, {"NodeNames": [], "FailedNodes": {n: "no GPU fits" for n in args["NodeNames"]}}

    ext.handlers["filter"] = refuse_all
    pod(api_server, "nofit", res={GPU: "1"})
    assert wait_failure(s, "nofit") == "0/3 nodes are available: 3 no GPU fits."
    # an extender's Error fails the attempt (not ignorable)
    ext.handlers["filter"] = lambda args: (200, {"Error": "leader unreachable"})
    pod(api_server, "err", res={GPU: "1"})
    assert wait_failure(s, "err") == "leader unreachable"
    cond = next(c for c in api_server.get("Pod", "default", "err")["status"]["conditions"]
                if c["type"] == "PodScheduled")
    assert cond["reason"] == "SchedulerError"


def test_extender_node_list_and_failures(api_server, sched, extender):
    node(api_server, "n1")
    node(api_server, "n2")
    seen = []

    def filter_(args):  # not node-cache capable: a NodeList comes, a NodeList goes back
        seen.append(sorted(n["metadata"]["name"] for n in args["Nodes"]["items"]))
        return 200, {"nodes": {"items": [n for n in args["Nodes"]["items"] if n["metadata"]["name"] == "n2"]},
                     "failedAndUnresolvableNodes": {"n1": "wrong zone"}, "failedNodes": {"n1": "ignored"}}

    ext = extender({"filter": filter_, "bind": lambda a: (500, {})})
    s = sched({"extenders": [{"urlPrefix": ext.url, "filterVerb": "filter", "bindVerb": "bind", "ignorable": True}]})
    pod(api_server, "p")
    # filter keeps n2; the bind error of an ignorable extender falls back to the default binder
    assert s.wait_bound("default", "p") == "n2"
    assert seen == [["n1", "n2"]]
    ext.handlers["filter"] = lambda a: (200, {"Nodes": {"items": []}, "FailedAndUnresolvableNodes": {
        "n1": "wrong zone"}, "FailedNodes": {"n1": "ignored", "n2": "full"}})
    pod(api_server, "q")
    assert wait_failure(s, "q") == "0/2 nodes are available: 1 full, 1 wrong zone."


def test_extender_down_ignorable_or_not(api_server, sched):
    node(api_server, "n1")
    dead = "http://127.0.0.1:9/scheduler"  # discard port: refused
    s = sched({"extenders": [{"urlPrefix": dead, "filterVerb": "filter", "ignorable": True}]})
    pod(api_server, "p")
    assert s.wait_bound("default", "p") == "n1"  # skipped: the in-tree result
    s.stop()
    s2 = sched({"extenders": [{"urlPrefix": dead, "filterVerb": "filter", "ignorable": False}]})
    pod(api_server, "q")
    assert wait_failure(s2, "q").startswith('Post "http://127.0.0.1:9/scheduler/filter": ConnectError')
    assert api_server.get("Pod", "default", "q")["spec"].get("nodeName") is None


def test_ignored_by_scheduler_decides_whether_node_resources_fit_checks(api_server, sched):
    node(api_server, "n1")
    ok = lambda a: (200, {"NodeNames": a["NodeNames"]})  # noqa: E731
    srv = Extender({"filter": ok})
    try:
        s = sched({"extenders": [{"urlPrefix": srv.url, "filterVerb": "filter", "nodeCacheCapable": True,
                                  "managedResources": [{"name": GPU}]}]})
        pod(api_server, "p", res={GPU: "1"})
        assert wait_failure(s, "p") == f"0/1 nodes are available: 1 Insufficient {GPU}."
        assert srv.calls == []  # in-tree filters left no node: the extender is not asked
    finally:
        srv.close()


def test_config_is_checked():
    with pytest.raises(ValueError, match="only one extender can implement bind, found 2"):
        parse_config({"extenders": [{"urlPrefix": "http://a", "bindVerb": "b"}, {"urlPrefix": "http://b",
                                                                                 "bindVerb": "b"}]})
    with pytest.raises(ValueError, match="no preemption"):
        parse_config({"extenders": [{"urlPrefix": "http://a", "preemptVerb": "p"}]})
    with pytest.raises(ValueError, match=r"\['certData'\] not implemented"):
        parse_config({"extenders": [{"urlPrefix": "https://a", "enableHTTPS": True, "tlsConfig": {"certData": "x"}}]})
    with pytest.raises(ValueError, match="certFile and keyFile go together"):
        parse_config({"extenders": [{"urlPrefix": "https://a", "tlsConfig": {"certFile": "/c"}}]})
    with pytest.raises(ValueError, match="urlPrefix that is not https://"):
        parse_config({"extenders": [{"urlPrefix": "http://a", "enableHTTPS": True}]})
    _, (https,) = parse_config({"extenders": [{"urlPrefix": "https://a", "enableHTTPS": True}]})
    assert https.tls == {}  # no CA given: kube-scheduler's transport then skips verification
    with pytest.raises(ValueError, match="must have a positive weight"):
        parse_config({"extenders": [{"urlPrefix": "http://a", "prioritizeVerb": "p", "weight": 0}]})
    with pytest.raises(ValueError, match=r"\['percentageOfNodesToScore'\] not implemented"):
        parse_config({"percentageOfNodesToScore": 50})
    with pytest.raises(ValueError, match="not a duration"):
        parse_config({"extenders": [{"urlPrefix": "http://a", "httpTimeout": "soon"}]})
    names, (e,) = parse_config({"profiles": [{"schedulerName": "hamid"}], "extenders": [
        {"urlPrefix": "http://a", "httpTimeout": "1m30s"}]})
    assert names == ["hamid"] and e.http_timeout == 90.0 and e.weight == 1 and e.interested({"spec": {}})


def test_prioritize_weight_against_least_allocated(api_server, sched, extender):
    # least allocated: n1 (empty) scores 96, n2 (2 of 4 cpu used) 68; the extender gives n2 a score of 2,
    # worth 2 x weight x 10: weight 1 (20) leaves n1 ahead, weight 2 (40) puts n2 ahead
    node(api_server, "n1", cpu="4", memory="4Gi")
    node(api_server, "n2", cpu="4", memory="4Gi")
    pod(api_server, "load", cpu="2", node_name="n2")
    ext = extender({"prioritize": lambda a: (200, [{"Host": "n2", "Score": 2}, {"Host": "n1", "Score": 0}])})
    for weight, want in ((1, "n1"), (2, "n2")):
        s = sched({"extenders": [{"urlPrefix": ext.url, "prioritizeVerb": "prioritize", "weight": weight,
                                  "nodeCacheCapable": True}]})
        pod(api_server, f"w{weight}")
        assert s.wait_bound("default", f"w{weight}") == want
        s.stop()
        api_server.delete("Pod", "default", f"w{weight}", grace_period=0)
