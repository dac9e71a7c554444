"""Namespace GPU quotas (hamid/scheduling/quota.py) read through real informers from the API-server
stand-in: what a namespace holds, which placement its ResourceQuota refuses and why, what a deleted
pod frees, placements in flight, and HAMi's quota series."""

from __future__ import annotations

import time

import pytest
import trio

from hamid.placement.hamiannotations import allocation
from hamid.scheduling.quota import QuotaBook, QuotaUnknown, decision_usage, Usage
from hamid.kube.client import api_client
from hamid.kube.informer import Informer
from hamid.placement import ContainerAssignment, Decision, DeviceAssignment
from hamid.request.model import ResourceNames

GPU0, GPU1 = "GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"


def decision(*containers, node="node-0") -> Decision:
    """containers: (name, init, [(uuid, MiB, cores)])."""
    return Decision(node, tuple(ContainerAssignment(n, init, tuple(DeviceAssignment(u, i, m, c)
                                                                    for i, (u, m, c) in enumerate(devs)))
                                for n, init, devs in containers))


def placed_pod(api, ns: str, name: str, d: Decision, *, init: int = 0, phase: str | None = None) -> dict:
    """A pod as the leader leaves it once placed: HAMi's allocation annotations (as the daemons write them)."""
    conts = [c for c in d.containers]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns, "annotations": allocation(d)},
           "spec": {"initContainers": [{"name": c.name, "image": "x"} for c in conts[:init]],
                    "containers": [{"name": c.name, "image": "x"} for c in conts[init:]]}}
    if not pod["spec"]["initContainers"]:
        del pod["spec"]["initContainers"]
    got = api.create(pod)
    if phase:
        got = api.set_status("Pod", ns, name, {"phase": phase})
    return got


def quota(api, ns: str, name: str, hard: dict) -> dict:
    return api.create({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": name, "namespace": ns},
                       "spec": {"hard": hard}})


def namespaces(api, *names):
    for n in names:
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}})


async def until(cond, timeout=10.0):
    deadline = trio.current_time() + timeout
    while not cond():
        if trio.current_time() > deadline:
            raise AssertionError("condition not met in time")
        await trio.sleep(0.02)


def run_book(kubeconfig, body, memory_factor=1):
    async def main():
        api = api_client(kubeconfig)

        pods = Informer(api, "/api/v1/pods", name="pods")
        book = QuotaBook(api, pods, names=ResourceNames(), memory_factor=memory_factor)
        async with trio.open_nursery() as nursery:
            await nursery.start(pods.run)
            with pytest.raises(QuotaUnknown, match="not read yet"):
                book.of("team-a")  # before the informers have listed: said, never taken as "no quota"
            await nursery.start(book.run)
            await until(lambda: book.ready)
            await body(book)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_usage_counts_init_containers_at_their_peak_per_gpu_as_hami():
    d = decision(("init-a", True, [(GPU0, 6000, 50)]), ("init-b", True, [(GPU0, 2000, 80)]),
                 ("main", False, [(GPU0, 3000, 20), (GPU1, 1000, 10)]), ("side", False, [(GPU0, 1000, 20)]))
    # GPU0: init peak 6000 MiB / 80 %, apps 4000 / 40 -> 6000, 80; GPU1: 1000, 10
    assert decision_usage(d) == Usage(7000, 90)


def test_a_placement_past_the_namespace_quota_is_refused_naming_it_and_a_deleted_pod_frees_it(api_server,
                                                                                               kubeconfig):
    namespaces(api_server, "team-a", "team-b")
    quota(api_server, "team-a", "gpu-quota", {"limits.nvidia.com/gpumem": "8000", "limits.nvidia.com/gpucores": "60",
                                              "requests.cpu": "4"})
    held = placed_pod(api_server, "team-a", "held", decision(("main", False, [(GPU0, 3000, 20), (GPU1, 3000, 20)])))
    placed_pod(api_server, "team-a", "done", decision(("main", False, [(GPU0, 9000, 30)])), phase="Succeeded")
    placed_pod(api_server, "team-b", "other", decision(("main", False, [(GPU0, 20000, 90)])))
    # a pod with a GPU init container: it counts at its peak until the init container has succeeded
    stepped = placed_pod(api_server, "team-b", "stepped", decision(("prep", True, [(GPU1, 5000, 50)]),
                                                                   ("main", False, [(GPU1, 1000, 10)])), init=1)
    big, small = decision(("main", False, [(GPU0, 4000, 10)])), decision(("main", False, [(GPU0, 2000, 10)]))
    cores = decision(("main", False, [(GPU0, 1000, 30)]))

    async def body(book: QuotaBook):
        assert book.used("team-a") == Usage(6000, 40)
        assert book.used("team-b") == Usage(25000, 140)
        q = book.of("team-a")
        why = q.check(big)
        assert why is not None and why.kind == "quota"
        assert "namespace team-a" in why and "ResourceQuota gpu-quota" in why and "limits.nvidia.com/gpumem 8000" in why
        assert "6000 MiB in use, the pod adds 4000 MiB" in why and (why.asked, why.free) == (4000, 2000)
        assert q.check(small) is None
        over = q.check(cores)  # 40 + 30 > 60
        assert over is not None and "limits.nvidia.com/gpucores 60" in over and "40% in use" in over
        # the pod's own earlier placement is not counted against it
        assert book.of("team-a", held["metadata"]["uid"]).check(big) is None
        assert book.of("team-b") is None  # no GPU quota there: nothing to check
        api_server.set_status("Pod", "team-b", "stepped", {"initContainerStatuses": [
            {"name": "prep", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
             "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]})
        await until(lambda: book.used("team-b") == Usage(21000, 100))
        # deleting the pod frees its quota
        api_server.delete("Pod", "team-a", "held", grace_period=0)
        await until(lambda: book.used("team-a") == Usage())
        assert book.of("team-a").check(big) is None
        assert stepped  # (kept for the status update above)

    run_book(kubeconfig, body)


def test_placements_in_flight_count_until_the_pod_shows_them(api_server, kubeconfig):
    namespaces(api_server, "team-a")
    quota(api_server, "team-a", "gpu-quota", {"limits.nvidia.com/gpumem": "8000"})
    five = decision(("main", False, [(GPU0, 5000, 0)]))

    async def body(book: QuotaBook):
        book.book("uid-1", "team-a", five)  # committed, the pod update not seen yet
        assert book.used("team-a") == Usage(5000, 0)
        assert book.of("team-a").check(five) is not None  # a second one in the same burst is refused
        book.unbook("uid-1")  # the commit was refused
        assert book.of("team-a").check(five) is None
        # once the pod shows its allocation, it is counted once, not twice
        pod = placed_pod(api_server, "team-a", "p", five)
        book.book(pod["metadata"]["uid"], "team-a", five)
        await until(lambda: book.pods.get("team-a/p") is not None)
        assert book.used("team-a") == Usage(5000, 0)
        # and once it is deleted, nothing is left of it: its booking ended when the pod showed it
        api_server.delete("Pod", "team-a", "p", grace_period=0)
        await until(lambda: book.pods.get("team-a/p") is None)
        assert book.used("team-a") == Usage()

    run_book(kubeconfig, body)


def test_the_strictest_of_several_quotas_holds_and_memory_factor_scales_the_limit(api_server, kubeconfig):
    namespaces(api_server, "team-a")
    quota(api_server, "team-a", "wide", {"limits.nvidia.com/gpumem": "100"})
    quota(api_server, "team-a", "narrow", {"limits.nvidia.com/gpumem": "40", "limits.nvidia.com/gpucores": "1.5"})
    placed_pod(api_server, "team-a", "p", decision(("main", False, [(GPU0, 3000, 0)])))  # gpumem: 30 x 100

    async def body(book: QuotaBook):
        q = book.of("team-a")
        assert set(q.limits) == {"nvidia.com/gpumem"}  # 1.5 is not a whole number: no limit (HAMi's AsInt64)
        why = q.check(decision(("main", False, [(GPU0, 1100, 0)])))
        assert why is not None and "ResourceQuota narrow" in why
        assert "limits.nvidia.com/gpumem 40 (x memoryFactor 100 = 4000 MiB)" in why, why
        assert q.check(decision(("main", False, [(GPU0, 1000, 0)]))) is None

    run_book(kubeconfig, body, memory_factor=100)


def test_quota_series_are_hamis(api_server, kubeconfig):
    namespaces(api_server, "team-a", "team-b", "team-c")
    quota(api_server, "team-a", "q", {"limits.nvidia.com/gpumem": "8000", "limits.nvidia.com/gpucores": "60"})
    quota(api_server, "team-c", "q", {"limits.nvidia.com/gpucores": "0"})
    placed_pod(api_server, "team-a", "a", decision(("main", False, [(GPU0, 3000, 20), (GPU1, 3000, 20)])))
    placed_pod(api_server, "team-b", "b", decision(("main", False, [(GPU0, 1000, 0)])))

    async def body(book: QuotaBook):
        assert book.series() == [
            ("team-a", "nvidia.com/gpumem", 6000, 8000, True), ("team-a", "nvidia.com/gpucores", 40, 60, True),
            # a namespace with GPU pods and no quota: its use, limit 0 and not set (no _limit series)
            ("team-b", "nvidia.com/gpumem", 1000, 0, False), ("team-b", "nvidia.com/gpucores", 0, 0, False),
            # a quota and no pods: only the resources it limits
            ("team-c", "nvidia.com/gpucores", 0, 0, True)]

    run_book(kubeconfig, body)


def test_the_standin_serves_resource_quotas_with_list_watch_and_validation(api_server, kubeconfig):
    from kubernetes import client, watch
    from kubernetes.client.exceptions import ApiException

    namespaces(api_server, "team-a")
    core = client.CoreV1Api(api_client(kubeconfig))
    body = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "team-a"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "8000"}}, "status": {"used": {"cpu": "1"}}}
    made = core.create_namespaced_resource_quota("team-a", body)
    assert made.status is None or not made.status.used  # status is cleared at create
    rv = core.list_resource_quota_for_all_namespaces().metadata.resource_version
    for bad, said in (({"limits.nvidia.com/gpumem": "-1"}, "must be greater than or equal to 0"),
                      ({"gpumem": "1"}, "must be a standard resource for quota")):
        with pytest.raises(ApiException) as e:
            core.create_namespaced_resource_quota("team-a", {**body, "metadata": {"name": "bad", "namespace": "team-a"},
                                                             "spec": {"hard": bad}})
        assert e.value.status == 422 and said in e.value.body
    core.patch_namespaced_resource_quota("q", "team-a", {"spec": {"hard": {"limits.nvidia.com/gpumem": "9000"}}})
    core.delete_namespaced_resource_quota("q", "team-a")
    seen = []
    t0 = time.time()
    for ev in watch.Watch().stream(core.list_resource_quota_for_all_namespaces, resource_version=rv,
                                   timeout_seconds=5):
        seen.append((ev["type"], ev["object"].spec.hard.get("limits.nvidia.com/gpumem")))
        if len(seen) == 2 or time.time() - t0 > 5:
            break
    assert seen == [("MODIFIED", "9000"), ("DELETED", "9000")]


def test_an_extender_that_does_not_lead_refuses_gpu_pods_rather_than_skip_the_quota():
    """Only the leader counts quotas: a daemon answering kube-scheduler itself (no leader answered) says
    so in the filter's Error, and kube-scheduler tries again; a pod asking no GPU passes as before."""
    from hamid.scheduling.extender import Extender
    from hamid.scheduling.placer import ClusterView
    from hamid.request.model import Defaults

    ext = Extender(None, None, ClusterView(read=dict, to_view=lambda d: None), defaults=Defaults(),
                   node_policy="binpack", is_leader=lambda: False, leader_url=lambda: None, quotas=lambda: None)
    gpu = {"metadata": {"name": "p", "namespace": "team-a", "uid": "u1"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1",
                                                                           "nvidia.com/gpumem": "1000"}}}]}}
    out = ext.filter({"Pod": gpu, "NodeNames": ["node-0"]})
    assert "counted by the leader and this daemon does not lead" in out["Error"]
    plain = {"metadata": {"name": "q", "namespace": "team-a"}, "spec": {"containers": [{"name": "c"}]}}
    assert ext.filter({"Pod": plain, "NodeNames": ["node-0"]})["NodeNames"] == ["node-0"]


def test_bookings_expire_even_where_no_quota_is_checked():
    """A placement whose pod never shows it (deleted at once) is forgotten after BOOKING_TTL_S, also in a
    namespace nobody checks: the leader's memory does not grow with every pod it ever placed."""
    from hamid.scheduling.quota import BOOKING_TTL_S

    now = [0.0]
    book = QuotaBook(None, Informer(None, "/api/v1/pods", name="pods"), names=ResourceNames(),
                     clock=lambda: now[0])
    d = decision(("main", False, [(GPU0, 1000, 0)]))
    for i in range(100):
        book.book(f"uid-{i}", "no-quota", d)
    now[0] = BOOKING_TTL_S + 1
    book.book("fresh", "no-quota", d)
    assert list(book._booked) == ["fresh"]


def test_an_informer_thread_ends_with_its_run(api_server, kubeconfig):
    """A leader's informers (pods, nodes, ResourceQuotas) live for one term: once their run is cancelled,
    the watch thread returns at its watch's end instead of watching (or retrying) on forever."""

    api = api_client(kubeconfig)
    inf = Informer(api, "/api/v1/resourcequotas", name="resourcequotas",
                   watch_timeout_s=1)

    async def main():
        with trio.move_on_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(inf.run)
                await inf.synced.wait()
                nursery.cancel_scope.cancel()  # the term ends; the daemon's trio run goes on
        deadline = trio.current_time() + 5
        while inf.watching and trio.current_time() < deadline:
            await trio.sleep(0.05)
        assert not inf.watching

    trio.run(main)


def test_a_node_whose_daemon_failed_a_commit_is_left_out_of_filter_for_a_while(monkeypatch):
    """kube-scheduler retries a failed bind with the same scores, so it would pick the node whose daemon
    could not be reached again and again until gossip calls it dead (the chart test's failover: 60 s of binds
    to the killed leader's node). The extender leaves such a node out of filter, saying why, for
    COMMIT_FAILED_S; then it is tried again."""
    import hamid.scheduling.extender as extender
    from hamid.scheduling.extender import Extender
    from hamid.scheduling.placer import ClusterView
    from hamid.request.model import Defaults

    ext = Extender(None, None, ClusterView(read=dict, to_view=lambda d: None), defaults=Defaults(),
                   node_policy="binpack", is_leader=lambda: True, leader_url=lambda: None, quotas=None)
    monkeypatch.setattr(ext.verdicts, "split", lambda request, snap, names: (list(names), {}))
    gpu = {"metadata": {"name": "p", "namespace": "team-a", "uid": "u1"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    nodes = ["node-0", "node-1"]
    assert ext.filter({"Pod": gpu, "NodeNames": nodes})["NodeNames"] == nodes
    ext.commit_failed("node-0", "cannot reach peer 10.0.0.2:7948: all attempts failed")
    out = ext.filter({"Pod": gpu, "NodeNames": nodes})
    assert out["NodeNames"] == ["node-1"]
    assert "could not be reached for the last placement" in out["FailedNodes"]["node-0"]
    assert "cannot reach peer 10.0.0.2:7948" in out["FailedNodes"]["node-0"]
    assert not ext._filtered_onto("u1", "node-0")  # bind checks what filter passed
    plain = {"metadata": {"name": "q", "namespace": "team-a"}, "spec": {"containers": [{"name": "c"}]}}
    assert ext.filter({"Pod": plain, "NodeNames": nodes})["NodeNames"] == nodes  # no GPU: not ours to judge
    monkeypatch.setattr(extender, "COMMIT_FAILED_S", 0.0)
    assert ext.filter({"Pod": gpu, "NodeNames": nodes})["NodeNames"] == nodes
