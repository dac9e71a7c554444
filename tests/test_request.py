"""The one request model: Pod manifests and Docker env parse the same way."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hamid.request import Defaults, Request, RequestError, parse_docker_env, parse_pod
from hamid.request.docker import parse_vgpu_spec, parse_visible_devices


def pod(containers, annotations=None, init=None, name="p", ns="team"):
    spec = {"containers": containers}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": name, "namespace": ns, "annotations": annotations or {}}, "spec": spec}


def ctr(name="c", **limits):
    lim = {f"nvidia.com/{k.replace('_', '-')}": v for k, v in limits.items()}
    return {"name": name, "resources": {"limits": lim}}


# --- Kubernetes ---------------------------------------------------------------

def test_pod_resources_and_hami_defaults():
    r = parse_pod(pod([ctr("a", gpu=2, gpumem=3000, gpucores=30), ctr("b", gpu=1), ctr("c"), ctr("d", gpumem=1000)]))
    a, b, c, d = r.containers
    assert r.owner == "pod:team/p"
    assert (a.gpu.count, a.gpu.mem_mib, a.gpu.cores) == (2, 3000, 30)
    # gpu alone: the whole card, exclusively (HAMi's webhook sets gpucores=100)
    assert (b.gpu.count, b.gpu.mem_percent, b.gpu.cores) == (1, 100, 100)
    assert c.gpu is None
    # memory alone: defaultGPUNum GPUs, defaultCores cores
    assert (d.gpu.count, d.gpu.mem_mib, d.gpu.cores) == (1, 1000, 0)


def test_pod_defaults_come_from_node_settings():
    r = parse_pod(pod([ctr("a", gpucores=20), ctr("b", gpu=1)]), Defaults(memory_mib=2048, cores=5, gpu_num=2))
    a, b = r.containers
    assert (a.gpu.count, a.gpu.mem_mib, a.gpu.cores) == (2, 2048, 20)
    # a count and no memory named: exclusive whatever defaultMemory says, as HAMi's webhook makes it
    assert (b.gpu.mem_mib, b.gpu.cores) == (2048, 100)


def test_pod_percentage_priority_and_annotations():
    ann = {"nvidia.com/use-gputype": "A100, H100", "nvidia.com/nouse-gputype": "T4",
           "nvidia.com/use-gpuuuid": "GPU-a,GPU-b", "nvidia.com/nouse-gpuuuid": "GPU-c",
           "nvidia.com/numa-bind": "true", "hami.io/node-scheduler-policy": "spread",
           "hami.io/gpu-scheduler-policy": "binpack"}
    r = parse_pod(pod([ctr(gpu=1, gpumem_percentage=25, priority=1)], ann))
    g = r.containers[0].gpu
    assert g.mem_percent == 25 and g.mem_mib is None and g.priority == 1
    assert g.use_types == ("A100", "H100") and g.nouse_types == ("T4",)
    assert g.use_uuids == ("GPU-a", "GPU-b") and g.nouse_uuids == ("GPU-c",)
    assert g.numa_bind and r.node_policy == "spread" and r.gpu_policy == "binpack"


def test_pod_mig_mode_and_init_containers():
    r = parse_pod(pod([ctr("app", gpu=1, gpumem=10000)], {"nvidia.com/vgpu-mode": "mig"},
                      init=[ctr("init", gpu=1, gpumem=2000)]))
    assert [c.init for c in r.containers] == [True, False]
    assert r.containers[1].gpu.wants_mig


def test_requests_fall_back_when_limits_absent():
    p = pod([{"name": "a", "resources": {"requests": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4Ki"}}}])
    g = parse_pod(p).containers[0].gpu
    assert g.count == 1 and g.mem_mib == 4096


@pytest.mark.parametrize("p,needle", [
    (pod([ctr(gpu=1, gpucores=-5)]), "nvidia.com/gpucores: expected a non-negative number, got -5"),
    (pod([ctr(gpu=1, gpumem_percentage=120)]), "gpumem-percentage: bad value 120; accepted: 1 to 100"),
    (pod([ctr(gpu=1, gpumem=100, gpumem_percentage=10)]), "not both"),
    (pod([ctr(gpu=0, gpumem=100)]), "nvidia.com/gpu is 0"),
    (pod([ctr(gpu="two")]), "expected a whole number"),
    (pod([ctr(gpu=1, priority=3)]), "accepted: 0 (high) or 1 (low)"),
    (pod([ctr(gpu=1)], {"nvidia.com/vgpu-mode": "shared"}), "vgpu-mode: bad value 'shared'; accepted: hami-core, mig"),
    (pod([ctr(gpu=1)], {"hami.io/gpu-scheduler-policy": "random"}), "unknown policy 'random'"),
    ({"metadata": {}, "spec": {"containers": []}}, "metadata.name"),
    (pod([]), "at least one container"),
    (pod([{"resources": {}}]), "needs a name"),
])
def test_pod_rejections_name_the_field(p, needle):
    with pytest.raises(RequestError) as e:
        parse_pod(p)
    assert needle in str(e.value)


# --- Docker -------------------------------------------------------------------

def test_docker_not_ours():
    assert parse_docker_env(["PATH=/bin", "HOME=/root"], "x") is None
    assert parse_docker_env({"HAMI_VISIBLE_DEVICES": "", "HAMI_VGPU_SPEC": " "}, "x") is None


@pytest.mark.parametrize("env,expect", [
    ({"HAMI_VISIBLE_DEVICES": "0", "HAMI_VGPU_SPEC": "mem=4g,cores=30"},
     dict(count=1, devices=("0",), mem_mib=4096, cores=30, mode=None)),
    ({"HAMI_VISIBLE_DEVICES": "1", "HAMI_VGPU_SPEC": "mem=4096"}, dict(mem_mib=4096, cores=0)),
    ({"HAMI_VGPU_SPEC": "mem=25%"}, dict(count=1, devices=(), mem_percent=25, mem_mib=None)),
    ({"HAMI_VGPU_SPEC": "mem=512m,gpus=2"}, dict(count=2, mem_mib=512)),
    ({"HAMI_VISIBLE_DEVICES": "0", "HAMI_VGPU_SPEC": "1g.10gb"}, dict(mig_profile="1g.10gb", mode="mig", cores=0)),
    ({"HAMI_VISIBLE_DEVICES": "0-3", "HAMI_VGPU_SPEC": "3g.40gb,gpus=2"},
     dict(count=2, devices=("0", "1", "2", "3"), mig_profile="3g.40gb")),
    ({"HAMI_VGPU_SPEC": "mode=mig,mem=15g"}, dict(mode="mig", mem_mib=15360, mig_profile=None)),
    ({"HAMI_VISIBLE_DEVICES": "all"}, dict(count=None, devices=(), mem_percent=100, cores=100)),
    ({"HAMI_VISIBLE_DEVICES": "2,GPU-01234567-89ab-cdef-0123-456789abcdef"},
     dict(count=2, devices=("2", "GPU-01234567-89ab-cdef-0123-456789abcdef"), cores=100)),
    ({"HAMI_VISIBLE_DEVICES": "0", "HAMI_VGPU_SPEC": "mem=2g,priority=1"}, dict(mem_mib=2048, priority=1)),
])
def test_docker_forms(env, expect):
    r = parse_docker_env(env, "abc")
    assert r.owner == "docker:abc"
    g = r.containers[0].gpu
    for k, v in expect.items():
        assert getattr(g, k) == v, k


def test_docker_env_list_last_wins():
    r = parse_docker_env(["HAMI_VGPU_SPEC=mem=1g", "HAMI_VGPU_SPEC=mem=2g"], "x")
    assert r.containers[0].gpu.mem_mib == 2048


@pytest.mark.parametrize("env,needles", [
    ({"HAMI_VGPU_SPEC": "mem=4x"}, ["'mem=4x'", "512m, 4g"]),
    ({"HAMI_VGPU_SPEC": "memory=4g"}, ["unknown key 'memory'", "mem=", "cores="]),
    ({"HAMI_VGPU_SPEC": "cores=130"}, ["'cores=130'", "0 to 100"]),
    ({"HAMI_VGPU_SPEC": "mem=0"}, ["more than 0"]),
    ({"HAMI_VGPU_SPEC": "mem=120%"}, ["1 to 100"]),
    ({"HAMI_VGPU_SPEC": "mem=1g,mem=2g"}, ["mem is given twice"]),
    ({"HAMI_VGPU_SPEC": "1g.10gb,mem=4g"}, ["remove mem="]),
    ({"HAMI_VGPU_SPEC": "1g.10gb,mode=hami-core"}, ["needs mode=mig"]),
    ({"HAMI_VGPU_SPEC": "mode=mig,cores=30"}, ["remove cores="]),
    ({"HAMI_VGPU_SPEC": "10gb"}, ["neither key=value nor a MIG profile", "1g.10gb"]),
    ({"HAMI_VGPU_SPEC": "gpus=3", "HAMI_VISIBLE_DEVICES": "0,1"}, ["lists only 2"]),
    ({"HAMI_VISIBLE_DEVICES": "3-1"}, ["runs backwards"]),
    ({"HAMI_VISIBLE_DEVICES": "gpu0"}, ["bad entry 'gpu0'", "a range (0-3)"]),
    ({"HAMI_VISIBLE_DEVICES": "0,,1"}, ["empty entry"]),
    ({"HAMI_VISIBLE_DEVICES": "70"}, ["above 63"]),
])
def test_docker_rejections_name_the_part(env, needles):
    with pytest.raises(RequestError) as e:
        parse_docker_env(env, "x")
    for n in needles:
        assert n in str(e.value)


def test_request_round_trips_through_json():
    import json

    r = parse_pod(pod([ctr("a", gpu=2, gpumem=3000)], {"nvidia.com/use-gputype": "H100"}, init=[ctr("i", gpu=1)]))
    assert Request.from_dict(json.loads(json.dumps(r.to_dict()))) == r
    d = parse_docker_env({"HAMI_VISIBLE_DEVICES": "0-1", "HAMI_VGPU_SPEC": "1g.10gb"}, "x")
    assert Request.from_dict(json.loads(json.dumps(d.to_dict()))) == d



def test_scoring_weights_travel_under_hamis_slot_key_and_a_later_shares_key_is_read():
    """A request's JSON form is stored in the ledger and sent to peers of other versions: the shares
    weight keeps the key HAMi's annotation and every earlier reader use (``slot``), and the name the
    code uses (``shares``) is read too, so a later version can switch to it."""
    import json

    r = parse_pod(pod([ctr("a", gpu=1)], {"hami.io/device-scoring-weights": "slot=2,core=0,memory=3"}))
    assert r.weights is not None and r.weights.shares == 2.0
    wire = json.loads(json.dumps(r.to_dict()))
    assert wire["weights"] == {"slot": 2.0, "core": 0.0, "memory": 3.0}
    assert Request.from_dict(wire) == r
    later = dict(wire, weights={"shares": 2.0, "core": 0.0, "memory": 3.0})
    assert Request.from_dict(later) == r
    with pytest.raises(RequestError, match="request.weights"):
        Request.from_dict(dict(wire, weights={"slot": 1, "shares": 2, "core": 0, "memory": 3}))

# --- fuzzing: only our own error type ever escapes ------------------------------

SPEC_ALPHABET = st.sampled_from(list("memcoresgpusmodepriority=,.%0123456789gGmMkKtT+-_ ") + ["1g.10gb", "mig", "hami-core"])


@settings(max_examples=400, deadline=None)
@given(dev=st.one_of(st.text(max_size=30), st.text(alphabet="0123456789-,all GPU", max_size=20)),
       spec=st.one_of(st.text(max_size=40), st.lists(SPEC_ALPHABET, max_size=20).map("".join)))
def test_docker_parser_fuzz(dev, spec):
    try:
        r = parse_docker_env({"HAMI_VISIBLE_DEVICES": dev, "HAMI_VGPU_SPEC": spec}, "fuzz")
    except RequestError:
        return
    if r is not None:
        g = r.containers[0].gpu
        assert g.count is None or 1 <= g.count <= 64
        assert 0 <= g.cores <= 100
        assert (g.mem_mib is None) != (g.mem_percent is None) or g.mig_profile


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=30))
def test_visible_devices_and_spec_fuzz(text):
    for fn in (parse_visible_devices, parse_vgpu_spec):
        try:
            fn(text)
        except RequestError:
            pass


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 300) | st.text(max_size=8) | st.sampled_from(["1", "4Gi", "100", "mig"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["name", "resources", "limits", "requests", "nvidia.com/gpu", "nvidia.com/gpumem",
                         "nvidia.com/gpucores", "nvidia.com/gpumem-percentage", "nvidia.com/priority", "x"]),
        inner, max_size=4),
    max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(containers=st.lists(JSONISH, max_size=3), annotations=st.one_of(JSONISH, st.dictionaries(
    st.sampled_from(["nvidia.com/vgpu-mode", "nvidia.com/use-gputype", "hami.io/gpu-scheduler-policy",
                     "nvidia.com/numa-bind"]), JSONISH, max_size=3)), meta_name=JSONISH)
def test_pod_parser_fuzz(containers, annotations, meta_name):
    p = {"metadata": {"name": meta_name, "annotations": annotations}, "spec": {"containers": containers}}
    try:
        r = parse_pod(p)
    except RequestError:
        return
    for c in r.containers:
        if c.gpu:
            assert 1 <= c.gpu.count <= 64 and 0 <= c.gpu.cores <= 100


@settings(max_examples=100, deadline=None)
@given(d=JSONISH)
def test_request_from_dict_fuzz(d):
    try:
        Request.from_dict(d if isinstance(d, dict) else {"owner": d})
    except RequestError:
        pass


# --- GPU_CORE_UTILIZATION_POLICY (issue 22) ------------------------------------

def test_a_container_may_ask_for_force_never_for_disable():
    from hamid.request.model import effective_core_policy
    c = dict(ctr(gpu=1, gpucores=30), env=[{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "FORCE"}])
    assert parse_pod(pod([c])).containers[0].gpu.core_policy == "force"  # HAMi reads it case-insensitively
    assert parse_pod(pod([ctr(gpu=1, gpucores=30)])).containers[0].gpu.core_policy is None
    d = parse_docker_env({"HAMI_VGPU_SPEC": "mem=1g,cores=30,policy=force"}, "x")
    assert d.containers[0].gpu.core_policy == "force"
    assert Request.from_dict(__import__("json").loads(__import__("json").dumps(d.to_dict()))) == d
    bad = dict(ctr(gpu=1, gpucores=30), env=[{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"}])
    with pytest.raises(RequestError, match="only the node's gpuCorePolicy may say disable"):
        parse_pod(pod([bad]))
    with pytest.raises(RequestError, match="only the node's gpuCorePolicy may say disable"):
        parse_docker_env({"HAMI_VGPU_SPEC": "cores=30,policy=disable"}, "x")
    with pytest.raises(RequestError, match="accepted: default or force"):
        parse_docker_env({"HAMI_VGPU_SPEC": "cores=30,policy=sometimes"}, "x")
    ref = dict(ctr(gpu=1), env=[{"name": "GPU_CORE_UTILIZATION_POLICY", "valueFrom": {"configMapKeyRef": {}}}])
    with pytest.raises(RequestError, match="only a literal value"):
        parse_pod(pod([ref]))
    # the stricter of the node's and the container's
    assert effective_core_policy("default", "force") == "force"
    assert effective_core_policy("force", "default") == "force"
    assert effective_core_policy("disable", None) == "disable"
    assert effective_core_policy("disable", "default") == "default"
    assert effective_core_policy("default", None) == "default"


def test_gpucores_over_100_is_the_whole_gpu_as_in_hami():
    from hamid.request.kube import cores_clamped

    p = pod([ctr(gpu=1, gpucores=150)])
    assert parse_pod(p).containers[0].gpu.cores == 100
    assert cores_clamped(p) == [("containers", 0, p["spec"]["containers"][0]["name"], 150)]
    assert cores_clamped(pod([ctr(gpu=1, gpucores=100)])) == []


def test_hamis_old_count_name_is_refused_saying_what_to_write():
    from hamid.request.model import ResourceNames

    with pytest.raises(RequestError, match=r"nvidia.com/vgpu: the GPU count's name in HAMi's first releases.*"
                                           r"rename it to nvidia.com/gpu, or set resourceCountName"):
        parse_pod(pod([{"name": "c", "resources": {"limits": {"nvidia.com/vgpu": 1}}}]))
    d = Defaults(names=ResourceNames(count="nvidia.com/vgpu"))  # the operator kept the old name: it is the count
    assert parse_pod(pod([{"name": "c", "resources": {"limits": {"nvidia.com/vgpu": 2}}}]), d).containers[0].gpu.count == 2
