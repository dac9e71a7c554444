"""The leader's placement pass (hamid/scheduling/ranking.py, gates.PodsByNode) decides as the one-pod-at-a-time choice did.

Gated pods that arrive together are placed in one pass: one snapshot of the
cluster view, decisions in sequence against it, each booked before the next.
What a user relies on: the pass puts each pod on the node and GPUs the old
path would have (kube-scheduler's filters on every node, then ``place()`` over
the nodes that pass), including pods kube-scheduler refuses some nodes for
(taints, selectors, full CPU, too many pods), a namespace quota, and the pods
the pass itself placed moments before counting against a node's resources.
Nodes join the view in the API server's node order here, so ties fall the same
way on both paths.
"""

from __future__ import annotations

import random

import pytest

from hamid.cluster.capacity import doc_from_view, view_from_doc
from hamid.scheduling.gates import PodsByNode
from hamid.scheduling.kubefit import kube_filters, node_load
from hamid.scheduling.placer import ClusterView, choose
from hamid.scheduling.ranking import RankedView, choose_ranked
from hamid.devices.catalog import A100_80, H100_80
from hamid.devices.simulated import SimulatedBackend
from hamid.placement.view import NodeView, gpu_view_from_info
from hamid.request import parse_pod
from hamid.request.model import Defaults

GPU = {"nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores"}


def _doc(i: int, gpus: int, used: int) -> dict:
    b = SimulatedBackend([H100_80 if i % 2 else A100_80] * gpus, f"node-{i}")
    views = tuple(gpu_view_from_info(g).with_use(used * (k % 2), 0, 1 if used and k % 2 else 0, False, ())
                  for k, g in enumerate(b.gpus()))
    doc = doc_from_view(NodeView(f"node-{i}", views), 1)
    doc["peer"] = f"10.0.0.{i}:7947"
    return doc


def _node(i: int, rnd: random.Random) -> dict:
    spec: dict = {}
    if rnd.random() < 0.2:
        spec["taints"] = [{"key": "dedicated", "value": "x", "effect": "NoSchedule"}]
    labels = {"kubernetes.io/hostname": f"node-{i}", "zone": rnd.choice("ab")}
    alloc = {"cpu": str(rnd.choice([2, 4, 64])), "memory": "64Gi", "pods": str(rnd.choice([3, 6, 110]))}
    return {"metadata": {"name": f"node-{i}", "labels": labels}, "spec": spec,
            "status": {"allocatable": alloc, "capacity": alloc}}


def _pod(k: int, rnd: random.Random) -> dict:
    limits = {"nvidia.com/gpu": str(rnd.choice([1, 1, 2])), "nvidia.com/gpumem": str(rnd.choice([4000, 20000, 60000])),
              "nvidia.com/gpucores": str(rnd.choice([0, 30, 100]))}
    spec: dict = {"containers": [{"name": "main", "image": "x", "resources": {
        "limits": limits, "requests": {"cpu": rnd.choice(["100m", "1", "1500m"])}}}]}
    if rnd.random() < 0.2:
        spec["nodeSelector"] = {"zone": rnd.choice("ab")}
    if rnd.random() < 0.2:
        spec["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": f"p{k}", "namespace": "default", "uid": f"uid-{k}", "resourceVersion": "1"}}


def _bound(pod: dict, node: str) -> dict:
    out = dict(pod, metadata=dict(pod["metadata"], resourceVersion="2"), spec=dict(pod["spec"], nodeName=node))
    return out


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_a_pass_places_a_batch_as_one_pod_at_a_time_did(seed, policy):
    rnd = random.Random(seed)
    n = rnd.choice([3, 7, 20])
    docs = {f"node-{i}": _doc(i, rnd.choice([2, 4, 8]), rnd.choice([0, 10000, 40000])) for i in range(n)}
    nodes = {f"node-{i}": _node(i, rnd) for i in range(n)}
    earlier = [_bound(_pod(1000 + k, rnd), f"node-{rnd.randrange(n)}") for k in range(rnd.choice([0, 5]))]
    batch = [_pod(k, rnd) for k in range(40)]
    defaults = Defaults()

    # the old path: every node judged per pod, place() over those that pass; each pod bound before the next
    old_view = ClusterView(read=lambda: docs, to_view=view_from_doc)
    on_node: dict[str, list[dict]] = {}
    for p in earlier:
        on_node.setdefault(p["spec"]["nodeName"], []).append(p)
    want = []
    for p in batch:
        got = choose(parse_pod(p, defaults), p, old_view.members(), nodes, on_node, node_policy=policy,
                     ignored=GPU)
        want.append(got.decision)
        if got.decision is not None:
            old_view.committed(got.decision)
            on_node.setdefault(got.decision.node, []).append(_bound(p, got.decision.node))

    # the pass: one ranked walk per pod, kube-scheduler's filters only where the GPUs fit, loads kept running
    view = ClusterView(read=lambda: docs, to_view=view_from_doc)
    ranked = RankedView()
    index = PodsByNode()
    index.rebuild(earlier)
    have = []
    for p in batch:
        snap = view.snapshot()
        got = choose_ranked(parse_pod(p, defaults), p, snap, ranked, nodes, index.load, node_policy=policy,
                            ignored=GPU)
        have.append(got.decision if got is not None else None)
        if got is not None:
            view.committed(got.decision)
            index.placing(f"default/{p['metadata']['name']}", got.decision.node, _bound(p, got.decision.node))
    assert have == want
    assert any(d is not None for d in want)


def test_a_pass_reranks_only_the_nodes_that_changed():
    docs = {f"node-{i}": _doc(i, 8, 0) for i in range(50)}
    nodes = {f"node-{i}": _node(i, random.Random(i)) | {"spec": {}} for i in range(50)}
    view = ClusterView(read=lambda: docs, to_view=view_from_doc)
    ranked = RankedView()
    index = PodsByNode()
    p = _pod(1, random.Random(1))
    p["spec"].pop("nodeSelector", None)
    choose_ranked(parse_pod(p, Defaults()), p, view.snapshot(), ranked, nodes, index.load, node_policy="binpack",
                  ignored=GPU)
    first = ranked.reranked
    assert first == 50
    got = choose_ranked(parse_pod(p, Defaults()), p, view.snapshot(), ranked, nodes, index.load,
                        node_policy="binpack", ignored=GPU)
    view.committed(got.decision)
    choose_ranked(parse_pod(p, Defaults()), p, view.snapshot(), ranked, nodes, index.load, node_policy="binpack",
                  ignored=GPU)
    assert ranked.reranked == first + 1  # the one node committed on, not all 50


def test_running_node_loads_judge_as_the_pods_themselves():
    rnd = random.Random(7)
    for _ in range(200):
        node = _node(0, rnd)
        pods = [_bound(_pod(k, rnd), "node-0") for k in range(rnd.randrange(0, 8))]
        for q in pods:
            if rnd.random() < 0.2:
                q["status"] = {"phase": rnd.choice(["Succeeded", "Running"])}
        p = _pod(99, rnd)
        assert kube_filters(p, node, node_load(pods), ignored_resources=GPU) == \
            kube_filters(p, node, pods, ignored_resources=GPU)


def test_pods_by_node_counts_placements_in_flight_until_the_informer_shows_them():
    rnd = random.Random(3)
    index = PodsByNode()
    a, b = _pod(1, rnd), _pod(2, rnd)
    index.rebuild([a, b])  # gated: on no node
    assert index.get("node-0") == []
    placed = _bound(a, "node-0")
    index.placing("default/p1", "node-0", placed)
    assert index.load("node-0", b).pods == 1
    index.update("default/p1", a)  # an informer event of the pod still gated: the placement stays counted
    assert index.load("node-0", b).pods == 1
    index.update("default/p1", placed)  # the informer shows it placed
    index.unplace("default/p1")  # nothing of ours left to take back: it stays, as the informer says
    assert index.load("node-0", b).pods == 1
    assert index.load("node-0", placed).pods == 0  # a pod is never judged against itself
    index.update("default/p1", None)  # deleted
    assert index.load("node-0", b).pods == 0


def test_a_node_that_refused_the_commit_shows_what_it_said():
    """A node left out because it refused the pod's commit moments ago is listed with what happened
    there (a leader it does not see yet, or its ledger), not a fixed "refused by the node's ledger"."""
    docs = {f"node-{i}": _doc(i, 2, 0) for i in range(2)}
    nodes = {f"node-{i}": _node(i, random.Random(1)) for i in range(2)}
    for n in nodes.values():
        n["spec"] = {}
    pod = _pod(1, random.Random(3))
    pod["spec"].pop("nodeSelector", None)
    view = ClusterView(read=lambda: docs, to_view=view_from_doc)
    said = {"node-0": "the node did not take the commit from this daemon: it does not see it as the leader yet",
            "node-1": "the node's ledger refused the placement moments ago (its GPUs changed since the view): x"}
    got = choose(parse_pod(pod, Defaults()), pod, view.members(), nodes, {}, node_policy="binpack", ignored=GPU,
                 exclude=said)
    assert got.decision is None
    assert got.reasons == {n: [w] for n, w in said.items()}
