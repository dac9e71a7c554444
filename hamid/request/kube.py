"""A Kubernetes Pod manifest to a :class:`Request`, with HAMi's semantics.

Resources (limits, falling back to requests): ``nvidia.com/gpu`` (distinct
physical GPUs), ``nvidia.com/gpumem`` (MiB per GPU),
``nvidia.com/gpumem-percentage`` (1-100 of each card), ``nvidia.com/gpucores``
(0-100 percent; 100 is exclusive), ``nvidia.com/priority`` (0 high, 1 low).
Resource names are HAMi's unless the config renames them
(``resourceCountName``...; :class:`ResourceNames`). ``gpumem`` is multiplied
by ``memoryFactor``; ``gpumem: 0`` and ``gpumem-percentage: 0`` mean "not
set". A container that sets memory or cores without a GPU count gets the
node's ``defaultGPUNum``; one whose memory is the whole card (none given and
no ``defaultMemory``, or ``gpumem-percentage: 100``) and that names no cores
gets the card exclusively (``gpucores=100``), as HAMi's webhook does. With
``defaultMemory`` set, ``gpu: 1`` gets that many MiB and ``defaultCores``, as
HAMi's scheduler gives.

Pod annotations apply to every container: ``nvidia.com/use-gputype``,
``nouse-gputype`` (comma lists, case-insensitive substrings of the card
name), ``use-gpuuuid``, ``nouse-gpuuuid`` (exact UUIDs), ``nvidia.com/vgpu-mode``
(``hami-core``, ``mig`` or ``mps``, as HAMi: an MPS share is one GPU per
container), ``nvidia.com/numa-bind``, and
``hami.io/node-scheduler-policy`` / ``hami.io/gpu-scheduler-policy`` (a policy
or a chain such as ``binpack,numa``), and ``hami.io/device-scoring-weights``.
The node annotation ``hami.io/device-cordon`` is parsed here too
(:func:`parse_device_cordon`).
Init containers are kept apart from app containers: placement books them at
their peak, not their sum.
"""

from __future__ import annotations

from typing import Any

from .model import (MODES, POLICIES, ContainerRequest, Defaults, GpuRequest, Request, RequestError,
                    ScoringWeights, echo, parse_core_policy, parse_gpu_policy)
from .quantity import parse_k8s_int

ANN_USE_TYPE = "nvidia.com/use-gputype"
ANN_NOUSE_TYPE = "nvidia.com/nouse-gputype"
ANN_USE_UUID = "nvidia.com/use-gpuuuid"
ANN_NOUSE_UUID = "nvidia.com/nouse-gpuuuid"
ANN_MODE = "nvidia.com/vgpu-mode"
ANN_NUMA_BIND = "nvidia.com/numa-bind"
ENV_CORE_POLICY = "GPU_CORE_UTILIZATION_POLICY"  # a container's own policy, HAMi's per-pod setting
ANN_NODE_POLICY = "hami.io/node-scheduler-policy"
ANN_GPU_POLICY = "hami.io/gpu-scheduler-policy"
ANN_SCORING_WEIGHTS = "hami.io/device-scoring-weights"
ANN_DEVICE_CORDON = "hami.io/device-cordon"  # a node annotation: GPU UUIDs that take no new tenants


def parse_device_cordon(value: Any, what: str = f"node annotation {ANN_DEVICE_CORDON}") -> frozenset[str]:
    """HAMi's per-GPU cordon: a comma list of GPU UUIDs (empty entries ignored)."""
    if value is None:
        return frozenset()
    if not isinstance(value, str):
        raise RequestError(f"{what}: expected a comma-separated string of GPU UUIDs, got {value!r}")
    out = frozenset(p.strip() for p in value.split(",") if p.strip())
    bad = sorted(u for u in out if not u.startswith(("GPU-", "MIG-")))
    if bad:
        raise RequestError(f"{what}: {echo(bad[0])} is not a GPU UUID; accepted: GPU-... entries, comma-separated")
    return out


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
    names = defaults.names

    def get(key: str) -> int | None:
        v = limits.get(key, requests.get(key))
        return None if v is None else parse_k8s_int(v, f"{where} ({name}) {key}")

    if names.count != LEGACY_COUNT and (LEGACY_COUNT in limits or LEGACY_COUNT in requests):
        raise RequestError(f"{where} ({name}) {LEGACY_COUNT}: the GPU count's name in HAMi's first releases; "
                           f"HAMi and hamid count GPUs with {names.count} (resourceCountName) and would leave "
                           f"this pod pending: rename it to {names.count}, or set resourceCountName: "
                           f"{LEGACY_COUNT} to keep the old name")
    gpus, mem, pct = get(names.count), get(names.memory), get(names.memory_percentage)
    cores, prio = get(names.cores), get(names.priority)
    if gpus is None and mem is None and pct is None and cores is None:
        return ContainerRequest(name=name, init=init, gpu=None)
    # HAMi's webhook (defaultExclusiveCoreIfNeeded) makes a container with a
    # GPU count and no cores exclusive when it names no memory: with a
    # percentage, only when it is 100; without one, when gpumem is absent,
    # whatever defaultMemory says. Decided on what the pod wrote, before the
    # zeros below become "not set".
    exclusive_default = pct == 100 if pct is not None else mem is None
    # A written 0 is "not set" for memory and percent (HAMi's request parser);
    # the key being there still asks for a GPU, as HAMi's webhook counts keys.
    if pct == 0:
        pct = None
    if mem == 0:
        mem = None
    label = f"{where} ({name})"
    if gpus == 0:
        if mem is not None or pct is not None or cores is not None:
            raise RequestError(f"{label}: {names.count} is 0 but GPU memory or cores are requested; "
                               f"set {names.count} to 1 or more, or remove the others")
        return ContainerRequest(name=name, init=init, gpu=None)
    if gpus is not None and gpus > 64:
        raise RequestError(f"{label} {names.count}: {gpus} GPUs requested; accepted: 1 to 64")
    if mem is not None and pct is not None:
        raise RequestError(f"{label}: set one of {names.memory} ({mem}) and {names.memory_percentage} ({pct}), "
                           "not both")
    if pct is not None and not 1 <= pct <= 100:
        raise RequestError(f"{label} {names.memory_percentage}: bad value {pct}; accepted: 1 to 100")
    if cores is not None and cores > 100:
        cores = 100  # as HAMi: more than the whole GPU is the whole GPU (cores_clamped says so)
    if prio is not None and prio not in (0, 1):
        raise RequestError(f"{label} {names.priority}: bad value {prio}; accepted: 0 (high) or 1 (low)")
    if mem is not None:
        mem *= defaults.memory_factor
        if mem > 1 << 30:
            raise RequestError(f"{label} {names.memory}: {mem} MiB (after memoryFactor "
                               f"{defaults.memory_factor}) is larger than any GPU")

    count = gpus if gpus is not None else defaults.gpu_num
    if mem is None and pct is None:
        if defaults.memory_mib:
            mem = defaults.memory_mib
        else:
            pct = 100
    if cores is None:
        cores = 100 if exclusive_default else defaults.cores
    mode = _choice(ann, ANN_MODE, MODES)
    if mode == "mps" and count != 1:
        raise RequestError(f"{label}: annotation {ANN_MODE}: mps takes one GPU per container, {names.count} is "
                           f"{count}: a process reaches one MPS control daemon and hamid runs one per GPU; set "
                           f"{names.count} to 1 or use hami-core")
    gpu = GpuRequest(
        count=count, mem_mib=mem, mem_percent=pct, cores=0 if mode == "mig" else cores, mode=mode,
        use_types=_list(ann, ANN_USE_TYPE), nouse_types=_list(ann, ANN_NOUSE_TYPE),
        use_uuids=_list(ann, ANN_USE_UUID), nouse_uuids=_list(ann, ANN_NOUSE_UUID),
        numa_bind=_choice(ann, ANN_NUMA_BIND, ("true", "false")) == "true", priority=prio,
        core_policy=_env_policy(c, label),
    )
    return ContainerRequest(name=name, init=init, gpu=gpu)


# The count's name in HAMi's first releases (4paradigm's k8s-vgpu-scheduler); HAMi
# today ignores it, so such a pod waits forever: refused here, saying what to write.
LEGACY_COUNT = "nvidia.com/vgpu"
# The scheduling gate the webhook puts on every GPU pod in gate mode, and the gate leader removes once it placed it.
GATE = "hamid.io/placement"
CORES_CLAMPED = "hamid.io/gpucores-clamped"  # set by the webhook on a pod whose gpucores it lowered to 100


def cores_clamped(pod: Any, defaults: Defaults = Defaults()) -> list[tuple[str, int, str, int]]:
    """The containers asking more than 100 % of a GPU, which HAMi (and hamid)
    take as 100: (``initContainers``/``containers``, index, name, value
    asked). Malformed values are left to :func:`parse_pod` to refuse."""
    out = []
    spec = pod.get("spec") if isinstance(pod, dict) else None
    for key in ("initContainers", "containers"):
        items = spec.get(key) if isinstance(spec, dict) else None
        for i, c in enumerate(items if isinstance(items, list) else ()):
            res = c.get("resources") if isinstance(c, dict) else None
            if not isinstance(res, dict):
                continue
            for part in ("limits", "requests"):
                v = (res.get(part) or {}).get(defaults.names.cores) if isinstance(res.get(part), dict) else None
                try:
                    n = None if v is None else parse_k8s_int(v, defaults.names.cores)
                except RequestError:
                    n = None
                if n is not None and n > 100:
                    out.append((key, i, str(c.get("name")), n))
                    break
    return out


def clamp_message(key: str, i: int, name: str, asked: int, cores_name: str) -> str:
    return (f"spec.{key}[{i}] ({name}) {cores_name}: {asked} is more than a whole GPU; taken as 100 "
            "(the whole GPU, exclusive), as HAMi does")


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
    gpu_policy = ann.get(ANN_GPU_POLICY)
    weights = ann.get(ANN_SCORING_WEIGHTS)
    return Request(
        owner=f"pod:{ns}/{name}", containers=tuple(conts),
        node_policy=_choice(ann, ANN_NODE_POLICY, POLICIES),
        gpu_policy=None if gpu_policy in (None, "") else parse_gpu_policy(gpu_policy, f"annotation {ANN_GPU_POLICY}"),
        uid=uid if isinstance(uid, str) else None,
        weights=None if weights in (None, "") else ScoringWeights.parse(weights, f"annotation {ANN_SCORING_WEIGHTS}"),
    )


def _env_policy(c: dict, label: str) -> str | None:
    """The container's own GPU_CORE_UTILIZATION_POLICY env (HAMi's per-pod setting), literal values only."""
    for e in c.get("env") or ():
        if isinstance(e, dict) and e.get("name") == ENV_CORE_POLICY:
            v = e.get("value")
            if not isinstance(v, str):
                raise RequestError(f"{label} env {ENV_CORE_POLICY}: only a literal value is read (default or force)")
            return parse_core_policy(v, f"{label} env {ENV_CORE_POLICY}")
    return None
