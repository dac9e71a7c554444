"""Every HAMi metric (tests/hamifacts.py: names, labels, legacy names, units) against two running daemons.

Daemon A shares an H100 and a T4 through the shim, with legacy metrics on, and
holds a pod (its second container asks 4000 MiB and 30 % of a GPU) and a
Docker container; daemon B has an H100 in MIG mode holding a Docker
container's 1g.10gb instance. The per-container region series need a CUDA
process in a container: tests/k8s/test_dashboard.py checks them against the
same facts with the shim running.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import hamifacts as hf  # noqa: E402
from test_daemon import start, stop  # noqa: E402

from hamid.localapi.client import LocalClient  # noqa: E402
from hamid.request import parse_docker_env  # noqa: E402
from hamid.request.kube import parse_pod  # noqa: E402

MIB = 1 << 20
SCHEDULER = ("hami_gpu_memory_limit_bytes", "hami_gpu_core_limit_ratio", "hami_gpu_memory_allocated_bytes",
             "hami_gpu_shared_count", "hami_gpu_core_allocated_ratio", "hami_node_gpu_overview",
             "hami_node_gpu_memory_allocated_ratio", "hami_vgpu_memory_allocated_bytes",
             "hami_vgpu_core_allocated_ratio", "hami_host_gpu_memory_used_bytes", "hami_host_gpu_utilization_ratio",
             "hami_host_gpu_memory_controller_utilization_ratio")

POD = {"metadata": {"name": "train", "namespace": "ml", "uid": "uid-train"},
       "spec": {"initContainers": [{"name": "fetch"}],
                "containers": [{"name": "sidecar"},
                               {"name": "main", "resources": {"limits": {
                                   "nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000, "nvidia.com/gpucores": 30}}}]}}


def test_every_hami_series_as_hami_writes_it(tmp_path, free_port):
    from netports import free_port as pick

    port_b = pick()
    a_state, b_state = tmp_path / "a", tmp_path / "b"
    (tmp_path / "b.yaml").write_text("operatingMode: mig\n")
    a = start(a_state, free_port, "--simulate", "H100-80GB-HBM3:1,T4:1", "--legacy-metrics", node="node-a")
    b = start(b_state, port_b, "--simulate", "H100-80GB-HBM3:1", "--config", str(tmp_path / "b.yaml"),
              node="node-b")
    try:
        with LocalClient(a_state) as c:
            c.reserve(parse_pod(POD).to_dict(), "pod", owner={"kind": "pod", "uid": "uid-train", "name": "ml/train"})
            d = parse_docker_env({"HAMI_VISIBLE_DEVICES": "1", "HAMI_VGPU_SPEC": "mem=2g,cores=50"}, "abc")
            c.reserve(d.to_dict(), "docker", owner={"kind": "docker", "uid": "abc", "name": "web"})
        with LocalClient(b_state) as c:
            c.call("POST", "/v1/containers", {"id": "d0c0" * 16, "name": "mig-job",
                                              "env": ["HAMI_VISIBLE_DEVICES=0", "HAMI_VGPU_SPEC=1g.10gb"]})
        sa = hf.parse(httpx.get(f"http://127.0.0.1:{free_port}/metrics").text)
        sb = hf.parse(httpx.get(f"http://127.0.0.1:{port_b}/metrics").text)
    finally:
        stop(a)
        stop(b)

    assert not hf.problems(sa, legacy=True, expect=SCHEDULER), hf.problems(sa, legacy=True, expect=SCHEDULER)
    mig = ("hami_node_gpu_mig_instance_info", "hami_mig_device_info")
    assert not hf.problems(sb, legacy=False, expect=SCHEDULER + mig), hf.problems(sb, legacy=False, expect=mig)

    # values for the state, in HAMi's units
    pod = dict(namespace="ml", node="node-a", pod="train")  # per pod (HAMi #2898), not per container
    assert hf.one(sa, "hami_vgpu_memory_allocated_bytes", **pod) == 4000 * MIB
    assert hf.one(sa, "hami_vgpu_core_allocated_ratio", **pod) == 30  # percent, as HAMi's
    assert hf.one(sa, "vGPUCoreAllocated", podnamespace="ml", podname="train") == 30
    assert hf.one(sa, "hami_vgpu_core_allocated_ratio", namespace="docker", pod="web") == 50
    assert hf.one(sa, "hamid_vgpu_allocation_info", **pod, container="main") == 1  # which container holds it
    t4 = dict(node="node-a", device_index="1")
    t4_uuid = next(lab["device_uuid"] for lab, _ in sa["hami_gpu_memory_limit_bytes"] if lab["device_index"] == "1")
    booked = sum(v for lab, v in sa["hami_vgpu_core_allocated_ratio"] if lab["device_uuid"] == t4_uuid)
    assert booked >= 50 and hf.one(sa, "hami_gpu_core_allocated_ratio", **t4) == booked
    assert hf.one(sa, "hami_gpu_core_limit_ratio", **t4) == 100
    assert hf.one(sa, "hami_gpu_memory_limit_bytes", **t4, device_type="NVIDIA-Tesla T4") == 15360 * MIB
    assert hf.one(sa, "hami_host_gpu_memory_used_bytes", **t4, device_type="NVIDIA-Tesla T4") == 0
    h100 = dict(node="node-a", device_index="0")
    h100_type = next(lab["device_type"] for lab, _ in sa["hami_gpu_memory_limit_bytes"] if lab["device_index"] == "0")
    assert h100_type.startswith("NVIDIA H100")  # HAMi registers a name that has NVIDIA in it as it is
    assert hf.one(sa, "hami_host_gpu_memory_controller_utilization_ratio", **h100, device_type=h100_type) == 0
    total = hf.one(sa, "hami_gpu_memory_limit_bytes", **t4)
    used = hf.one(sa, "hami_gpu_memory_allocated_bytes", **t4, device_cores="100")
    assert hf.one(sa, "hami_node_gpu_memory_allocated_ratio", **t4) == used / total  # 0-1, as HAMi's
    assert hf.one(sa, "hami_node_gpu_overview", **t4, device_memory_limit="15360") == used
    assert hf.one(sa, "hami_gpu_shared_count", **t4) >= 1
    (lab, _), = sb["hami_mig_device_info"]
    assert (lab["namespace"], lab["pod"], lab["container"], lab["profile"]) == ("docker", "mig-job", "main", "1g.10gb")
    (inst, _), = sb["hami_node_gpu_mig_instance_info"]
    assert inst["mig_uuid"] == lab["mig_uuid"] and inst["profile"] == "1g.10gb" and inst["gpu_instance_id"]


def test_the_checker_catches_what_differs():
    text = "\n".join([
        'hami_gpu_core_allocated_ratio{node="n",device_uuid="u",device_index="0",device_type="t",zone="vGPU"} 0.3',
        'hami_vgpu_core_allocated_ratio{namespace="a",node="n",pod="p",container="c",device_uuid="u",zone="vGPU"} 30',
        'hami_node_gpu_memory_allocated_ratio{node="n",device_uuid="u",device_index="0",device_type="t"} 40',
        'GPUDeviceCoreAllocated{nodeid="n",deviceuuid="u",deviceidx="0",devicetype="t",zone="vGPU"} 30',
        'hami_host_gpu_utilization_ratio{node="n",device_index="0",device_uuid="u",device_type="NVIDIA-t",'
        'zone="vGPU"} 1',
        'hami_host_gpu_memory_controller_utilization_ratio{device_index="0",device_uuid="u",device_type="t",'
        'zone="vGPU"} 1',
    ])
    found = "\n".join(hf.problems(hf.parse(text), legacy=False, expect=("hami_gpu_shared_count",)))
    assert "hami_gpu_shared_count: no sample" in found
    assert "hami_vgpu_core_allocated_ratio: labels" in found and "'container'" in found  # a label HAMi's lacks
    assert "hami_node_gpu_memory_allocated_ratio: labels" in found  # zone missing
    assert "hami_node_gpu_memory_allocated_ratio: 40.0 is not a 0-1 fraction" in found
    assert "GPUDeviceCoreAllocated: exported with legacy metrics off" in found
    assert "hami_build_info: no sample" in found
    assert "u: device_type differs between series" in found and "NVIDIA-t" in found
    assert "hami_host_gpu_memory_controller_utilization_ratio: labels" in found  # no node
