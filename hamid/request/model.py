"""The request types every caller shares, and their JSON form."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ..errors import HamidError

MODES = ("hami-core", "mig")
POLICIES = ("binpack", "spread")


class RequestError(HamidError):
    """A request could not be parsed; the message names the bad part."""


@dataclass(frozen=True)
class Defaults:
    """What a request gets for what it leaves out (from the node settings)."""

    memory_mib: int = 0  # 0: the whole card
    cores: int = 0
    gpu_num: int = 1

    @classmethod
    def from_settings(cls, s: Any) -> "Defaults":
        return cls(memory_mib=s.defaultMemory, cores=s.defaultCores, gpu_num=s.defaultGPUNum)


@dataclass(frozen=True)
class GpuRequest:
    """What one container asks of GPUs.

    Memory is either ``mem_mib`` (per GPU) or ``mem_percent`` of each card's
    (scaled) memory; exactly one is set. ``cores`` is a percent of each GPU's
    compute; 100 means exclusive use. ``mig_profile`` names a MIG profile
    explicitly; otherwise in MIG mode the smallest profile that holds the
    memory is chosen. ``devices`` restricts the candidates to GPU indexes or
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

    @property
    def wants_mig(self) -> bool:
        return self.mode == "mig" or self.mig_profile is not None


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
    gpu_policy: str | None = None
    uid: str | None = None

    @property
    def wants_gpu(self) -> bool:
        return any(c.gpu is not None for c in self.containers)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "Request":
        """Rebuild a request from its JSON form, checking every field's type."""
        if not isinstance(d, dict):
            raise RequestError(f"request: expected an object, got {type(d).__name__}")
        owner = d.get("owner")
        if not isinstance(owner, str) or not owner:
            raise RequestError("request.owner: a non-empty string is required")
        conts_in = d.get("containers", [])
        if not isinstance(conts_in, list):
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
        for k in ("node_policy", "gpu_policy"):
            if d.get(k) not in (None, *POLICIES):
                raise RequestError(f"request.{k}: bad value {d.get(k)!r}; accepted: {', '.join(POLICIES)}")
        uid = d.get("uid")
        return cls(owner=owner, containers=tuple(conts), node_policy=d.get("node_policy"),
                   gpu_policy=d.get("gpu_policy"), uid=uid if isinstance(uid, str) else None)


_INT_FIELDS = {"count": (1, 64), "mem_mib": (1, 1 << 30), "mem_percent": (1, 100), "cores": (0, 100),
               "priority": (0, 1)}
_STR_FIELDS = {"mig_profile", "mode"}
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
