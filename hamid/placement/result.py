"""What the engine answers: a decision, or why nothing fits."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..devices.types import MigPlacement
from .reasons import Reason


@dataclass(frozen=True)
class DeviceAssignment:
    """One GPU given to one container: how much of it, or which MIG slot."""

    uuid: str
    index: int
    mem_mib: int
    cores: int
    mig_profile: str | None = None
    mig_placement: MigPlacement | None = None
    mps: bool = False  # an MPS client share: cores is its active thread percentage, mem_mib its pinned limit

    @property
    def sm_limit(self) -> int:
        """The share's compute limit in percent, 0 for none: the one home of the rule that a limit is
        0 < cores < 100 (0 asks for no share of compute, 100 is the whole GPU: neither is limited)."""
        return self.cores if 0 < self.cores < 100 else 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.mig_placement is not None:
            d["mig_placement"] = {"start": self.mig_placement.start, "size": self.mig_placement.size}
        if not self.mps:
            del d["mps"]  # absent means hami-core: documents written before MPS existed read the same
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DeviceAssignment":
        pl = d.get("mig_placement")
        return cls(uuid=d["uuid"], index=int(d["index"]), mem_mib=int(d["mem_mib"]), cores=int(d["cores"]),
                   mig_profile=d.get("mig_profile"),
                   mig_placement=MigPlacement(int(pl["start"]), int(pl["size"])) if pl else None,
                   mps=d.get("mps") is True)


@dataclass(frozen=True)
class ContainerAssignment:
    name: str
    init: bool
    devices: tuple[DeviceAssignment, ...]


@dataclass(frozen=True)
class Decision:
    node: str
    containers: tuple[ContainerAssignment, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "containers": [
            {"name": c.name, "init": c.init, "devices": [d.to_dict() for d in c.devices]}
            for c in self.containers]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Decision":
        return cls(node=d["node"], containers=tuple(
            ContainerAssignment(c["name"], bool(c["init"]), tuple(DeviceAssignment.from_dict(x) for x in c["devices"]))
            for c in d["containers"]))


@dataclass(frozen=True)
class NoFit:
    """Nothing fits. ``reasons`` maps each node to why, per GPU where useful."""

    reasons: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def message(self, limit: int = 20) -> str:
        lines: list[str] = []
        for node, why in list(self.reasons.items())[:limit]:
            lines.extend(f"{node}: {w}" for w in why)
        more = len(self.reasons) - limit
        if more > 0:
            lines.append(f"... and {more} more node(s)")
        helps: list[str] = []  # a help many GPUs' reasons share (the MPS programs'), said once
        for why in self.reasons.values():
            for w in why:
                if isinstance(w, Reason) and w.kind == "mpsmissing" and w.what and w.what not in helps:
                    helps.append(w.what)
        lines.extend(helps)
        return "\n".join(lines) if lines else "no nodes to place on"
