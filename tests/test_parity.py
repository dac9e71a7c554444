"""Placement parity with HAMi (issue 17) and the request-parsing defects of
issue 12: one parameterised case per behaviour, each run through ``hamid
plan`` on a cluster file, as a switching user would."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from hamid.cluster import plan as planmod
from hamid.devices.simulated import SimulatedBackend, gpu_uuid, parse_simulate_spec
from hamid.placement import Decision, check
from hamid.request import RequestError, parse_docker_env, parse_pod

HAMID = [sys.executable, "-m", "hamid.cli.main"]


def pod(name, limits, annotations=None):
    return {"kind": "Pod", "metadata": {"name": name, "annotations": annotations or {}},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}}


def docker(name, spec=None, devices=None, node=None):
    env = {}
    if spec is not None:
        env["HAMI_VGPU_SPEC"] = spec
    if devices is not None:
        env["HAMI_VISIBLE_DEVICES"] = devices
    d = {"kind": "Docker", "name": name, "env": env}
    if node:
        d["node"] = node
    return d


def run(tmp_path, cluster: dict, items: list[dict]) -> list[dict]:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster))
    out = planmod.plan(planmod.load_cluster(path), items)
    return json.loads(json.dumps(out))  # exactly what -o json prints


def devices(item) -> list[int]:
    assert "error" not in item, item
    return [d["index"] for c in item["containers"] for d in c["devices"]]


def one_node(gpus, config=None, **extra):
    return {"nodes": [{"name": "n", "gpus": gpus, "config": config or {}, **extra}]}


U = [gpu_uuid("n", i) for i in range(4)]

# --- item 1: GPU type names as HAMi registers them --------------------------------

TYPE_CASES = [
    ({"nvidia.com/use-gputype": "NVIDIA-Tesla T4"}, [1]),  # HAMi registers "Tesla T4" as NVIDIA-Tesla T4
    ({"nvidia.com/use-gputype": "nvidia-tesla"}, [1]),  # case-insensitive substring
    ({"nvidia.com/use-gputype": "NVIDIA", "nvidia.com/use-gpuuuid": U[1]}, [1]),  # every HAMi type has it
    ({"nvidia.com/nouse-gputype": "NVIDIA-Tesla T4", "nvidia.com/use-gpuuuid": U[1]}, None),  # excluded
    ({"nvidia.com/use-gputype": "NVIDIA-NVIDIA H100"}, [0]),  # the prefixed form HAMi <= v2.7 registered
]


@pytest.mark.parametrize("ann,want", TYPE_CASES, ids=[str(c[0]) for c in TYPE_CASES])
def test_gpu_type_names_as_hami_registers_them(tmp_path, ann, want):
    item, = run(tmp_path, one_node("H100-80GB-HBM3,T4"), [pod("p", {"nvidia.com/gpumem": 1000}, ann)])
    if want is None:
        assert item["error"] == "does not fit"
        assert any("matches nouse-gputype NVIDIA-Tesla T4" in r for r in item["reasons"]["n"])
    else:
        assert devices(item) == want


# --- item 2: request semantics -----------------------------------------------------

SEMANTICS = [
    # (limits, config, equivalent limits or expected (mem_mib, cores))
    # gpumem 0 is "not set" for the memory (the whole card), but the key is there, so HAMi's webhook does not
    # make the container exclusive: defaultCores (pkg/device/nvidia/device.go defaultExclusiveCoreIfNeeded)
    ("gpumem 0 is unset memory, not exclusive", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 0}, {}, (15360, 0)),
    ("gpumem 0 alone still asks for a GPU", {"nvidia.com/gpumem": 0}, {}, (15360, 0)),
    ("gpumem-percentage 0 with a count: not exclusive", {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 0},
     {"defaultCores": 20}, (15360, 20)),
    ("percentage 100 alone is exclusive", {"nvidia.com/gpumem-percentage": 100}, {},
     {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 100}),
    # a count, no cores, no memory named: exclusive whatever defaultMemory says (HAMi's webhook)
    ("defaultMemory with gpu 1", {"nvidia.com/gpu": 1}, {"defaultMemory": 2048, "defaultCores": 20}, (2048, 100)),
    ("memoryFactor multiplies gpumem", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4}, {"memoryFactor": 1024},
     (4096, 0)),
]


@pytest.mark.parametrize("what,limits,config,expect", SEMANTICS, ids=[c[0] for c in SEMANTICS])
def test_request_semantics_as_hami(tmp_path, what, limits, config, expect):
    got, = run(tmp_path, one_node("T4", config), [pod("p", limits)])
    d = got["containers"][0]["devices"][0]
    if isinstance(expect, tuple):
        assert (d["mem_mib"], d["cores"]) == expect
        return
    ref, = run(tmp_path, one_node("T4", config), [pod("p", expect)])
    assert got["containers"] == ref["containers"]


def test_core_scaling_above_one_makes_cores_100_a_part_not_the_whole(tmp_path):
    """HAMi: with deviceCoreScaling 2 a GPU has 200% cores; cores=100 holds
    the GPU exclusively only where a GPU has exactly 100%."""
    items = [pod(f"p{i}", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000, "nvidia.com/gpucores": 100})
             for i in range(3)]
    got = run(tmp_path, one_node("T4", {"deviceCoreScaling": 2.0}), items)
    assert devices(got[0]) == [0] and devices(got[1]) == [0]
    assert got[2]["error"] == "does not fit" and "0% cores free, 100 requested" in got[2]["reasons"]["n"][0]
    plain = run(tmp_path, one_node("T4"), items[:2])
    assert "exclusive" in " ".join(plain[1]["reasons"]["n"])


# --- item 3: scheduling features ------------------------------------------------------

def test_device_scoring_weights_change_the_gpu(tmp_path):
    # GPU 0: three small tenants (many slots, little memory); GPU 1: one big tenant.
    load = [docker(f"s{i}", "mem=100", "0") for i in range(3)] + [docker("big", "mem=10000", "1")]
    ask = {"nvidia.com/gpumem": 100}
    default, = run(tmp_path, one_node("T4:2"), load + [pod("p", ask)])[-1:]
    weighted, = run(tmp_path, one_node("T4:2"), load + [pod("p", ask, {
        "hami.io/device-scoring-weights": "slot=1,core=0,memory=0"})])[-1:]
    assert devices(default) == [0] and devices(weighted) == [1]
    bad, = run(tmp_path, one_node("T4:2"), [pod("p", ask, {"hami.io/device-scoring-weights": "slot=1,core=1"})])
    assert "memory missing" in bad["error"] and "all three keys" in bad["error"]


POLICY_CASES = [
    # (policy, load: docker specs on given GPUs, request limits, expected GPUs or a reason)
    ("binpack", [("mem=1000", "0")], {"nvidia.com/gpumem": 1000}, [0]),
    ("mutex", [("mem=1000", "0")], {"nvidia.com/gpumem": 1000}, [1]),
    ("mutex", [("mem=1000", "0"), ("mem=1000", "1")], {"nvidia.com/gpumem": 1000}, "the mutex policy takes idle"),
]


@pytest.mark.parametrize("policy,load,ask,want", POLICY_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(POLICY_CASES)])
def test_mutex_policy(tmp_path, policy, load, ask, want):
    items = [docker(f"l{i}", s, d) for i, (s, d) in enumerate(load)]
    got = run(tmp_path, one_node("T4:2"), items + [pod("p", ask, {"hami.io/gpu-scheduler-policy": policy})])[-1]
    if isinstance(want, str):
        assert any(want in r for r in got["reasons"]["n"]), got
    else:
        assert devices(got) == want


def test_policy_chain_binpack_numa_keeps_one_numa_node(tmp_path):
    # T4:4 -> GPUs 0-1 on NUMA 0, 2-3 on NUMA 1. GPUs 1 and 2 are the fullest.
    load = [docker("a", "mem=3000", "1"), docker("b", "mem=2000", "2")]
    ask = {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 1000}
    binpack = run(tmp_path, one_node("T4:4"), load + [pod("p", ask, {"hami.io/gpu-scheduler-policy": "binpack"})])
    chain = run(tmp_path, one_node("T4:4"), load + [pod("p", ask, {"hami.io/gpu-scheduler-policy": "binpack,numa"})])
    assert sorted(devices(binpack[-1])) == [1, 2]  # across NUMA nodes
    assert sorted(devices(chain[-1])) == [0, 1]  # the fullest GPU's NUMA node
    assert chain[-1]["nodes"]["n"]["gpu_policy"] == "binpack,numa"


TOPOLOGY = [
    # node T4:2 (PCIe, NUMA 0) + H100:2 (NV18, NUMA 1); GPU 3 carries a 20000 MiB tenant
    ("spread", 2, [0, 2]),
    ("topology-aware", 2, [2, 3]),  # the NVLinked pair, 1800 against 10-20
    ("spread", 1, [2]),
    ("topology-aware", 1, [0]),  # one GPU: the least linked (a T4), keeping the NVLinked pair free
]


@pytest.mark.parametrize("policy,count,want", TOPOLOGY, ids=[f"{p}-{n}" for p, n, _ in TOPOLOGY])
def test_topology_aware_policy_uses_link_scores(tmp_path, policy, count, want):
    items = [docker("load", "mem=20000", "3"),
             pod("p", {"nvidia.com/gpu": count, "nvidia.com/gpumem": 1000}, {"hami.io/gpu-scheduler-policy": policy})]
    got = run(tmp_path, one_node("T4:2,H100-80GB-HBM3:2"), items)[-1]
    assert sorted(devices(got)) == want
    links = got["nodes"]["n"]["gpus"][2]["links"]
    assert links[U[3]] == 1800 and links[U[0]] == 10


def test_simulated_backend_reports_health_and_links():
    b = SimulatedBackend(parse_simulate_spec("A100-SXM4-80GB:2,T4"), "n", unhealthy=[1])
    g0, g1, g2 = b.gpus()
    assert (g0.healthy, g1.healthy, g2.healthy) == (True, False, True)
    assert dict(g0.links) == {g1.uuid: 1200, g2.uuid: 10}
    b.set_healthy(1, True)
    assert b.gpus()[1].healthy


HEALTH_CORDON = [
    ("unhealthy", {"unhealthy": [0]}, "GPU 0 is unhealthy"),
    ("cordon", {"annotations": {"hami.io/device-cordon": U[0]}}, "GPU 0 is cordoned"),
]


@pytest.mark.parametrize("what,extra,reason", HEALTH_CORDON, ids=[c[0] for c in HEALTH_CORDON])
def test_unhealthy_and_cordoned_gpus_take_no_new_tenant(tmp_path, what, extra, reason):
    items = [pod(f"p{i}", {"nvidia.com/gpumem": 1000}, {"hami.io/gpu-scheduler-policy": "binpack"}) for i in range(2)]
    items.append(docker("pinned", "mem=1000", "0"))
    got = run(tmp_path, one_node("T4:2", **extra), items)
    assert devices(got[0]) == [1] and devices(got[1]) == [1]
    assert got[2]["error"] == "does not fit" and reason in " ".join(got[2]["reasons"]["n"])
    gpu0 = got[2]["nodes"]["n"]["gpus"][0]
    assert gpu0["healthy"] is (what != "unhealthy") and gpu0["cordoned"] is (what == "cordon")


def test_cordon_keeps_existing_tenants_and_refuses_new_ones_on_recheck(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(one_node("T4:2")))
    node, = planmod.load_cluster(path)
    first = parse_docker_env({"HAMI_VISIBLE_DEVICES": "0", "HAMI_VGPU_SPEC": "mem=1000"}, "a")
    second = parse_docker_env({"HAMI_VISIBLE_DEVICES": "0", "HAMI_VGPU_SPEC": "mem=1000"}, "b")
    from hamid.placement import place

    d1 = place(first, [node.view()])
    d2 = place(second, [node.view()])
    node.decisions.append(d1)
    path.write_text(yaml.safe_dump(one_node("T4:2", annotations={"hami.io/device-cordon": U[0]})))
    cordoned, = planmod.load_cluster(path)
    cordoned.decisions.append(d1)
    view = cordoned.view()
    assert view.gpus[0].mem_used == 1000 and view.gpus[0].shares_used == 1  # the tenant stays
    assert any("cordoned" in p for p in check(d2, view))
    assert isinstance(d2, Decision) and check(d2, node.view()) == []


def test_mig_profile_allowlist(tmp_path):
    mig = {"operatingMode": "mig", "migProfileAllowlist": [{"models": ["H100"], "profiles": ["3g.40gb"]}]}
    got, = run(tmp_path, one_node("H100-80GB-HBM3", mig), [docker("m", "mode=mig,mem=5g")])
    assert got["containers"][0]["devices"][0]["mig_profile"] == "3g.40gb"
    assert set(got["nodes"]["n"]["gpus"][0]["mig_profiles"]) == {"3g.40gb"}
    free, = run(tmp_path, one_node("H100-80GB-HBM3", {"operatingMode": "mig"}), [docker("m", "mode=mig,mem=5g")])
    assert free["containers"][0]["devices"][0]["mig_profile"] == "1g.10gb"


# --- item 5: resource names of your own -------------------------------------------------

def test_resource_names_from_the_config(tmp_path):
    cluster = one_node("T4")
    cluster["config"] = {"resourceCountName": "example.com/vgpu", "resourceMemoryName": "example.com/vgpumem"}
    got = run(tmp_path, cluster, [pod("mine", {"example.com/vgpu": 1, "example.com/vgpumem": 3000}),
                                  pod("nvidias", {"nvidia.com/gpu": 1})])
    assert got[0]["containers"][0]["devices"][0]["mem_mib"] == 3000
    assert "no GPU" in got[1]["reasons"]["*"][0]  # nvidia.com/gpu belongs to NVIDIA's own plugin now
    cluster["config"]["resourceCoreName"] = "example.com/vgpu"
    with pytest.raises(Exception, match="resource names must differ"):
        run(tmp_path, cluster, [])


# --- item 4: explainable decisions ----------------------------------------------------------

def test_plan_json_prints_capacity_and_score_and_table_scores(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(yaml.safe_dump(one_node("T4:2")))
    work = tmp_path / "w.yaml"
    work.write_text(yaml.safe_dump_all([docker("a", "mem=4g,cores=30", "0"), docker("b", "mem=1g")]))
    r = subprocess.run([*HAMID, "plan", "--cluster", str(cluster), "--workload", str(work), "-o", "json"],
                       capture_output=True, text=True, timeout=60)
    a, b = json.loads(r.stdout)
    g0 = b["nodes"]["n"]["gpus"][0]
    assert {k: g0[k] for k in ("memory_mib", "memory_used_mib", "cores", "cores_used", "split_count",
                               "shares_used", "model", "type", "healthy")} == {
        "memory_mib": 15360, "memory_used_mib": 4096, "cores": 100, "cores_used": 30, "split_count": 10,
        "shares_used": 1, "model": "Tesla T4", "type": "NVIDIA-Tesla T4", "healthy": True}
    assert a["nodes"]["n"]["gpus"][1]["unfit"].startswith("GPU 1 is not among the requested devices")
    assert b["nodes"]["n"]["gpus"][1]["score"] < g0["score"]  # spread picked GPU 1, the lower score
    r = subprocess.run([*HAMID, "plan", "--cluster", str(cluster), "--workload", str(work), "--scores"],
                       capture_output=True, text=True, timeout=60)
    assert "scores on n: node score 0.00; GPU scores under gpuSchedulerPolicy spread: GPU 0 " in r.stdout and "GPU 1 -" in r.stdout


# --- issue 12: request-parsing defects ------------------------------------------------------

SPEC_REFUSED = [
    ("mem=\u0664g", "ASCII digits"),  # Arabic-Indic 4
    ("cores=\uff13\uff10", "ASCII digits"),  # full-width 30
    ("mem=4gb", "bad size '4gb'"),
    ("MEM=4G", "keys are lower case"),
    ("mem=4G", "lower-case unit"),
    ("gpus=\u0662", "ASCII digits"),
]


@pytest.mark.parametrize("spec,needle", SPEC_REFUSED, ids=[c[0].encode("ascii", "backslashreplace").decode()
                                                            for c in SPEC_REFUSED])
def test_vgpu_spec_accepts_only_documented_forms(spec, needle):
    with pytest.raises(RequestError) as e:
        parse_docker_env({"HAMI_VGPU_SPEC": spec}, "c")
    assert needle in str(e.value) and "accepted" in str(e.value) or "ASCII digits" in str(e.value)


@pytest.mark.parametrize("env", [
    {"HAMI_VGPU_SPEC": "mem=" + "9" * 10240},
    {"HAMI_VGPU_SPEC": "x" * 10240},
    {"HAMI_VGPU_SPEC": "mem=1g," + "y" * 10240},
    {"HAMI_VISIBLE_DEVICES": "0," + "z" * 10240},
])
def test_errors_echo_at_most_64_characters(env):
    with pytest.raises(RequestError) as e:
        parse_docker_env(env, "c")
    msg = str(e.value)
    assert len(msg) < 600 and "\u2026" in msg


def test_unknown_uuid_in_visible_devices_is_said_once(tmp_path):
    ghost = "GPU-00000000-0000-0000-0000-000000000000"
    got, = run(tmp_path, one_node("T4:4"), [docker("d", "mem=1g", ghost)])
    reasons = got["reasons"]["n"]
    assert reasons == [f"no GPU with UUID {ghost}", "needs 1 GPU(s), 0 fit"]


def test_live_plan_does_not_speak_of_a_cluster_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(one_node("T4")))
    got, = planmod.plan(planmod.load_cluster(path), [docker("d", "mem=1g", node="elsewhere")], source="the live view")
    assert "not in the live view" in got["error"] and "cluster file" not in got["error"]


def test_pod_parsing_rejects_bad_policies_and_cordon_values():
    with pytest.raises(RequestError, match="more than one ranking policy"):
        parse_pod(pod("p", {"nvidia.com/gpu": 1}, {"hami.io/gpu-scheduler-policy": "binpack,spread"}))
    from hamid.request.kube import parse_device_cordon

    with pytest.raises(RequestError, match="is not a GPU UUID"):
        parse_device_cordon("GPU-a,3")
