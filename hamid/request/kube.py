"""A Kubernetes Pod manifest to a :class:`Request`, with HAMi's semantics.

Resources (limits, falling back to requests): ``nvidia.com/gpu`` (distinct
physical GPUs), ``nvidia.com/gpumem`` (MiB per GPU),
``nvidia.com/gpumem-percentage`` (1-100 of each card), ``nvidia.com/gpucores``
(0-100 percent; 100 is exclusive), ``nvidia.com/priority`` (0 high, 1 low).
A container that sets memory or cores without a GPU count gets the node's
``defaultGPUNum``; one that asks for GPUs and neither memory nor cores gets
the whole card exclusively (``gpucores=100``), as HAMi's webhook does.

Pod annotations apply to every container: ``nvidia.com/use-gputype``,
``nouse-gputype`` (comma lists, case-insensitive substrings of the card
name), ``use-gpuuuid``, ``nouse-gpuuuid`` (exact UUIDs), ``nvidia.com/vgpu-mode``
(``hami-core`` or ``mig``), ``nvidia.com/numa-bind``, and
``hami.io/node-scheduler-policy`` / ``hami.io/gpu-scheduler-policy``.
Init containers are kept apart from app containers: placement books them at
their peak, not their sum.
"""

from __future__ import annotations

from typing import Any

from .model import MODES, POLICIES, ContainerRequest, Defaults, GpuRequest, Request, RequestError
from .quantity import parse_k8s_int

RES_GPU = "nvidia.com/gpu"
RES_MEM = "nvidia.com/gpumem"
RES_MEM_PCT = "nvidia.com/gpumem-percentage"
RES_CORES = "nvidia.com/gpucores"
RES_PRIORITY = "nvidia.com/priority"

ANN_USE_TYPE = "nvidia.com/use-gputype"
ANN_NOUSE_TYPE = "nvidia.com/nouse-gputype"
ANN_USE_UUID = "nvidia.com/use-gpuuuid"
ANN_NOUSE_UUID = "nvidia.com/nouse-gpuuuid"
ANN_MODE = "nvidia.com/vgpu-mode"
ANN_NUMA_BIND = "nvidia.com/numa-bind"
ANN_NODE_POLICY = "hami.io/node-scheduler-policy"
ANN_GPU_POLICY = "hami.io/gpu-scheduler-policy"


def _mapping(v: Any, what: str) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise RequestError(f"{what}: expected a mapping, got {type(v).__name__}")
    return v


def _list(ann: dict, key: str) -> tuple[str, ...]:
    raw = ann.get(key)
    if raw is None:
        return ()
    if not isinstance(raw, str):
        raise RequestError(f"annotation {key}: expected a comma-separated string, got {raw!r}")
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def _choice(ann: dict, key: str, accepted: tuple[str, ...]) -> str | None:
    raw = ann.get(key)
    if raw is None or raw == "":
        return None
    if not isinstance(raw, str) or raw.strip() not in accepted:
        raise RequestError(f"annotation {key}: bad value {raw!r}; accepted: {', '.join(accepted)}")
    return raw.strip()


def _container(c: Any, where: str, init: bool, ann: dict, defaults: Defaults) -> ContainerRequest:
    c = _mapping(c, where)
    name = c.get("name")
    if not isinstance(name, str) or not name:
        raise RequestError(f"{where}.name: every container needs a name")
    res = _mapping(c.get("resources"), f"{where}.resources")
    limits = _mapping(res.get("limits"), f"{where}.resources.limits")
    requests = _mapping(res.get("requests"), f"{where}.resources.requests")

    def get(key: str) -> int | None:
        v = limits.get(key, requests.get(key))
        return None if v is None else parse_k8s_int(v, f"{where} ({name}) {key}")

    gpus, mem, pct, cores, prio = get(RES_GPU), get(RES_MEM), get(RES_MEM_PCT), get(RES_CORES), get(RES_PRIORITY)
    if pct == 0:
        pct = None  # HAMi treats 0 as unset
    if gpus is None and mem is None and pct is None and cores is None:
        return ContainerRequest(name=name, init=init, gpu=None)
    label = f"{where} ({name})"
    if gpus == 0:
        if mem is not None or pct is not None or cores is not None:
            raise RequestError(f"{label}: {RES_GPU} is 0 but GPU memory or cores are requested; "
                               f"set {RES_GPU} to 1 or more, or remove the others")
        return ContainerRequest(name=name, init=init, gpu=None)
    if gpus is not None and gpus > 64:
        raise RequestError(f"{label} {RES_GPU}: {gpus} GPUs requested; accepted: 1 to 64")
    if mem is not None and pct is not None:
        raise RequestError(f"{label}: set one of {RES_MEM} ({mem}) and {RES_MEM_PCT} ({pct}), not both")
    if mem is not None and mem == 0:
        raise RequestError(f"{label} {RES_MEM}: must be at least 1 MiB, got 0")
    if pct is not None and not 1 <= pct <= 100:
        raise RequestError(f"{label} {RES_MEM_PCT}: bad value {pct}; accepted: 1 to 100")
    if cores is not None and not 0 <= cores <= 100:
        raise RequestError(f"{label} {RES_CORES}: bad value {cores}; accepted: 0 to 100 (100 = whole GPU, exclusive)")
    if prio is not None and prio not in (0, 1):
        raise RequestError(f"{label} {RES_PRIORITY}: bad value {prio}; accepted: 0 (high) or 1 (low)")

    count = gpus if gpus is not None else defaults.gpu_num
    if mem is None and pct is None:
        if defaults.memory_mib:
            mem = defaults.memory_mib
        else:
            pct = 100
    whole_card = pct == 100 and mem is None
    if cores is None:
        cores = 100 if (gpus is not None and whole_card) else defaults.cores
    mode = _choice(ann, ANN_MODE, MODES)
    gpu = GpuRequest(
        count=count, mem_mib=mem, mem_percent=pct, cores=0 if mode == "mig" else cores, mode=mode,
        use_types=_list(ann, ANN_USE_TYPE), nouse_types=_list(ann, ANN_NOUSE_TYPE),
        use_uuids=_list(ann, ANN_USE_UUID), nouse_uuids=_list(ann, ANN_NOUSE_UUID),
        numa_bind=_choice(ann, ANN_NUMA_BIND, ("true", "false")) == "true", priority=prio,
    )
    return ContainerRequest(name=name, init=init, gpu=gpu)


def parse_pod(pod: Any, defaults: Defaults = Defaults()) -> Request:
    """Parse a Pod manifest (a mapping, as from YAML or the API)."""
    pod = _mapping(pod, "pod")
    meta = _mapping(pod.get("metadata"), "metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise RequestError("metadata.name: a pod needs a name")
    ns = meta.get("namespace") or "default"
    if not isinstance(ns, str):
        raise RequestError(f"metadata.namespace: expected a string, got {ns!r}")
    ann = _mapping(meta.get("annotations"), "metadata.annotations")
    spec = _mapping(pod.get("spec"), "spec")
    conts: list[ContainerRequest] = []
    for key, init in (("initContainers", True), ("containers", False)):
        items = spec.get(key) or []
        if not isinstance(items, list):
            raise RequestError(f"spec.{key}: expected a list, got {type(items).__name__}")
        for i, c in enumerate(items):
            conts.append(_container(c, f"spec.{key}[{i}]", init, ann, defaults))
    if not any(not c.init for c in conts):
        raise RequestError("spec.containers: a pod needs at least one container")
    uid = meta.get("uid")
    return Request(
        owner=f"pod:{ns}/{name}", containers=tuple(conts),
        node_policy=_choice(ann, ANN_NODE_POLICY, POLICIES),
        gpu_policy=_choice(ann, ANN_GPU_POLICY, POLICIES),
        uid=uid if isinstance(uid, str) else None,
    )
