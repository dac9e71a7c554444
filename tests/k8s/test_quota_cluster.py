"""Namespace GPU quotas on a running cluster: two daemons as real processes, the API-server stand-in and
the kube-scheduler stand-in, in gate and extender mode. A pod that fits a GPU but would take its
namespace past its ResourceQuota waits with the reason naming the quota and the namespace; one within
the quota is placed; deleting a pod frees the quota; the leader (and only it) exports HAMi's quota
series with the values."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import yaml

from clusterenv import ClusterEnv, free_port
import hamifacts as hf

pytestmark = pytest.mark.slow

SCHEDULER_CONFIG = Path(__file__).resolve().parents[2] / "contrib" / "kubelet" / "scheduler-config.yaml"
NS = "team-a"


def pod(name: str, mem: int, cores: int = 10) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {
                "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mem), "nvidia.com/gpucores": str(cores)},
                "requests": {"cpu": "100m"}}}]}}


def scrape(port: int) -> dict:
    return hf.parse(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)


def eventually(fn, timeout: float = 20.0, what: str = ""):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            got = fn()
            if got:
                return got
        except AssertionError as e:
            last = e
        time.sleep(0.1)
    raise AssertionError(f"{what} not within {timeout} s; last: {last}")


@pytest.mark.parametrize("mode", ["gate", "extender"])
def test_a_pod_past_its_namespace_quota_waits_with_the_reason_and_places_once_quota_frees(tmp_path, api_server,
                                                                                        mode):
    from scheduler import SchedulerStandIn

    env = ClusterEnv(tmp_path / "c", api_server, nodes=2, mode=mode, extra_config="legacyMetrics: true\n")
    ports = []
    for n in env.nodes:  # the harness turns metrics off; the chart serves them on 9394
        ports.append(free_port())
        n.config.write_text(n.config.read_text().replace(
            "metricsPort: 0\n", f"metricsPort: {ports[-1]}\nmetricsAddress: 127.0.0.1\n"))
    env.start()
    config = None
    if mode == "extender":  # the file contrib/kubelet/ gives kube-scheduler, reaching the first daemon
        config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
        (ext,) = config["extenders"]
        ext["urlPrefix"] = f"https://127.0.0.1:{env.ports[0][3]}"
        ext["tlsConfig"] = {**ext["tlsConfig"], **env.extender_tls()}
    sched = SchedulerStandIn(api_server, config=config, period=0.2).start()
    try:
        leader = env.leader()
        api = env.api
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        api.create({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu-quota", "namespace": NS},
                    "spec": {"hard": {"limits.nvidia.com/gpumem": "10000", "limits.nvidia.com/gpucores": "100"}}})
        api.create(pod("first", 6000))
        sched.wait_bound(NS, "first", timeout=30)  # within the quota: placed

        api.create(pod("second", 6000))  # an H100 has room; the namespace has 4000 MiB of quota left

        def refusal() -> str | None:
            if mode == "gate":
                evs = [e for e in api.list("Event", NS)
                       if e["involvedObject"]["name"] == "second" and e["reason"] == "FailedScheduling"]
                return evs[-1]["message"] if evs else None
            return sched.last_failure(NS, "second")

        msg = eventually(refusal, what="the refusal of the pod past its quota")
        assert msg.startswith("0/2 nodes are available: 2 "), msg
        if mode == "gate":  # kube-scheduler's style, each node's reason folded
            assert ("2 GPU quota of the namespace (ResourceQuota team-a/gpu-quota limits.nvidia.com/gpumem: "
                    "10000; the pod adds 6000, at most 4000 left)") in msg, msg
            assert api.get("Pod", NS, "second")["spec"].get("schedulingGates")
        else:  # the extender's FailedNodes, as kube-scheduler counts them
            assert ("namespace team-a GPU quota: ResourceQuota gpu-quota sets limits.nvidia.com/gpumem 10000; "
                    "6000 MiB in use, the pod adds 6000 MiB (ResourceQuotaNotFit)") in msg, msg
        assert not api.get("Pod", NS, "second")["spec"].get("nodeName")

        # HAMi's quota series from the leader; a follower exports none
        def series(port):
            s = scrape(port)
            return s if s.get("hami_resource_quota_used") else None

        s = eventually(lambda: series(ports[leader]), what="the leader's quota series")
        assert not hf.problems(s, legacy=True, expect=("hami_resource_quota_used", "hami_resource_quota_limit")), \
            hf.problems(s, legacy=True, expect=("hami_resource_quota_used", "hami_resource_quota_limit"))
        assert hf.one(s, "hami_resource_quota_used", namespace=NS, quota_name="nvidia.com/gpumem",
                      limit="10000") == 6000
        assert hf.one(s, "hami_resource_quota_used", namespace=NS, quota_name="nvidia.com/gpucores",
                      limit="100") == 10
        assert hf.one(s, "hami_resource_quota_limit", namespace=NS, quota_name="nvidia.com/gpumem") == 10000
        assert hf.one(s, "QuotaUsed", quotanamespace=NS, quotaName="nvidia.com/gpumem", limit="10000") == 6000
        assert not scrape(ports[1 - leader]).get("hami_resource_quota_used")

        # the first pod is deleted: its quota frees and the second is placed
        api.delete("Pod", NS, "first", grace_period=0)
        sched.wait_bound(NS, "second", timeout=30)
        eventually(lambda: hf.one(scrape(ports[leader]), "hami_resource_quota_used", namespace=NS,
                                  quota_name="nvidia.com/gpumem", limit="10000") == 6000
                   and len(api.list("Pod", NS)) == 1, what="the quota used by the second pod alone")
    finally:
        sched.stop()
        env.stop()
