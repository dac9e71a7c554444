"""kube-scheduler's default filters as pure functions (hamid/scheduling/kubefit.py, fitsummary.py, narrow.py).

Each filter and each reason has its own cases; quantities are checked against
apimachinery's grammar and rounding; the message is checked for
kube-scheduler's ordering and for the placement engine's real GPU reasons
(produced by ``hamid.placement.place`` on real NodeViews); the narrowing
patch is applied with the ``jsonpatch`` library, judged again by ``kube_filters``
and sent to the API-server stand-in, which enforces KEP-3838's rules for
gated pods.
"""

from __future__ import annotations

import copy
from fractions import Fraction

import httpx
import jsonpatch
import pytest

from hamid.request.quantity import quantity
from hamid.scheduling.fitsummary import summarize
from hamid.scheduling.kubefit import (REASON_AFFINITY, REASON_AFFINITY_CONFLICT, REASON_AFFINITY_PREFILTER,
                                      REASON_NODE_NAME, REASON_PORTS, REASON_TOO_MANY_PODS, REASON_UNSCHEDULABLE,
                                      kube_filters, pod_requests)
from hamid.scheduling.narrow import narrow_to_node
from hamid.placement import NodeView, place
from hamid.placement.result import NoFit
from hamid.placement.view import MODE_SHIM, GpuView
from hamid.request import parse_pod

GPU = {"nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores"}
ALLOC = {"cpu": "4", "memory": "8Gi", "ephemeral-storage": "100Gi", "pods": "10"}


def node(name="n1", labels=None, taints=None, unschedulable=False, **alloc):
    spec = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
            "spec": spec, "status": {"allocatable": {**ALLOC, **alloc}}}


def container(name="c", requests=None, limits=None, ports=None, restart=None):
    c = {"name": name, "image": "busybox", "resources": {}}
    if requests:
        c["resources"]["requests"] = requests
    if limits:
        c["resources"]["limits"] = limits
    if ports:
        c["ports"] = ports
    if restart:
        c["restartPolicy"] = restart
    return c


def pod(name="p", containers=None, init=None, uid=None, phase=None, **spec):
    p = {"metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{name}"},
         "spec": {"containers": containers or [container(requests={"cpu": "100m"})], **spec}}
    if init:
        p["spec"]["initContainers"] = init
    if phase:
        p["status"] = {"phase": phase}
    return p


def fit(p, n=None, others=(), ignored=GPU):
    return kube_filters(p, n or node(), list(others), ignored_resources=set(ignored))


# -- quantities ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text,want", [
    ("0", 0), ("+0", 0), ("-0", 0), ("2", 2), ("100m", Fraction(1, 10)), ("1.5", Fraction(3, 2)),
    (".5", Fraction(1, 2)), ("5.", 5), ("-1", -1), ("+1k", 1000), ("1Ki", 1024), ("4Gi", 4 * 2**30),
    ("1.5Gi", 3 * 2**29), ("0.5Ki", 512), ("1e3", 1000), ("1E3", 1000), ("1.5e+3", 1500), ("1e-3", Fraction(1, 1000)),
    ("1E", 10**18),  # E alone is exa, not an exponent
    ("1n", Fraction(1, 10**9)), ("1u", Fraction(1, 10**6)), ("3M", 3 * 10**6), ("2T", 2 * 10**12),
    ("1P", 10**15), ("7Ei", 7 * 2**60), ("1Pi", 2**50), ("1Ti", 2**40), ("1Mi", 2**20),
    ("0.0000000001", Fraction(1, 10**9)),  # below a nano: rounded up to 1n, as ParseQuantity does
    ("1e-20", Fraction(1, 10**9)),
    ("0.0000000001Ki", Fraction(103, 10**9)),  # 102.4n, up to 103n ("1.0000000001", Fraction(10**9 + 1, 10**9)),
    ("-0.0000000001", Fraction(-1, 10**9)),  # away from zero
    ("9223372036854775807", 2**63 - 1), ("007", 7), (3, 3),
])
def test_quantity_parses_exactly(text, want):
    assert quantity(text) == want


@pytest.mark.parametrize("text", [
    "", "1K", "1_000", " 1", "1 ", "NaN", "Infinity", "1e3k", "1ki", "1mi", "1e", "Mi", ".", "1.5.5", "0x10",
    "\u0661", "1e3.5", "--1", "1Gib", "9223372036854775808", "8Ei", "1e19", True, 1.5, None,
])
def test_quantity_refuses_what_kubernetes_refuses(text):
    with pytest.raises(ValueError) as e:
        quantity(text)
    assert repr(text) in str(e.value)
    assert "accepted" in str(e.value) or "2^63-1" in str(e.value)


def test_a_bad_request_quantity_names_the_field():
    with pytest.raises(ValueError, match=r"spec\.containers\[0\]\.resources\['cpu'\]: bad quantity '1K'"):
        pod_requests(pod(containers=[container(requests={"cpu": "1K"})]))
    with pytest.raises(ValueError, match=r"status\.allocatable\['memory'\]"):
        fit(pod(), node(memory="lots"))


# -- NodeUnschedulable, NodeName, TaintToleration ---------------------------------------------------------


@pytest.mark.parametrize("tolerations,want", [
    ([], [REASON_UNSCHEDULABLE]),
    ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}], []),
    ([{"operator": "Exists"}], []),  # tolerates everything
    ([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoExecute"}],
     [REASON_UNSCHEDULABLE]),
])
def test_unschedulable(tolerations, want):
    assert fit(pod(tolerations=tolerations), node(unschedulable=True)) == want
    assert fit(pod(tolerations=tolerations), node()) == []


def test_node_name():
    assert fit(pod(nodeName="n2"), node("n1")) == [REASON_NODE_NAME]
    assert fit(pod(nodeName="n1"), node("n1")) == []


@pytest.mark.parametrize("taint,tolerations,want", [
    ({"key": "gpu", "value": "no", "effect": "NoSchedule"}, [], ["node(s) had untolerated taint {gpu: no}"]),
    ({"key": "gpu", "effect": "NoExecute"}, [], ["node(s) had untolerated taint {gpu: }"]),  # empty value shown so
    ({"key": "gpu", "value": "no", "effect": "PreferNoSchedule"}, [], []),  # not a filter
    ({"key": "gpu", "value": "no", "effect": "NoSchedule"},
     [{"key": "gpu", "operator": "Equal", "value": "no", "effect": "NoSchedule"}], []),
    ({"key": "gpu", "value": "no", "effect": "NoSchedule"}, [{"key": "gpu", "value": "no"}], []),  # Equal default
    ({"key": "gpu", "value": "no", "effect": "NoSchedule"}, [{"key": "gpu", "value": "yes"}],
     ["node(s) had untolerated taint {gpu: no}"]),
    ({"key": "gpu", "value": "no", "effect": "NoSchedule"}, [{"key": "gpu", "operator": "Exists"}], []),
    ({"key": "gpu", "value": "no", "effect": "NoSchedule"}, [{"operator": "Exists"}], []),
    ({"key": "gpu", "value": "no", "effect": "NoSchedule"},
     [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}], ["node(s) had untolerated taint {gpu: no}"]),
    ({"key": "gpu", "value": "no", "effect": "NoSchedule"}, [{"key": "other", "operator": "Exists"}],
     ["node(s) had untolerated taint {gpu: no}"]),
])
def test_taints(taint, tolerations, want):
    assert fit(pod(tolerations=tolerations), node(taints=[taint])) == want


def test_the_first_untolerated_taint_is_named():
    taints = [{"key": "a", "value": "1", "effect": "PreferNoSchedule"},
              {"key": "b", "value": "2", "effect": "NoSchedule"},
              {"key": "c", "value": "3", "effect": "NoSchedule"}]
    assert fit(pod(), node(taints=taints)) == ["node(s) had untolerated taint {b: 2}"]


# -- NodeAffinity -----------------------------------------------------------------------------------------------


def required(*terms):
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def expr(key, op, *values):
    e = {"key": key, "operator": op}
    if values:
        e["values"] = list(values)
    return e


LABELS = {"zone": "a", "gen": "9", "gpu": "h100"}


@pytest.mark.parametrize("term,fits", [
    ({"matchExpressions": [expr("zone", "In", "a", "b")]}, True),
    ({"matchExpressions": [expr("zone", "In", "b")]}, False),
    ({"matchExpressions": [expr("missing", "In", "a")]}, False),
    ({"matchExpressions": [expr("zone", "NotIn", "b")]}, True),
    ({"matchExpressions": [expr("zone", "NotIn", "a")]}, False),
    ({"matchExpressions": [expr("missing", "NotIn", "a")]}, True),  # an absent label is not in any set
    ({"matchExpressions": [expr("zone", "Exists")]}, True),
    ({"matchExpressions": [expr("missing", "Exists")]}, False),
    ({"matchExpressions": [expr("missing", "DoesNotExist")]}, True),
    ({"matchExpressions": [expr("zone", "DoesNotExist")]}, False),
    ({"matchExpressions": [expr("gen", "Gt", "8")]}, True),
    ({"matchExpressions": [expr("gen", "Gt", "9")]}, False),
    ({"matchExpressions": [expr("gen", "Lt", "10")]}, True),
    ({"matchExpressions": [expr("gen", "Lt", "9")]}, False),
    ({"matchExpressions": [expr("gpu", "Gt", "1")]}, False),  # not an integer
    ({"matchExpressions": [expr("missing", "Lt", "1")]}, False),
    ({"matchExpressions": [expr("zone", "Matches", "a")]}, False),  # unknown operator: no match
    ({"matchExpressions": [expr("zone", "In", "a"), expr("gen", "Gt", "10")]}, False),  # ANDed
    ({"matchFields": [expr("metadata.name", "NotIn", "n2")]}, True),
    ({"matchFields": [expr("metadata.name", "NotIn", "n1")]}, False),
    ({"matchFields": [expr("metadata.uid", "In", "x")]}, False),  # only metadata.name is supported
    ({}, False),  # an empty term matches nothing
    ({"matchExpressions": []}, False),
])
def test_required_node_affinity_terms(term, fits):
    n = node("n1", labels=LABELS)
    assert fit(pod(affinity=required(term)), n) == ([] if fits else [REASON_AFFINITY])


def test_terms_are_ored():
    n = node("n1", labels=LABELS)
    terms = [{"matchExpressions": [expr("zone", "In", "z")]}, {"matchExpressions": [expr("gpu", "In", "h100")]}]
    assert fit(pod(affinity=required(*terms)), n) == []
    assert fit(pod(affinity=required(terms[0])), n) == [REASON_AFFINITY]


def test_no_terms_or_no_required_affinity_is_no_constraint():
    assert fit(pod(affinity=required()), node()) == []
    assert fit(pod(affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [expr("zone", "In", "z")]}}]}}), node()) == []


@pytest.mark.parametrize("selector,fits", [({"zone": "a"}, True), ({"zone": "b"}, False), ({"missing": ""}, False),
                                           ({"zone": "a", "gpu": "h100"}, True), ({"zone": "a", "gpu": "a100"}, False)])
def test_node_selector(selector, fits):
    assert fit(pod(nodeSelector=selector), node(labels=LABELS)) == ([] if fits else [REASON_AFFINITY])


def test_node_selector_and_affinity_both_hold():
    p = pod(nodeSelector={"zone": "a"}, affinity=required({"matchExpressions": [expr("gpu", "In", "a100")]}))
    assert fit(p, node(labels=LABELS)) == [REASON_AFFINITY]


def test_names_in_every_term_restrict_the_nodes_before_filtering():
    """NodeAffinity's PreFilter: nodes outside the named set are not filtered, and say so."""
    p = pod(affinity=required({"matchFields": [expr("metadata.name", "In", "n1", "n2")]},
                              {"matchFields": [expr("metadata.name", "In", "n3")],
                               "matchExpressions": [expr("zone", "In", "a")]}))
    assert fit(p, node("n9", labels=LABELS)) == [REASON_AFFINITY_PREFILTER]
    assert fit(p, node("n9", labels=LABELS, unschedulable=True)) == [REASON_AFFINITY_PREFILTER]  # before the rest
    assert fit(p, node("n1")) == []
    assert fit(p, node("n3", labels={"zone": "b"})) == [REASON_AFFINITY]  # named, but the term's label fails
    assert fit(p, node("n3", labels=LABELS)) == []
    # a term without a name requirement: every node is a candidate
    q = pod(affinity=required({"matchFields": [expr("metadata.name", "In", "n1")]},
                              {"matchExpressions": [expr("zone", "In", "a")]}))
    assert fit(q, node("n9", labels=LABELS)) == []
    assert fit(q, node("n9")) == [REASON_AFFINITY]


def test_terms_naming_no_common_node_conflict():
    p = pod(affinity=required({"matchFields": [expr("metadata.name", "In", "n1"), expr("metadata.name", "In", "n2")]}))
    assert fit(p, node("n1")) == [REASON_AFFINITY_CONFLICT]
    assert summarize({"n1": [REASON_AFFINITY_CONFLICT], "n2": [REASON_AFFINITY_CONFLICT]}, 2) == \
        "0/2 nodes are available: pod affinity terms conflict."


# -- NodePorts ------------------------------------------------------------------------------------------------


def with_port(name, port, ip=None, proto=None, init=False, sidecar=False):
    pp = {"containerPort": 80, "hostPort": port}
    if ip:
        pp["hostIP"] = ip
    if proto:
        pp["protocol"] = proto
    c = container(requests={"cpu": "10m"}, ports=[pp], restart="Always" if sidecar else None)
    if init or sidecar:
        return pod(name, init=[c], containers=[container(requests={"cpu": "10m"})])
    return pod(name, containers=[c])


@pytest.mark.parametrize("mine,theirs,conflict", [
    (dict(port=8080), dict(port=8080), True),
    (dict(port=8080), dict(port=8081), False),
    (dict(port=8080, proto="UDP"), dict(port=8080), False),
    (dict(port=8080, proto="TCP"), dict(port=8080), True),  # empty protocol is TCP
    (dict(port=8080, ip="10.0.0.1"), dict(port=8080, ip="10.0.0.2"), False),
    (dict(port=8080, ip="10.0.0.1"), dict(port=8080, ip="10.0.0.1"), True),
    (dict(port=8080, ip="10.0.0.1"), dict(port=8080), True),  # theirs binds every address
    (dict(port=8080), dict(port=8080, ip="10.0.0.2"), True),  # mine binds every address
    (dict(port=8080, ip="0.0.0.0"), dict(port=8080, ip="10.0.0.2"), True),
    (dict(port=8080), dict(port=8080, init=True), False),  # a plain init container holds no port
    (dict(port=8080), dict(port=8080, sidecar=True), True),  # a sidecar does
    (dict(port=8080, init=True), dict(port=8080), False),
    (dict(port=8080, sidecar=True), dict(port=8080), True),
])
def test_host_ports(mine, theirs, conflict):
    other = with_port("other", **theirs)
    assert fit(with_port("mine", **mine), node(), [other]) == ([REASON_PORTS] if conflict else [])
    other["status"] = {"phase": "Succeeded"}
    assert fit(with_port("mine", **mine), node(), [other]) == []  # a finished pod holds nothing


def test_ports_are_checked_before_resources():
    mine = with_port("mine", 8080)
    mine["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "64"
    assert fit(mine, node(), [with_port("other", 8080)]) == [REASON_PORTS]


# -- NodeResourcesFit -----------------------------------------------------------------------------------------


def asks(**requests):
    return pod(containers=[container(requests={k.replace("_", "-"): v for k, v in requests.items()})])


def using(name, **requests):
    p = asks(**requests)
    p["metadata"] = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    return p


@pytest.mark.parametrize("want,others,reasons", [
    (dict(cpu="4"), [], []),
    (dict(cpu="4001m"), [], ["Insufficient cpu"]),
    (dict(cpu="2"), [dict(cpu="2")], []),
    (dict(cpu="2"), [dict(cpu="2001m")], ["Insufficient cpu"]),
    (dict(cpu="1m"), [dict(cpu="3999m")], []),
    (dict(cpu="0.0001"), [dict(cpu="3999m")], []),  # 0.1m counts as 1m (MilliValue rounds up)
    (dict(cpu="1.0001m"), [dict(cpu="3999m")], ["Insufficient cpu"]),  # 2m
    (dict(memory="8Gi"), [], []),
    (dict(memory="8589934593"), [], ["Insufficient memory"]),  # 8Gi + 1 byte
    (dict(memory="0.5"), [dict(memory="8Gi")], ["Insufficient memory"]),  # half a byte counts as one
    (dict(memory="4Gi"), [dict(memory="4294967296")], []),
    # each pod's total is rounded up before it is added: exact sums would fit these
    (dict(cpu="0.0004"), [dict(cpu="3999.5m")], ["Insufficient cpu"]),
    (dict(memory="0.25"), [dict(memory="8589934591.5")], ["Insufficient memory"]),
    (dict(ephemeral_storage="101Gi"), [], ["Insufficient ephemeral-storage"]),
    (dict(cpu="5", memory="9Gi"), [], ["Insufficient cpu", "Insufficient memory"]),  # every one, in order
    (dict(cpu="0"), [dict(cpu="4")], []),  # a zero request is not checked
    (dict(**{"example.com/foo": "1"}), [], ["Insufficient example.com/foo"]),  # absent: none allocatable
    (dict(**{"hugepages-2Mi": "2Mi"}), [], ["Insufficient hugepages-2Mi"]),
    (dict(**{"nvidia.com/gpumem": "4096"}), [], []),  # hamid's own: ignored
    (dict(**{"nvidia.com/gpu": "1", "example.com/foo": "1"}), [], ["Insufficient example.com/foo"]),
    (dict(storage="1Ti"), [], []),  # not a resource kube-scheduler counts
])
def test_resources(want, others, reasons):
    assert fit(asks(**want), node(), [using(f"o{i}", **o) for i, o in enumerate(others)]) == reasons


def test_extended_resources_against_allocatable_and_use():
    n = node(**{"example.com/foo": "3"})
    assert fit(asks(**{"example.com/foo": "2"}), n, [using("o", **{"example.com/foo": "1"})]) == []
    assert fit(asks(**{"example.com/foo": "2"}), n, [using("o", **{"example.com/foo": "2"})]) == \
        ["Insufficient example.com/foo"]
    assert fit(asks(**{"nvidia.com/gpu": "9"}), node(), ignored=set()) == ["Insufficient nvidia.com/gpu"]


def test_too_many_pods():
    others = [using(f"o{i}", cpu="1m") for i in range(10)]
    assert fit(asks(cpu="1m"), node(), others[:9]) == []
    assert fit(asks(cpu="1m"), node(), others) == [REASON_TOO_MANY_PODS]
    assert fit(asks(cpu="3990m"), node(), others) == [REASON_TOO_MANY_PODS]  # 10 x 1m used
    assert fit(asks(cpu="3991m"), node(), others) == [REASON_TOO_MANY_PODS, "Insufficient cpu"]
    n = node()
    del n["status"]["allocatable"]["pods"]  # none allocatable: kube-scheduler allows 0
    assert fit(asks(cpu="1m"), n) == [REASON_TOO_MANY_PODS]


def test_terminal_pods_and_the_pod_itself_are_not_counted():
    done = [using("a", cpu="4"), using("b", cpu="4")]
    done[0]["status"] = {"phase": "Succeeded"}
    done[1]["status"] = {"phase": "Failed"}
    assert fit(asks(cpu="4"), node(), done) == []
    me = asks(cpu="3")
    assert fit(me, node(), [me]) == []  # listed on the node already (a retry): not twice
    running = using("r", cpu="1")
    running["status"] = {"phase": "Running"}
    assert fit(asks(cpu="3001m"), node(), [running]) == ["Insufficient cpu"]


@pytest.mark.parametrize("app,init,want", [
    ([{"cpu": "1"}], [({"cpu": "3"}, None)], 3000),  # the larger init container
    ([{"cpu": "1"}, {"cpu": "1"}], [({"cpu": "1500m"}, None)], 2000),  # the app sum
    ([{"cpu": "1"}], [({"cpu": "2"}, None), ({"cpu": "500m"}, None)], 2000),  # init containers run one at a time
    # a sidecar runs beside the app and beside the init containers after it
    ([{"cpu": "1"}], [({"cpu": "1"}, "Always"), ({"cpu": "5"}, None)], 6000),
    ([{"cpu": "1"}], [({"cpu": "5"}, None), ({"cpu": "1"}, "Always")], 5000),
    ([{"cpu": "3"}], [({"cpu": "1"}, "Always"), ({"cpu": "2"}, None)], 4000),
    ([{"cpu": "1"}], [({"cpu": "1"}, "Always"), ({"cpu": "1"}, "Always"), ({"cpu": "1"}, None)], 3000),
])
def test_init_and_sidecar_rule(app, init, want):
    p = pod(containers=[container(f"a{i}", requests=r) for i, r in enumerate(app)],
            init=[container(f"i{i}", requests=r, restart=rp) for i, (r, rp) in enumerate(init)])
    assert pod_requests(p)["cpu"] * 1000 == want
    n = node(cpu=f"{want}m")
    assert fit(p, n) == []
    assert fit(p, node(cpu=f"{want - 1}m")) == ["Insufficient cpu"]


def test_overhead_pod_level_requests_and_limits():
    p = asks(cpu="1", memory="1Gi")
    p["spec"]["overhead"] = {"cpu": "250m", "memory": "120Mi"}
    assert pod_requests(p) == {"cpu": Fraction(5, 4), "memory": 2**30 + 120 * 2**20}
    assert fit(p, node(cpu="1250m")) == []
    assert fit(p, node(cpu="1249m")) == ["Insufficient cpu"]
    # pod-level requests replace the containers' cpu and memory; other resources stay the containers'
    q = asks(cpu="100m", memory="1Gi", ephemeral_storage="1Gi")
    q["spec"]["resources"] = {"requests": {"cpu": "3", "memory": "2Gi"}}
    assert pod_requests(q) == {"cpu": 3, "memory": 2 * 2**30, "ephemeral-storage": 2**30}
    assert fit(q, node(cpu="2")) == ["Insufficient cpu"]
    # a limit with no request stands for the request (the API server's defaulting)
    r = pod(containers=[container(limits={"cpu": "2", "example.com/foo": "1"}, requests={"memory": "1Gi"})])
    assert pod_requests(r) == {"cpu": 2, "example.com/foo": 1, "memory": 2**30}


def test_a_pod_read_again_with_a_new_resource_version_is_counted_anew():
    """Requests are remembered per (uid, resourceVersion); an update (a new resourceVersion) is seen."""
    other = using("o", cpu="3")
    other["metadata"]["resourceVersion"] = "7"
    assert fit(asks(cpu="1"), node(), [other]) == []
    other = copy.deepcopy(other)
    other["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "3500m"
    other["metadata"]["resourceVersion"] = "8"
    assert fit(asks(cpu="1"), node(), [other]) == ["Insufficient cpu"]
    assert fit(asks(cpu="500m"), node(), [other]) == []


def test_other_pods_count_their_own_init_rule_and_overhead():
    other = pod("o", containers=[container(requests={"cpu": "1"})], init=[container("i", requests={"cpu": "2"})])
    other["spec"]["overhead"] = {"cpu": "500m"}
    assert fit(asks(cpu="1500m"), node(), [other]) == []  # 4 - 2.5
    assert fit(asks(cpu="1501m"), node(), [other]) == ["Insufficient cpu"]


def test_only_the_first_rejecting_plugin_speaks():
    p = pod(containers=[container(requests={"cpu": "64"}, ports=[{"containerPort": 1, "hostPort": 9}])],
            nodeSelector={"zone": "z"})
    n = node(taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}], unschedulable=True)
    assert fit(p, n, [with_port("o", 9)]) == [REASON_UNSCHEDULABLE]
    n["spec"].pop("unschedulable")
    assert fit(p, n, [with_port("o", 9)]) == ["node(s) had untolerated taint {k: v}"]
    n["spec"].pop("taints")
    assert fit(p, n, [with_port("o", 9)]) == [REASON_AFFINITY]
    p["spec"].pop("nodeSelector")
    assert fit(p, n, [with_port("o", 9)]) == [REASON_PORTS]
    assert fit(p, n) == ["Insufficient cpu"]


# -- summarize ----------------------------------------------------------------------------------------------


def test_summarize_counts_each_reason_once_per_node_and_sorts_like_kube_scheduler():
    reasons = {f"n{i}": ["Insufficient cpu"] for i in range(10)}
    taint = "node(s) had untolerated taint {gpu: no}"
    reasons.update({"t1": [taint], "t2": [taint]})
    reasons["m"] = ["Insufficient memory", "Insufficient cpu", "Insufficient memory"]
    # sort.Strings over "<count> <reason>": "1 I..." < "11 ..." < "2 n..." (a string sort, not a count sort)
    assert summarize(reasons, 13) == ("0/13 nodes are available: 1 Insufficient memory, 11 Insufficient cpu, "
                                      "2 node(s) had untolerated taint {gpu: no}.")


def test_summarize_edges():
    assert summarize({}, 0) == "0/0 nodes are available: no nodes available to schedule pods."
    assert summarize({}, 3) == "0/3 nodes are available:"
    assert summarize({"n1": ["no hamid daemon publishes this node's GPUs"]}, 1) == \
        "0/1 nodes are available: 1 no hamid daemon publishes this node's GPUs."


def gpu(i, mem_total=8192, mem_used=0, cores_used=0, shares_used=0, shares=10, **kw):
    return GpuView(uuid=f"GPU-{i}", index=i, name="NVIDIA H100", mode=MODE_SHIM, mem_total=mem_total,
                   cores_total=100, shares_total=shares, mem_used=mem_used, cores_used=cores_used,
                   shares_used=shares_used, **kw)


def gpu_pod(mem=4096, cores=None, count=1):
    limits = {"nvidia.com/gpu": str(count), "nvidia.com/gpumem": str(mem)}
    if cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    return pod(containers=[container(limits=limits)])


def engine_reasons(p, views):
    got = place(parse_pod(p), views)
    assert isinstance(got, NoFit), got
    return {k: list(v) for k, v in got.reasons.items()}


def test_summarize_folds_the_engines_gpu_memory_reasons():
    views = [NodeView("g1", (gpu(0, mem_used=6144), gpu(1, mem_used=7168))),
             NodeView("g2", (gpu(0, mem_used=8192 - 2048),)),
             NodeView("g3", (gpu(0, mem_used=8000), gpu(1, mem_used=8100)))]
    reasons = engine_reasons(gpu_pod(4096), views)
    reasons["t1"] = ["node(s) had untolerated taint {gpu: no}"]
    reasons["t2"] = ["node(s) had untolerated taint {gpu: no}"]
    assert summarize(reasons, 5) == ("0/5 nodes are available: 2 node(s) had untolerated taint {gpu: no}, "
                                     "3 GPU memory (4096 MiB requested, at most 2048 free on any GPU).")


@pytest.mark.parametrize("views,request_,text", [
    ([NodeView("g1", (gpu(0, cores_used=80),)), NodeView("g2", (gpu(0, cores_used=70),))], dict(mem=10, cores=50),
     "2 GPU cores (50% requested, at most 30% free on any GPU)"),
    ([NodeView("g1", (gpu(0, shares_used=2, shares=2),)), NodeView("g2", (gpu(0, shares_used=1, shares=1),))],
     dict(mem=10), "2 GPU shares (all in use: deviceSplitCount)"),
    ([NodeView("g1", (gpu(0, shares_used=1, exclusive=True),))], dict(mem=10), "1 GPU held exclusively (cores=100)"),
    ([NodeView("g1", (gpu(0, shares_used=1, mem_used=10, cores_used=10),))], dict(mem=10, cores=100),
     "1 GPU in use (an idle GPU is needed)"),
    ([NodeView("g1", (gpu(0, healthy=False),)), NodeView("g2", (gpu(0, healthy=False), gpu(1, healthy=False)))],
     dict(mem=10), "2 GPU unhealthy"),
    ([NodeView("g1", (gpu(0, cordoned=True),))], dict(mem=10), "1 GPU cordoned (hami.io/device-cordon)"),
    ([NodeView("g1", ())], dict(mem=10), "1 GPU count (1 requested, at most 0 fit on any node)"),
    ([NodeView("g1", (gpu(0), gpu(1, mem_used=8000))), NodeView("g2", (gpu(0),))], dict(mem=4096, count=2),
     "GPU count (2 requested, at most 1 fit on any node)"),
])
def test_summarize_folds_other_gpu_reasons(views, request_, text):
    msg = summarize(engine_reasons(gpu_pod(**request_), views), len(views))
    assert msg.startswith(f"0/{len(views)} nodes are available: ") and msg.endswith(".")
    assert text in msg, msg
    assert "GPU 0" not in msg and "GPU 1" not in msg  # per-GPU wording is folded


def test_summarize_keeps_different_requests_apart_and_takes_the_most_free():
    from hamid.placement.reasons import Reason, in_container

    def mem(g, free, asked):
        return Reason("mem", f"GPU {g} has {free} MiB free, {asked} requested", gpu=g, asked=asked, free=free)

    reasons = {"a": [in_container(mem(0, 100, 4096), "x"), in_container(mem(0, 100, 2048), "y"),
                     Reason("count", "needs 1 GPU(s), 0 fit", asked=1, free=0)],
               "b": [mem(3, 1500, 4096), mem(4, 900, 4096)]}
    assert summarize(reasons, 2) == ("0/2 nodes are available: 1 GPU memory (2048 MiB requested, at most 100 free on "
                                     "any GPU), 2 GPU memory (4096 MiB requested, at most 1500 free on any GPU).")


# -- narrow_to_node -----------------------------------------------------------------------------------------


NAMED = {"key": "metadata.name", "operator": "In", "values": ["n2"]}
AFFINITIES = {
    "none": None,
    "pod affinity only": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": []}},
    "preferred only": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [expr("zone", "In", "b")]}}]}},
    "no terms": required(),
    "one term": required({"matchExpressions": [expr("zone", "In", "a", "b")]}),
    "two terms": required({"matchExpressions": [expr("zone", "In", "z")]},
                          {"matchExpressions": [expr("gpu", "In", "h100")],
                           "matchFields": [expr("metadata.name", "NotIn", "n9")]}),
}


@pytest.mark.parametrize("which", list(AFFINITIES))
def test_narrowed_pod_fits_only_that_node_and_keeps_its_terms(which):
    p = pod(containers=[container(requests={"cpu": "1"})])
    if AFFINITIES[which] is not None:
        p["spec"]["affinity"] = copy.deepcopy(AFFINITIES[which])
    nodes = [node(f"n{i}", labels=LABELS) for i in range(1, 4)]
    assert all(fit(p, n) == [] for n in nodes)
    ops = narrow_to_node(p, "n2")
    narrowed = jsonpatch.apply_patch(p, ops)
    assert [fit(narrowed, n) for n in nodes] == [[REASON_AFFINITY_PREFILTER], [], [REASON_AFFINITY_PREFILTER]]
    old_terms = (((p["spec"].get("affinity") or {}).get("nodeAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
    new_terms = narrowed["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert len(new_terms) == max(1, len(old_terms))
    for o, n in zip(old_terms, new_terms):  # each kept as a prefix, the name appended
        assert n.get("matchExpressions") == o.get("matchExpressions")
        assert n["matchFields"] == [*(o.get("matchFields") or []), {**NAMED}]
    # everything else of the pod is as it was
    rest = copy.deepcopy(narrowed)
    rest["spec"]["affinity"]["nodeAffinity"].pop("requiredDuringSchedulingIgnoredDuringExecution")
    before = copy.deepcopy(p)
    before["spec"].setdefault("affinity", {}).setdefault("nodeAffinity", {}).pop(
        "requiredDuringSchedulingIgnoredDuringExecution", None)
    assert rest == before


def test_narrowing_keeps_constraints_the_chosen_node_fails():
    p = pod(affinity=copy.deepcopy(AFFINITIES["two terms"]))
    narrowed = jsonpatch.apply_patch(p, narrow_to_node(p, "n2"))
    assert fit(narrowed, node("n2", labels={"zone": "a"})) == [REASON_AFFINITY]  # no gpu=h100: still refused
    assert fit(narrowed, node("n2", labels={"zone": "z"})) == []


def test_narrow_to_node_refuses_bad_input():
    with pytest.raises(ValueError, match="node name ''"):
        narrow_to_node(pod(), "")
    with pytest.raises(ValueError, match="pod has no spec"):
        narrow_to_node({"metadata": {}}, "n1")


@pytest.mark.parametrize("which", list(AFFINITIES))
def test_the_api_server_accepts_the_narrowing_of_a_gated_pod(api_server, which):
    """The stand-in enforces KEP-3838 for gated pods: narrowing (and removing the gate in the same
    patch) is accepted; a change that widens a term is refused, so the acceptance means something."""
    p = pod("gp", containers=[container(requests={"cpu": "1"})], schedulingGates=[{"name": "hamid.io/placement"}])
    p.update({"apiVersion": "v1", "kind": "Pod"})
    del p["metadata"]["uid"]
    if AFFINITIES[which] is not None:
        p["spec"]["affinity"] = copy.deepcopy(AFFINITIES[which])
    created = api_server.create(p)
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": created["metadata"]["resourceVersion"]},
           *narrow_to_node(created, "n2"), {"op": "remove", "path": "/spec/schedulingGates"}]
    url = f"{api_server.url}/api/v1/namespaces/default/pods/gp"
    hdr = {"Content-Type": "application/json-patch+json"}
    if which in ("one term", "two terms"):
        widen = [{"op": "replace", "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
                  "/nodeSelectorTerms/0/matchExpressions", "value": [expr("zone", "Exists")]}]
        bad = httpx.patch(url, json=widen, headers=hdr)
        assert bad.status_code == 422, bad.text
    r = httpx.patch(url, json=ops, headers=hdr)
    assert r.status_code == 200, r.text
    got = r.json()
    assert "schedulingGates" not in got["spec"]
    assert [fit(got, node(n, labels=LABELS)) for n in ("n1", "n2")] == [[REASON_AFFINITY_PREFILTER], []]
    # once ungated, the affinity is final: narrowing again is refused
    again = httpx.patch(url, json=narrow_to_node(got, "n1"), headers=hdr)
    assert again.status_code == 422, again.text


def test_the_summary_reads_the_reasons_fields_not_their_words():
    """Reasons are values: a reworded sentence changes nothing in the summary; a plain string (kube-
    scheduler's own reason) is counted as it is."""
    from hamid.placement.reasons import Reason

    reworded = {"a": [Reason("mem", "not enough memory here", gpu=0, asked=4096, free=512)],
                "b": [Reason("mem", "mémoire insuffisante", gpu=1, asked=4096, free=1024)],
                "c": ["node(s) had untolerated taint {gpu: no}"]}
    assert summarize(reworded, 3) == ("0/3 nodes are available: 1 node(s) had untolerated taint {gpu: no}, "
                                      "2 GPU memory (4096 MiB requested, at most 1024 free on any GPU).")
    # the engine's sentences with their fields taken away are plain reasons, counted word for word
    plain = {"a": ["GPU 0 has 512 MiB free, 4096 requested"]}
    assert summarize(plain, 1) == "0/1 nodes are available: 1 GPU 0 has 512 MiB free, 4096 requested."


def test_no_regular_expression_reads_a_message_in_hamid():
    """The rule, kept: nothing in hamid/ parses the placement engine's sentences back."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2] / "hamid"
    for path in root.rglob("*.py"):
        text = path.read_text()
        for needle in ("MiB free, ", "shares in use", "cores free, ", "fit\\)", "_GPU_PATTERNS"):
            for line in text.splitlines():
                if "re.compile" in line and needle in line:
                    raise AssertionError(f"{path}: a regular expression reads a placement message: {line.strip()}")
