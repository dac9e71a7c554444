"""Property: every decision ``hamid plan -o json`` prints respects the
capacities it prints beside it.

Random cluster files (models, split counts, memory and core scaling, MIG
mode, unhealthy and cordoned GPUs, filterDevices) and random workloads (pods
with memory, percent, cores, counts, type and UUID filters, policies; Docker
items pinned to GPUs) go through the plan command's own functions and a JSON
round trip. The checker below reads only that JSON and the workload as
written: it never calls the engine, the request parser or the catalog.
"""

from __future__ import annotations

import json

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hamid.cluster import plan as planmod
from hamid.devices.simulated import gpu_uuid

MODELS = ["T4", "H100-80GB-HBM3", "A100-SXM4-40GB", "A30", "H200-141GB"]
TYPES = ["NVIDIA-Tesla T4", "nvidia", "H100", "a100", "NVIDIA-NVIDIA A30", "h200"]


@st.composite
def clusters(draw):
    nodes = []
    for i in range(draw(st.integers(1, 3))):
        models = draw(st.lists(st.sampled_from(MODELS), min_size=1, max_size=4))
        name = f"n{i}"
        n = len(models)
        idx = st.integers(0, n - 1)
        cordon = draw(st.lists(idx, max_size=1, unique=True))
        nodes.append({
            "name": name, "gpus": ",".join(models),
            "unhealthy": draw(st.lists(idx, max_size=1, unique=True)),
            "annotations": {"hami.io/device-cordon": ",".join(gpu_uuid(name, c) for c in cordon)},
            "config": {
                "deviceSplitCount": draw(st.integers(1, 4)),
                "deviceMemoryScaling": draw(st.sampled_from([0.5, 1.0, 2.0])),
                "deviceCoreScaling": draw(st.sampled_from([1.0, 2.0])),
                "operatingMode": draw(st.sampled_from(["hami-core", "hami-core", "mig"])),
                "memoryFactor": draw(st.sampled_from([1, 1024])),
                "filterDevices": {"index": draw(st.lists(idx, max_size=1))},
            }})
    return {"nodes": nodes}


@st.composite
def limits(draw, factor_ok):
    lim = {}
    if draw(st.booleans()):
        lim["nvidia.com/gpu"] = draw(st.integers(1, 3))
    mem = draw(st.sampled_from(["none", "mib", "pct"]))
    if mem == "mib":
        lim["nvidia.com/gpumem"] = draw(st.sampled_from([0, 1, 4, 500, 3000, 20000]))
    elif mem == "pct":
        lim["nvidia.com/gpumem-percentage"] = draw(st.sampled_from([10, 50, 100]))
    if draw(st.booleans()):
        lim["nvidia.com/gpucores"] = draw(st.sampled_from([0, 20, 50, 100]))
    if not lim:
        lim["nvidia.com/gpu"] = 1
    return lim


@st.composite
def workloads(draw, cluster):
    uuids = [gpu_uuid(n["name"], i) for n in cluster["nodes"] for i in range(len(n["gpus"].split(",")))]
    out = []
    for i in range(draw(st.integers(1, 10))):
        if draw(st.integers(0, 3)) == 0:
            n = draw(st.sampled_from(cluster["nodes"]))
            count = len(n["gpus"].split(","))
            spec = draw(st.sampled_from(["mem=1g", "mem=4g,cores=30", "mem=50%", "cores=100", "mode=mig,mem=5g",
                                         "1g.10gb", "mem=2g,gpus=2"]))
            devs = ",".join(str(d) for d in draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=2,
                                                          unique=True)))
            out.append({"kind": "Docker", "name": f"d{i}", "node": n["name"],
                        "env": {"HAMI_VGPU_SPEC": spec, "HAMI_VISIBLE_DEVICES": devs}})
            continue
        ann = {}
        if draw(st.booleans()):
            ann["nvidia.com/use-gputype"] = draw(st.sampled_from(TYPES))
        if draw(st.booleans()):
            ann["nvidia.com/nouse-gputype"] = draw(st.sampled_from(TYPES))
        if uuids and draw(st.integers(0, 3)) == 0:
            ann[draw(st.sampled_from(["nvidia.com/use-gpuuuid", "nvidia.com/nouse-gpuuuid"]))] = \
                draw(st.sampled_from(uuids))
        ann["hami.io/gpu-scheduler-policy"] = draw(st.sampled_from(
            ["spread", "binpack", "mutex", "topology-aware", "binpack,numa", "numa"]))
        if draw(st.booleans()):
            ann["hami.io/device-scoring-weights"] = draw(st.sampled_from(["slot=1,core=0,memory=3",
                                                                          "slot=0,core=2,memory=0.5"]))
        conts = [{"name": f"c{j}", "resources": {"limits": draw(limits(True))}}
                 for j in range(draw(st.integers(1, 2)))]
        spec = {"containers": conts}
        if draw(st.integers(0, 3)) == 0:
            spec["initContainers"] = [{"name": "init", "resources": {"limits": draw(limits(True))}}]
        out.append({"kind": "Pod", "metadata": {"name": f"p{i}", "annotations": ann}, "spec": spec})
    return out


@st.composite
def scenario(draw):
    c = draw(clusters())
    return c, draw(workloads(c))


def _type_ok(want: str, g: dict) -> bool:
    w = want.upper()
    return w in g["type"].upper() or w in ("NVIDIA-" + g["model"]).upper()


def _requested_mem(lim: dict, g: dict, factor: int) -> int | None:
    """MiB a pod container asks of GPU ``g`` (None: a whole card, as percent 100)."""
    mem = lim.get("nvidia.com/gpumem") or 0
    pct = lim.get("nvidia.com/gpumem-percentage") or 0
    if mem:
        return mem * factor
    return g["memory_mib"] * (pct or 100) // 100


def check_item(doc: dict, item: dict, cluster: dict) -> None:
    node = item["nodes"][item["node"]]
    gpus = {g["uuid"]: g for g in node["gpus"]}
    cfg = next(n for n in cluster["nodes"] if n["name"] == item["node"])["config"]
    ann = doc.get("metadata", {}).get("annotations", {}) if doc["kind"] == "Pod" else {}
    conts = []
    if doc["kind"] == "Pod":
        conts = [(c, True) for c in doc["spec"].get("initContainers", [])] + \
                [(c, False) for c in doc["spec"]["containers"]]
    booked: dict[str, list[int]] = {}  # uuid -> [init mem, init cores, init n, app mem, app cores, app n]
    mig_new: dict[str, list[tuple[int, int, str]]] = {}
    for ci, c in enumerate(item["containers"]):
        uu = [d["uuid"] for d in c["devices"]]
        assert len(set(uu)) == len(uu), "one container never gets a GPU twice"
        lim = conts[ci][0]["resources"]["limits"] if conts else {}
        if conts and c["devices"]:
            assert len(uu) == lim.get("nvidia.com/gpu", 1)
        for d in c["devices"]:
            g = gpus[d["uuid"]]
            assert g["healthy"] and not g["cordoned"] and not g["filtered"], g
            assert not g["exclusive"], "a GPU held exclusively takes no one else"
            if "nvidia.com/use-gputype" in ann:
                assert _type_ok(ann["nvidia.com/use-gputype"], g)
            if "nvidia.com/nouse-gputype" in ann:
                assert not _type_ok(ann["nvidia.com/nouse-gputype"], g)
            if "nvidia.com/use-gpuuuid" in ann:
                assert g["uuid"] == ann["nvidia.com/use-gpuuuid"]
            if "nvidia.com/nouse-gpuuuid" in ann:
                assert g["uuid"] != ann["nvidia.com/nouse-gpuuuid"]
            if "mutex" in ann.get("hami.io/gpu-scheduler-policy", ""):
                assert g["shares_used"] == 0 and not g.get("mig_used")
            if d.get("mig_profile"):
                prof = g["mig_profiles"][d["mig_profile"]]
                pl = d["mig_placement"]
                assert [pl["start"], pl["size"]] in prof["placements"]
                live = [(m["start"], m["start"] + m["size"], m["profile"]) for m in g["mig_used"]]
                live += mig_new.get(d["uuid"], [])
                assert all(pl["start"] + pl["size"] <= a or b <= pl["start"] for a, b, _ in live), "MIG overlap"
                live.append((pl["start"], pl["start"] + pl["size"], d["mig_profile"]))
                mig_new.setdefault(d["uuid"], []).append(live[-1])
                assert sum(1 for *_, p in live if p == d["mig_profile"]) <= prof["max"]
                assert sum(g["mig_profiles"][p]["slices"] for *_, p in live) <= g["compute_slices"]
                if conts and not d["mig_profile"].endswith("+me"):
                    assert prof["memory_mib"] >= (_requested_mem(lim, g, cfg["memoryFactor"]) or 0) or \
                        "nvidia.com/gpumem" not in lim
                continue
            assert g["mode"] == "hami-core"
            if conts:
                want = _requested_mem(lim, g, cfg["memoryFactor"])
                assert d["mem_mib"] == want, (d, lim, g)
                if "nvidia.com/gpucores" in lim:
                    assert d["cores"] == lim["nvidia.com/gpucores"]
            b = booked.setdefault(d["uuid"], [0, 0, 0, 0, 0, 0])
            if c["init"]:
                b[0], b[1], b[2] = max(b[0], d["mem_mib"]), max(b[1], d["cores"]), 1
            else:
                b[3] += d["mem_mib"]
                b[4] += d["cores"]
                b[5] += 1
    # a container that asked the whole GPU is alone there among the containers it runs beside: an init
    # container runs before the app containers (the bookings above take the larger of the two phases), so
    # app containers may share the GPU an init container had to itself
    exclusive = {(d["uuid"], bool(c["init"])) for c in item["containers"] for d in c["devices"]
                 if not d.get("mig_profile") and d["cores"] >= 100}
    for uuid, b in booked.items():
        g = gpus[uuid]
        mem, cores, n = max(b[0], b[3]), max(b[1], b[4]), max(b[2], b[5])
        assert g["memory_used_mib"] + mem <= g["memory_mib"], (g, b)
        assert g["cores_used"] + cores <= g["cores"], (g, b)
        assert g["shares_used"] + n <= g["split_count"], (g, b)
        if cores >= 100 and g["cores"] == 100:
            assert g["shares_used"] == 0, "exclusive use needs an idle GPU"
        for init in (True, False):
            if (uuid, init) in exclusive and g["cores"] == 100:  # asked the whole GPU: alone there in its phase
                assert g["shares_used"] == 0 and (b[2] if init else b[5]) == 1, \
                    "exclusive use needs an idle GPU and is alone on it"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(scenario())
def test_every_printed_decision_respects_the_printed_capacities(tmp_path_factory, sc):
    cluster, work = sc
    path = tmp_path_factory.mktemp("plan") / "cluster.yaml"
    path.write_text(yaml.safe_dump(cluster))
    out = json.loads(json.dumps(planmod.plan(planmod.load_cluster(path), work)))
    assert len(out) == len(work)
    for doc, item in zip(work, out):
        if "error" in item:
            assert item["error"] != "does not fit" or all(item["reasons"].values())
            continue
        check_item(doc, item, cluster)
