"""The request types every caller shares, and their JSON form."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..errors import HamidError

MODES = ("hami-core", "mig", "mps")
POLICIES = ("binpack", "spread")  # node policies
GPU_POLICIES = ("spread", "binpack", "topology-aware", "mutex")  # one of these, optionally with "numa"
GPU_POLICY_FORMS = ("spread, binpack, topology-aware, mutex or numa, or a comma-separated chain of one of the "
                    "first four and numa (binpack,numa)")
ECHO_MAX = 64


class RequestError(HamidError):
    """A request could not be parsed; the message names the bad part."""


def echo(text: str, limit: int = ECHO_MAX) -> str:
    """``text`` for an error message: quoted, cut to ``limit`` characters."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "…"


def parse_gpu_policy(text: str, what: str) -> str:
    """A GPU policy or chain (``binpack,numa``) to its canonical form.

    A chain holds at most one ranking policy (spread, binpack,
    topology-aware, mutex) and optionally ``numa``; ``numa`` alone is
    ``spread,numa``. Anything else is refused with the accepted forms.
    """
    if not isinstance(text, str):
        raise RequestError(f"{what}: expected a string, got {text!r}")
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise RequestError(f"{what}: bad value {echo(text)}: empty entry; accepted: {GPU_POLICY_FORMS}")
    primary = [p for p in parts if p in GPU_POLICIES]
    bad = [p for p in parts if p not in GPU_POLICIES and p != "numa"]
    if bad:
        raise RequestError(f"{what}: unknown policy {echo(bad[0])} in {echo(text)}; accepted: {GPU_POLICY_FORMS}")
    if len(primary) > 1 or parts.count("numa") > 1:
        raise RequestError(f"{what}: {echo(text)} names more than one ranking policy; accepted: {GPU_POLICY_FORMS}")
    out = primary[0] if primary else "spread"
    return out + ",numa" if "numa" in parts else out


@dataclass(frozen=True)
class ScoringWeights:
    """``hami.io/device-scoring-weights``: weights of the shares, core and
    memory fractions in the GPU score (HAMi's default is 1 each). HAMi's
    annotation names the shares weight ``slot``, and so does the request's
    JSON form (:meth:`Request.to_dict`, stored and sent to peers)."""

    shares: float = 1.0
    core: float = 1.0
    memory: float = 1.0

    FORMS = "slot=<n>,core=<n>,memory=<n>: all three keys, each a number >= 0, at least one above 0"

    @classmethod
    def parse(cls, text: str, what: str) -> "ScoringWeights":
        if not isinstance(text, str):
            raise RequestError(f"{what}: expected a string, got {text!r}")
        got: dict[str, float] = {}
        for part in text.split(","):
            k, eq, v = part.partition("=")
            k, v = k.strip(), v.strip()
            if not eq or k not in ("slot", "core", "memory"):
                raise RequestError(f"{what}: bad item {echo(part.strip())}; accepted: {cls.FORMS}")
            if k in got:
                raise RequestError(f"{what}: {k} is given twice in {echo(text)}")
            if not re.fullmatch(r"[0-9]{1,6}(\.[0-9]{1,6})?", v, re.ASCII):
                raise RequestError(f"{what}: {k}={echo(v)} is not a number >= 0; accepted: {cls.FORMS}")
            got[k] = float(v)
        missing = [k for k in ("slot", "core", "memory") if k not in got]
        if missing:
            raise RequestError(f"{what}: {', '.join(missing)} missing in {echo(text)}; accepted: {cls.FORMS}")
        if not any(got.values()):
            raise RequestError(f"{what}: all weights are 0 in {echo(text)}; accepted: {cls.FORMS}")
        return cls(got["slot"], got["core"], got["memory"])

    def to_dict(self) -> dict[str, float]:
        # "slot", HAMi's key, not the field's name: earlier versions (a peer, the ledger after a
        # downgrade) accept exactly these three keys; from_dict takes "shares" too, so a later
        # version may write it once no earlier reader is left
        return {"slot": self.shares, "core": self.core, "memory": self.memory}


@dataclass(frozen=True)
class ResourceNames:
    """The Kubernetes resource names a pod asks with (HAMi's
    ``resourceCountName``... keys; defaults are HAMi's)."""

    count: str = "nvidia.com/gpu"
    memory: str = "nvidia.com/gpumem"
    memory_percentage: str = "nvidia.com/gpumem-percentage"
    cores: str = "nvidia.com/gpucores"
    priority: str = "nvidia.com/priority"

    @classmethod
    def from_settings(cls, s: Any) -> "ResourceNames":
        return cls(count=s.resourceCountName, memory=s.resourceMemoryName,
                   memory_percentage=s.resourceMemoryPercentageName, cores=s.resourceCoreName,
                   priority=s.resourcePriorityName)


@dataclass(frozen=True)
class Defaults:
    """What a request gets for what it leaves out (from the node settings)."""

    memory_mib: int = 0  # 0: the whole card
    cores: int = 0
    gpu_num: int = 1
    memory_factor: int = 1  # nvidia.com/gpumem is multiplied by it (HAMi's memoryFactor)
    names: ResourceNames = ResourceNames()

    @classmethod
    def from_settings(cls, s: Any) -> "Defaults":
        names = ResourceNames.from_settings(s) if hasattr(s, "resourceCountName") else ResourceNames()
        return cls(memory_mib=s.defaultMemory, cores=s.defaultCores, gpu_num=s.defaultGPUNum,
                   memory_factor=getattr(s, "memoryFactor", 1), names=names)


@dataclass(frozen=True)
class GpuRequest:
    """What one container asks of GPUs.

    Memory is either ``mem_mib`` (per GPU) or ``mem_percent`` of each card's
    (scaled) memory; exactly one is set. ``cores`` is a percent of each GPU's
    compute; 100 means exclusive use. ``mig_profile`` names a MIG profile
    explicitly; otherwise in MIG mode the smallest profile that holds the
    memory is chosen. ``mode`` ``mps`` asks for an MPS client share of one
    GPU (``cores`` becomes its active thread percentage, the memory its
    pinned-memory limit); ``None`` takes whatever mode the GPU serves. ``devices`` restricts the candidates to GPU indexes or
    UUIDs (Docker's ``HAMI_VISIBLE_DEVICES``); ``count`` ``None`` means every
    listed device.
    """

    count: int | None = 1
    mem_mib: int | None = None
    mem_percent: int | None = 100
    cores: int = 0
    mig_profile: str | None = None
    mode: str | None = None
    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    nouse_uuids: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    numa_bind: bool = False
    priority: int | None = None
    # GPU_CORE_UTILIZATION_POLICY a container asks for: "default" or "force" (None: the node's gpuCorePolicy).
    # "disable" lifts a limit, so only the node's setting may say it (CONTAINER_POLICIES).
    core_policy: str | None = None

    @property
    def wants_mig(self) -> bool:
        return self.mode == "mig" or self.mig_profile is not None

    @property
    def wants_mps(self) -> bool:
        return self.mode == "mps"


@dataclass(frozen=True)
class ContainerRequest:
    name: str
    init: bool = False
    gpu: GpuRequest | None = None


@dataclass(frozen=True)
class Request:
    """A pod or a Docker container: its owner and its containers' needs."""

    owner: str  # "pod:<namespace>/<name>" or "docker:<container id>"
    containers: tuple[ContainerRequest, ...] = field(default=())
    node_policy: str | None = None
    gpu_policy: str | None = None  # canonical GPU policy or chain (parse_gpu_policy)
    uid: str | None = None
    weights: ScoringWeights | None = None  # hami.io/device-scoring-weights

    @property
    def wants_gpu(self) -> bool:
        return any(c.gpu is not None for c in self.containers)

    def gpu_of(self, container: str) -> GpuRequest | None:
        """What ``container`` asked of GPUs (None: it asked for none, or there is no such container)."""
        for c in self.containers:
            if c.name == container:
                return c.gpu
        return None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.weights is not None:
            d["weights"] = self.weights.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Any) -> "Request":
        """Rebuild a request from its JSON form, checking every field's type."""
        if not isinstance(d, dict):
            raise RequestError(f"request: expected an object, got {type(d).__name__}")
        owner = d.get("owner")
        if not isinstance(owner, str) or not owner:
            raise RequestError("request.owner: a non-empty string is required")
        conts_in = d.get("containers", [])
        if not isinstance(conts_in, (list, tuple)):  # a tuple: to_dict's own form, before any JSON
            raise RequestError("request.containers: expected a list")
        conts = []
        for i, c in enumerate(conts_in):
            where = f"request.containers[{i}]"
            if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                raise RequestError(f"{where}: expected an object with a string name")
            g = c.get("gpu")
            gpu = None
            if g is not None:
                if not isinstance(g, dict):
                    raise RequestError(f"{where}.gpu: expected an object")
                kw = {}
                for f in fields(GpuRequest):
                    if f.name not in g:
                        continue
                    kw[f.name] = _typed(g[f.name], f.name, f"{where}.gpu.{f.name}")
                gpu = GpuRequest(**kw)
            conts.append(ContainerRequest(name=c["name"], init=bool(c.get("init", False)), gpu=gpu))
        if d.get("node_policy") not in (None, *POLICIES):
            raise RequestError(f"request.node_policy: bad value {d.get('node_policy')!r}; "
                               f"accepted: {', '.join(POLICIES)}")
        gpu_policy = d.get("gpu_policy")
        if gpu_policy is not None:
            gpu_policy = parse_gpu_policy(gpu_policy, "request.gpu_policy")
        w = d.get("weights")
        weights = None
        if w is not None:
            if isinstance(w, dict) and "shares" in w and "slot" not in w:
                w = {"slot": w["shares"], **{k: v for k, v in w.items() if k != "shares"}}
            if not isinstance(w, dict) or set(w) != {"slot", "core", "memory"} or not all(
                    isinstance(w[k], (int, float)) and not isinstance(w[k], bool) and w[k] >= 0 for k in w) \
                    or not any(w.values()):
                raise RequestError(f"request.weights: bad value {w!r}; accepted: {ScoringWeights.FORMS}")
            weights = ScoringWeights(float(w["slot"]), float(w["core"]), float(w["memory"]))
        uid = d.get("uid")
        return cls(owner=owner, containers=tuple(conts), node_policy=d.get("node_policy"),
                   gpu_policy=gpu_policy, uid=uid if isinstance(uid, str) else None, weights=weights)


_INT_FIELDS = {"count": (1, 64), "mem_mib": (1, 1 << 30), "mem_percent": (1, 100), "cores": (0, 100),
               "priority": (0, 1)}
_STR_FIELDS = {"mig_profile", "mode", "core_policy"}
_LIST_FIELDS = {"use_types", "nouse_types", "use_uuids", "nouse_uuids", "devices"}


def _typed(v: Any, name: str, where: str) -> Any:
    if name in _INT_FIELDS:
        if v is None and name != "cores":
            return None
        lo, hi = _INT_FIELDS[name]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise RequestError(f"{where}: expected a whole number from {lo} to {hi}, got {v!r}")
        return v
    if name in _STR_FIELDS:
        if v is not None and not isinstance(v, str):
            raise RequestError(f"{where}: expected a string, got {v!r}")
        if name == "mode" and v not in (None, *MODES):
            raise RequestError(f"{where}: bad value {v!r}; accepted: {', '.join(MODES)}")
        return v
    if name in _LIST_FIELDS:
        if not isinstance(v, (list, tuple)) or not all(isinstance(x, str) for x in v):
            raise RequestError(f"{where}: expected a list of strings, got {v!r}")
        return tuple(v)
    if name == "numa_bind":
        if not isinstance(v, bool):
            raise RequestError(f"{where}: expected true or false, got {v!r}")
        return v
    raise RequestError(f"{where}: unknown field")


# GPU_CORE_UTILIZATION_POLICY as HAMi spells it: what a container may ask for, and what the node may set.
CONTAINER_POLICIES = ("default", "force")  # the node's gpuCorePolicy may also say disable
_POLICY_RANK = {"disable": 0, "default": 1, "force": 2}


def parse_core_policy(value: str, what: str) -> str:
    """A container's GPU_CORE_UTILIZATION_POLICY: default or force (HAMi accepts any case); disable refused."""
    v = value.strip().lower()
    if v == "disable":
        raise RequestError(f"{what}: disable would lift the compute limit the container was given; only the node's "
                           "gpuCorePolicy may say disable. Accepted here: default or force")
    if v not in CONTAINER_POLICIES:
        raise RequestError(f"{what}: bad value {echo(value)}; accepted: default or force")
    return v


def effective_core_policy(node: str, container: str | None) -> str:
    """The stricter of the node's gpuCorePolicy and the container's own (force > default > disable)."""
    if container is None:
        return node
    return container if _POLICY_RANK[container] > _POLICY_RANK[node] else node
