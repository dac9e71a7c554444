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
    def from_dict(cls, d: dict[str, Any]) -> "Request":
        try:
            conts = []
            for c in d.get("containers", ()):
                g = c.get("gpu")
                gpu = None
                if g is not None:
                    kw = {f.name: g[f.name] for f in fields(GpuRequest) if f.name in g}
                    for k in ("use_types", "nouse_types", "use_uuids", "nouse_uuids", "devices"):
                        if k in kw:
                            kw[k] = tuple(kw[k])
                    gpu = GpuRequest(**kw)
                conts.append(ContainerRequest(name=c["name"], init=bool(c.get("init", False)), gpu=gpu))
            return cls(owner=d["owner"], containers=tuple(conts), node_policy=d.get("node_policy"),
                       gpu_policy=d.get("gpu_policy"), uid=d.get("uid"))
        except (KeyError, TypeError, AttributeError) as e:
            raise RequestError(f"malformed request document: {e!r}") from None
