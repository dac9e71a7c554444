"""The placement engine on worked examples: what a user of HAMi expects."""

from __future__ import annotations

from simnodes import node_view

from hamid.placement import Decision, NoFit, check, place
from hamid.placement.usage import with_usage
from hamid.request import parse_docker_env, parse_pod


def docker(spec=None, devices=None, cid="c"):
    env = {}
    if spec is not None:
        env["HAMI_VGPU_SPEC"] = spec
    if devices is not None:
        env["HAMI_VISIBLE_DEVICES"] = devices
    return parse_docker_env(env, cid)


def apply(node, *decisions):
    cap = [g.with_use(0, 0, 0, False, ()) for g in node.gpus]
    return with_usage(node.name, cap, decisions, node.gpu_policy)


def test_reason_names_node_gpu_and_numbers():
    n = node_view("node-a", "T4:2")
    n = apply(n, place(docker("mem=13g", "1"), [n]))
    got = place(docker("mem=4g", "1"), [n])
    assert isinstance(got, NoFit)
    assert "node-a: GPU 1 has 2048 MiB free, 4096 requested" in got.message()


def test_spread_and_binpack_within_a_node():
    n = node_view("n", "H100:3")
    n = apply(n, place(docker("mem=40g,cores=10", "1"), [n]))
    spread = place(docker("mem=1g,cores=10"), [n])
    assert spread.containers[0].devices[0].index == 0  # least used first, lowest index on ties
    n_bin = node_view("n", "H100:3", gpuSchedulerPolicy="binpack")
    n_bin = apply(n_bin, place(docker("mem=40g,cores=10", "1"), [n_bin]))
    assert place(docker("mem=1g,cores=10"), [n_bin]).containers[0].devices[0].index == 1


def test_binpack_and_spread_across_nodes():
    a, b = node_view("a", "T4"), node_view("b", "T4")
    a = apply(a, place(docker("mem=1g,cores=10"), [a]))
    assert place(docker("mem=1g"), [a, b]).node == "a"  # binpack: fuller node
    r = docker("mem=1g")
    spread = type(r)(owner=r.owner, containers=r.containers, node_policy="spread")
    assert place(spread, [a, b]).node == "b"


def test_split_count_and_exclusive():
    n = node_view("n", "T4", deviceSplitCount=2)
    n = apply(n, place(docker("mem=1g", cid="1"), [n]), place(docker("mem=1g", cid="2"), [n]))
    assert "all 2 shares in use" in place(docker("mem=1g"), [n]).message()
    n = node_view("n", "T4:2")
    whole = place(docker(devices="0"), [n])  # a whole GPU is exclusive
    assert whole.containers[0].devices[0].cores == 100
    n = apply(n, whole)
    assert "held exclusively" in place(docker("mem=1g", "0"), [n]).message()
    n = apply(node_view("n", "T4:2"), place(docker("mem=1g", "0"), [node_view("n", "T4:2")]))
    assert "exclusive use (cores=100) needs an idle GPU" in place(docker(devices="0"), [n]).message()


def test_cores_full_refuses_zero_core_tenants():
    n = node_view("n", "T4")
    n = apply(n, place(docker("mem=1g,cores=60", cid="1"), [n]), place(docker("mem=1g,cores=40", cid="2"), [n]))
    assert "no cores left" in place(docker("mem=1g,cores=0"), [n]).message()
    assert "0% cores free, 10 requested" in place(docker("mem=1g,cores=10"), [n]).message()


def test_memory_scaling_and_percent():
    n = node_view("n", "T4", deviceMemoryScaling=2.0)
    got = place(docker("mem=50%"), [n])
    assert got.containers[0].devices[0].mem_mib == 15360  # half of 2 x 15360
    assert isinstance(place(docker("mem=25g"), [n]), Decision)


def test_type_and_uuid_filters():
    n = node_view("n", "T4,H100")
    p = parse_pod({"metadata": {"name": "p", "annotations": {"nvidia.com/use-gputype": "h100"}},
                   "spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpumem": 100}}}]}})
    assert place(p, [n]).containers[0].devices[0].index == 1
    t4 = n.gpus[0].uuid
    p2 = parse_pod({"metadata": {"name": "p", "annotations": {"nvidia.com/nouse-gpuuuid": t4,
                                                             "nvidia.com/nouse-gputype": "H100"}},
                    "spec": {"containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpumem": 100}}}]}})
    msg = place(p2, [n]).message()
    assert "is in nouse-gpuuuid" in msg and "matches nouse-gputype" in msg


def test_filtered_devices_are_refused_with_reason():
    n = node_view("n", "T4:2", filterDevices={"index": [0]})
    assert place(docker("mem=1g"), [n]).containers[0].devices[0].index == 1
    msg = place(docker("mem=1g", "0"), [n]).message()
    assert "GPU 0 is excluded by this node's filterDevices" in msg


def test_multi_gpu_multi_container_and_init_peak():
    n = node_view("n", "T4:2")
    p = parse_pod({"metadata": {"name": "p"}, "spec": {
        "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpumem": 15000}}}],
        "containers": [
            {"name": "a", "resources": {"limits": {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 7000}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 7000}}}]}})
    got = place(p, [n])
    assert isinstance(got, Decision), got
    i, a, b = got.containers
    assert len({d.uuid for d in a.devices}) == 2
    after = apply(n, got)
    # init booked at its peak (15000 on its GPU), apps as a sum (14000 on b's GPU)
    used = {g.index: g.mem_used for g in after.gpus}
    assert max(used.values()) == 15000 and sum(used.values()) in (15000 + 7000, 14000 + 15000)
    for g in after.gpus:
        assert g.mem_used <= g.mem_total


def test_numa_bind():
    n = node_view("n", "T4:4")  # simulated NUMA: GPUs 0-1 on node 0, 2-3 on node 1
    n = apply(n, place(docker("mem=14g", "0"), [n]))
    p = parse_pod({"metadata": {"name": "p", "annotations": {"nvidia.com/numa-bind": "true"}},
                   "spec": {"containers": [{"name": "a", "resources": {"limits": {
                       "nvidia.com/gpu": 2, "nvidia.com/gpumem": 2000}}}]}})
    got = place(p, [n])
    assert {d.index for d in got.containers[0].devices} == {2, 3}
    p3 = parse_pod({"metadata": {"name": "p", "annotations": {"nvidia.com/numa-bind": "true"}},
                    "spec": {"containers": [{"name": "a", "resources": {"limits": {
                        "nvidia.com/gpu": 3, "nvidia.com/gpumem": 2000}}}]}})
    assert "numa-bind" in place(p3, [n]).message()


def test_mig_smallest_profile_and_packing():
    n = node_view("n", "H100", operatingMode="mig")
    first = place(docker("mode=mig,mem=5g"), [n])
    d = first.containers[0].devices[0]
    assert (d.mig_profile, d.mig_placement.start) == ("1g.10gb", 6)  # keeps 4g/3g/2g at 0-5 creatable
    n = apply(n, first)
    d2 = place(docker("mode=mig,mem=15g"), [n]).containers[0].devices[0]
    assert d2.mig_profile == "1g.20gb" and d2.mig_placement.start == 4
    big = place(docker("4g.40gb"), [n])
    assert big.containers[0].devices[0].mig_placement.start == 0


def test_mig_profile_validated_against_gpu_table():
    n = node_view("n", "A100-SXM4-40GB", operatingMode="mig")
    msg = place(docker("1g.10gb,gpus=1"), [n])
    assert isinstance(msg, Decision)  # A100-40GB has 1g.10gb (the 2-slice 1g)
    msg = place(docker("3g.40gb"), [n]).message()
    assert "has no MIG profile 3g.40gb" in msg and "3g.20gb" in msg
    assert "not in MIG mode" in place(docker("1g.10gb"), [node_view("m", "H100")]).message()


def test_mig_full_gpu_says_why():
    n = node_view("n", "H100", operatingMode="mig")
    n = apply(n, place(docker("7g.80gb"), [n]))
    assert "no free placement for 1g.10gb" in place(docker("1g.10gb"), [n]).message()


def test_check_accepts_own_decisions_and_refuses_stale_ones():
    n = node_view("n", "T4")
    d1 = place(docker("mem=10g", cid="1"), [n])
    d2 = place(docker("mem=10g", cid="2"), [n])  # proposed on the same (stale) view
    assert check(d1, n) == []
    after = apply(n, d1)
    problems = check(d2, after)
    assert problems and "5120 MiB free, 10240 requested" in problems[0]
