"""The placement engine and a node's DRA GPUs (``draDevices``, docs/dra.md).

A GPU that serves Dynamic Resource Allocation is the DRA face's: the engine never chooses it for a
device-plugin pod, nor for a Docker container that does not name it, wherever the engine runs (the
node's own admission, the leader's gate pass and extender filter on the gossiped view, ``hamid plan``),
and the ledger's re-check refuses a proposed placement of a pod there. The refusal is a value (kind
``dra``) that the scheduler's summary and the refusal headline read. The capacity document carries the
flag; a document from an older node without it means no DRA GPUs.
"""

from __future__ import annotations

from simnodes import node_view

from hamid.cluster.capacity import doc_from_view, doc_problem, view_from_doc
from hamid.placement import Decision, NoFit, check, place
from hamid.placement.engine import feasible
from hamid.placement.reasons import NOT_CONFIGURED, refusal_headline
from hamid.placement.usage import with_usage
from hamid.placement.view import gpu_view_from_dict, gpu_view_to_dict
from hamid.request import parse_docker_env, parse_pod
from hamid.scheduling.fitsummary import summarize


def pod(name: str, mem: int, gpus: int = 1):
    return parse_pod({"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": {"containers": [
        {"name": "main", "resources": {"limits": {"nvidia.com/gpu": str(gpus), "nvidia.com/gpumem": str(mem)}}}]}})


def docker(spec: str, devices: str | None = None, cid: str = "c"):
    env = {"HAMI_VGPU_SPEC": spec}
    if devices is not None:
        env["HAMI_VISIBLE_DEVICES"] = devices
    return parse_docker_env(env, cid)


def apply(node, *decisions):
    cap = [g.with_use(0, 0, 0, False, ()) for g in node.gpus]
    return with_usage(node.name, cap, decisions, node.gpu_policy)


def gpus_of(decision: Decision) -> set[int]:
    return {d.index for c in decision.containers for d in c.devices}


def test_the_node_view_marks_the_gpus_draDevices_names():
    n = node_view("n", "H100:3", draDevices="0,2")
    assert [g.dra for g in n.gpus] == [True, False, True]
    assert not any(g.dra for g in node_view("n", "H100:2").gpus)
    assert all(g.dra for g in node_view("n", "H100:2", draDevices="all").gpus)


def test_a_device_plugin_pod_is_never_placed_on_a_dra_gpu():
    n = node_view("n", "H100:2", draDevices="0")
    # spread, both idle: without DRA GPU 0 wins the tie (lowest index); it serves DRA, so GPU 1
    for i in range(3):
        got = place(pod(f"p{i}", 1000), [n])
        assert isinstance(got, Decision) and gpus_of(got) == {1}, got
        n = apply(n, got)
    two = place(pod("two", 1000, gpus=2), [n])
    assert isinstance(two, NoFit)
    (why,) = [r for r in two.reasons["n"] if getattr(r, "kind", None) == "dra"]
    assert why.gpu == 0 and "GPU 0 serves DRA" in why and "draDevices" in why
    assert feasible(pod("two", 1000, gpus=2), n) != []  # the extender's filter says the same
    assert any(getattr(r, "kind", None) == "dra" for r in feasible(pod("two", 1000, gpus=2), n))


def test_a_node_whose_gpus_all_serve_dra_refuses_pods_as_not_configured():
    n = node_view("n", "H100:2", draDevices="all")
    got = place(pod("p", 1000), [n])
    assert isinstance(got, NoFit)
    reasons = got.reasons["n"]
    assert {getattr(r, "kind", None) for r in reasons} >= {"dra"}
    assert refusal_headline(reasons) == NOT_CONFIGURED
    msg = summarize({"n": list(reasons)}, 1)
    assert "GPU serves DRA (draDevices)" in msg, msg


def test_a_docker_container_gets_a_dra_gpu_only_when_it_names_it():
    n = node_view("n", "H100:2", draDevices="0")
    got = place(docker("mem=1g"), [n])
    assert isinstance(got, Decision) and gpus_of(got) == {1}
    named = place(docker("mem=1g", devices="0"), [n])  # HAMI_VISIBLE_DEVICES=0: it asked for that GPU
    assert isinstance(named, Decision) and gpus_of(named) == {0}
    only_dra = node_view("n", "H100:1", draDevices="all")
    refused = place(docker("mem=1g"), [only_dra])
    assert isinstance(refused, NoFit) and "serves DRA" in refused.message()
    assert isinstance(place(docker("mem=1g", devices="0"), [only_dra]), Decision)


def test_the_ledger_recheck_refuses_a_pod_on_a_dra_gpu_and_a_claim_off_one():
    plain = node_view("n", "H100:2")
    on_gpu0 = place(docker("mem=1g", devices="0"), [plain])
    on_gpu1 = place(docker("mem=1g", devices="1"), [plain])
    assert isinstance(on_gpu0, Decision) and isinstance(on_gpu1, Decision)
    n = node_view("n", "H100:2", draDevices="0")
    problems = check(on_gpu0, n)  # a leader's proposal for a pod, with no request naming the GPU
    assert problems and "GPU 0 serves DRA" in problems[0]
    assert check(on_gpu0, n, request=docker("mem=1g", devices="0")) == []  # a container that named it
    assert check(on_gpu0, n, request=docker("mem=1g")) != []
    assert check(on_gpu1, n) == []
    assert check(on_gpu0, n, claim=True) == []
    claim_off = check(on_gpu1, n, claim=True)
    assert claim_off and "GPU 1 does not serve DRA" in claim_off[0]


def test_the_capacity_document_carries_the_flag_and_an_old_one_means_none():
    n = node_view("n", "H100:2", draDevices="1")
    doc = doc_from_view(n, 1)
    assert doc_problem(doc) is None
    assert [g.dra for g in view_from_doc(doc).gpus] == [False, True]
    assert "dra" not in doc["gpus"][0]  # only where set: a document without DRA GPUs reads as before
    old = {**doc, "gpus": [{k: v for k, v in g.items() if k != "dra"} for g in doc["gpus"]]}
    assert doc_problem(old) is None and not any(g.dra for g in view_from_doc(old).gpus)
    g1 = n.gpus[1]
    assert gpu_view_from_dict(gpu_view_to_dict(g1)).dra is True
    bad = {**doc, "gpus": [{**doc["gpus"][0], "dra": "yes"}, doc["gpus"][1]]}
    assert doc_problem(bad) is not None  # a peer's document is read strictly
    # the leader places on the gossiped view as the node would
    got = place(pod("p", 1000), [view_from_doc(doc)])
    assert isinstance(got, Decision) and gpus_of(got) == {0}
