"""The engine's input: what a node has and what is already reserved on it.

A :class:`GpuView` joins a GPU's capacity (after the node's scaling and split
settings) with its current use. Views are built by the ledger (its own node),
from gossip (peers) or from a cluster file (``hamid plan``); the engine never
builds them from a device or a database itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import NamedTuple

from ..devices.modelnames import model_matches
from ..devices.types import GpuInfo, MigPlacement, MigProfile
from ..hamimetrics import device_type

MODE_SHIM = "hami-core"
MODE_MIG = "mig"
SHARE_MPS = "mps"  # a share mode of a MODE_SHIM GPU: clients of the GPU's MPS control daemon
DEFAULT_SERVES = (MODE_SHIM,)


class MigSlot(NamedTuple):
    """A MIG instance booked (or live) on a GPU (a named tuple, for speed)."""

    profile: str
    placement: MigPlacement


@dataclass(frozen=True)
class GpuView:
    uuid: str
    index: int
    name: str
    mode: str  # MODE_SHIM or MODE_MIG
    mem_total: int  # MiB bookable: physical x deviceMemoryScaling; MIG: largest profile
    cores_total: int  # percent bookable: 100 x deviceCoreScaling
    shares_total: int  # deviceSplitCount: how many tenants may share the GPU (MIG: its largest instance count)
    numa: int | None = None
    healthy: bool = True
    filtered: bool = False  # excluded by filterDevices
    mig_profiles: tuple[MigProfile, ...] = ()
    compute_slices: int = 0
    memory_slices: int = 0
    mem_used: int = 0
    cores_used: int = 0
    shares_used: int = 0  # tenants booked (a MIG instance is one)
    exclusive: bool = False  # held by a tenant with cores=100 (on a GPU of 100% cores)
    mig_used: tuple[MigSlot, ...] = ()
    cordoned: bool = False  # hami.io/device-cordon: no new tenants, existing ones stay
    mig_capable: bool = False  # the GPU can be put in MIG mode (whatever mode it is in now)
    links: tuple[tuple[str, int], ...] = ()  # (peer UUID, HAMi link score), see link_score
    serves: tuple[str, ...] = DEFAULT_SERVES  # share modes of a whole GPU ("hami-core", "mps"), default first
    mps_used: int = 0  # of shares_used, the MPS client shares (the rest are hami-core shares)
    mps_missing: bool = False  # configured to serve mps, but its node lacks NVIDIA's MPS programs: mps refused
    dra: bool = False  # served through DRA (draDevices): placement chooses it only for a request naming it

    @property
    def share_mode(self) -> str | None:
        """The mode the GPU's current tenants share it in (one at a time), None when idle."""
        if self.mode == MODE_MIG or not self.shares_used:
            return None
        return SHARE_MPS if self.mps_used else MODE_SHIM

    @property
    def mode_label(self) -> str:
        """What ``status`` and ``plan`` show: ``mig``, ``hami-core``, ``mps`` or ``hami-core|mps``."""
        return self.mode if self.mode == MODE_MIG else "|".join(self.serves)

    def link_score(self, peer: str) -> int:
        """HAMi's link score to GPU ``peer``: n x 100 for n NVLinks, else the
        PCIe distance (60 same board ... 10 across CPUs); 0 when unknown."""
        for u, s in self.links:
            if u == peer:
                return s
        return 0

    @cached_property
    def type_names(self) -> tuple[str, ...]:
        """The names use-gputype / nouse-gputype match against, upper case:
        the card's own name, the type HAMi registers (``NVIDIA-`` prefixed when
        the name lacks "NVIDIA", e.g. ``NVIDIA-Tesla T4``) and the prefixed
        form HAMi up to v2.7 registered for every card."""
        return hami_type_names(self.name)

    @property
    def hami_type(self) -> str:
        """The type HAMi (v2.8 on) registers: the name, ``NVIDIA-`` prefixed
        when it lacks "NVIDIA" (``NVIDIA-Tesla T4``)."""
        return device_type(self.name)

    def profile(self, name: str) -> MigProfile | None:
        for p in self.mig_profiles:
            if p.name == name:
                return p
        return None

    def with_use(self, mem: int, cores: int, shares: int, exclusive: bool, mig: tuple[MigSlot, ...],
                 mps: int = 0) -> "GpuView":
        """A copy with the given use (a fast ``dataclasses.replace`` for the hot path)."""
        new = object.__new__(GpuView)
        d = new.__dict__
        d.update(self.__dict__)
        d["mem_used"], d["cores_used"], d["shares_used"], d["exclusive"], d["mig_used"] = mem, cores, shares, exclusive, mig
        d["mps_used"] = mps
        return new


def hami_type_names(name: str) -> tuple[str, ...]:
    up = name.upper()
    return (up, "NVIDIA-" + up)  # the second is v2.8's type too when the name lacks NVIDIA


def type_matches(g: GpuView, wanted: str) -> bool:
    """HAMi's type filter: a case-insensitive substring of the registered type."""
    w = wanted.upper()
    return any(w in t for t in g.type_names)


def allowlist_entry(g: GpuView, allowlist):
    """The first ``migProfileAllowlist`` entry naming ``g``'s model, or None.
    The GPU's memory is its full MIG profile's (what the largest instance
    holds, within a few percent of the card's), which the view keeps whatever
    mode the GPU is in."""
    memory = max((p.memory_mib for p in g.mig_profiles), default=g.mem_total)
    return next((e for e in allowlist if any(model_matches(m, g.name, memory) for m in e.models)), None)


def restrict_mig_profiles(g: GpuView, allowlist) -> GpuView:
    """``g`` with only the MIG profiles a node's ``migProfileAllowlist``
    allows for its model (the first entry whose models match the name, as
    :mod:`hamid.devices.modelnames` matches HAMi's model names); unchanged
    when no entry matches or the GPU has no MIG table."""
    if not g.mig_profiles:
        return g
    entry = allowlist_entry(g, allowlist)
    if entry is None:
        return g
    allowed = set(entry.profiles)
    profs = tuple(p for p in g.mig_profiles if p.name in allowed)
    mem_total, shares = g.mem_total, g.shares_total
    if g.mode == MODE_MIG:
        mem_total = max((p.memory_mib for p in profs), default=0)
        shares = max((p.max_instances for p in profs), default=0)
    return replace(g, mig_profiles=profs, mem_total=mem_total, shares_total=shares)


@dataclass
class NodeView:
    name: str
    gpus: tuple[GpuView, ...]
    gpu_policy: str = "spread"

    @cached_property
    def open_shim_free_mem(self) -> tuple[int, ...]:
        """Free MiB of each shim GPU that could take one more tenant, most free first."""
        return tuple(sorted((g.mem_total - g.mem_used for g in self.gpus
                             if g.mode == MODE_SHIM and g.healthy and not g.filtered and not g.exclusive
                             and not g.cordoned and g.shares_used < g.shares_total), reverse=True))

    @cached_property
    def mig_creatable(self) -> tuple[tuple[int, frozenset[str]], ...]:
        """Per usable MIG GPU: the largest memory (MiB) of a profile that can
        still be created, and the names of all profiles that can."""
        from .mig import free_placements  # mig imports this module

        out = []
        for g in self.gpus:
            if g.mode != MODE_MIG or not g.healthy or g.filtered or g.cordoned:
                continue
            names = frozenset(p.name for p in g.mig_profiles if free_placements(p, g.mig_used, g))
            best = max((p.memory_mib for p in g.mig_profiles if p.name in names), default=0)
            out.append((best, names))
        return tuple(sorted(out, key=lambda x: -x[0]))

    @cached_property
    def mem_used_fraction(self) -> float:
        """Booked memory over the memory of all GPUs (0 without GPUs): the extender's prioritize score."""
        total = sum(g.mem_total for g in self.gpus) or 1
        return sum(g.mem_used for g in self.gpus) / total

    @cached_property
    def usage_score(self) -> float:
        """HAMi's node score on current use: 10*(shares + cores + memory fractions)."""
        shares = cores = mem = 0.0
        tshares = tcores = tmem = 0.0
        for g in self.gpus:
            if g.filtered:
                continue
            shares += g.shares_used
            tshares += g.shares_total
            cores += g.cores_used
            tcores += g.cores_total
            if g.mode == MODE_MIG and g.memory_slices:
                used = sum(s.placement.size for s in g.mig_used)
                mem += g.mem_total * used / g.memory_slices
            else:
                mem += g.mem_used
            tmem += g.mem_total
        score = 0.0
        if tshares:
            score += shares / tshares
        if tcores:
            score += cores / tcores
        if tmem:
            score += mem / tmem
        return 10.0 * score


def gpu_view_from_info(info: GpuInfo, *, split_count: int = 10, memory_scaling: float = 1.0,
                       core_scaling: float = 1.0, filtered: bool = False,
                       serves: tuple[str, ...] = DEFAULT_SERVES, mps_missing: bool = False,
                       dra: bool = False) -> GpuView:
    """Capacity of a GPU under a node's settings, with nothing used yet.

    A GPU in MIG mode is booked by MIG instances only; its live instances
    (from the device) are not added here: the ledger adds what it has booked,
    and instances it does not know about are the reconciler's business.
    """
    links = tuple(getattr(info, "links", ()))
    if info.mig_enabled:
        mem_total = max((p.memory_mib for p in info.mig_profiles), default=info.memory_mib)
        return GpuView(uuid=info.uuid, index=info.index, name=info.name, mode=MODE_MIG, mem_total=mem_total,
                       cores_total=100, shares_total=max((p.max_instances for p in info.mig_profiles), default=1),
                       numa=info.numa_node, healthy=info.healthy, filtered=filtered,
                       mig_profiles=info.mig_profiles, compute_slices=info.compute_slices,
                       memory_slices=info.memory_slices, links=links, mig_capable=True, dra=dra)
    return GpuView(uuid=info.uuid, index=info.index, name=info.name, mode=MODE_SHIM,
                   mem_total=int(info.memory_mib * memory_scaling), cores_total=int(round(100 * core_scaling)),
                   shares_total=split_count, numa=info.numa_node, healthy=info.healthy, filtered=filtered,
                   mig_profiles=info.mig_profiles, compute_slices=info.compute_slices,
                   memory_slices=info.memory_slices, links=links,
                   mig_capable=bool(info.mig_capable or info.mig_profiles), serves=tuple(serves),
                   mps_missing=mps_missing and SHARE_MPS in serves, dra=dra)


# A GPU's share count in its JSON form (the gossiped capacity document, the ledger's gpus table) is
# written under its old key "slots_total": nodes and ledgers of earlier versions read only that key
# (a rolling upgrade mixes them), and a key they lack fails their whole document. Readers take either
# key, so a later version may write "shares_total" once no earlier reader is left.
SHARES_TOTAL_WRITTEN = "slots_total"
SHARES_TOTAL_KEYS = ("shares_total", "slots_total")


def _shares_total(d: dict) -> int:
    for k in SHARES_TOTAL_KEYS:
        if k in d:
            return int(d[k])
    raise KeyError(f"GPU entry has no share count (deviceSplitCount); expected one of {', '.join(SHARES_TOTAL_KEYS)}")


def gpu_view_to_dict(g: GpuView) -> dict:
    """The capacity part of a view, as plain JSON-able data (no use)."""
    d = {
        "uuid": g.uuid, "index": g.index, "name": g.name, "mode": g.mode, "mem_total": g.mem_total,
        "cores_total": g.cores_total, SHARES_TOTAL_WRITTEN: g.shares_total, "numa": g.numa, "healthy": g.healthy,
        "filtered": g.filtered, "compute_slices": g.compute_slices, "memory_slices": g.memory_slices,
        "mig_profiles": [
            {"name": p.name, "id": p.profile_id, "memory_mib": p.memory_mib, "slices": p.slices,
             "max": p.max_instances, "sms": p.sm_count,
             "placements": [[pl.start, pl.size] for pl in p.placements]}
            for p in g.mig_profiles],
    }
    if g.cordoned:
        d["cordoned"] = True
    if g.mig_capable:
        d["mig_capable"] = True
    if g.links:
        d["links"] = {u: s for u, s in g.links}
    if g.serves != DEFAULT_SERVES and g.mode != MODE_MIG:
        d["serves"] = list(g.serves)
    if g.mps_missing and g.mode != MODE_MIG:
        d["mps_missing"] = True
    if g.dra:  # only where set: a node without DRA GPUs writes what older nodes read
        d["dra"] = True
    return d


def mig_profiles_from_list(items) -> tuple[MigProfile, ...]:
    """A GPU's MIG profile table from its JSON form (``gpu_view_to_dict``'s ``mig_profiles``)."""
    return tuple(
        MigProfile(p["name"], int(p["id"]), int(p["memory_mib"]), int(p["slices"]), int(p["max"]), int(p["sms"]),
                   tuple(MigPlacement(int(a), int(b)) for a, b in p["placements"]))
        for p in items)


def gpu_view_from_dict(d: dict, profiles: tuple[MigProfile, ...] | None = None,
                       use: tuple | None = None) -> GpuView:
    """``profiles``: the GPU's MIG table already parsed (shared by every GPU of a model), else read from ``d``;
    ``use``: (mem, cores, shares, exclusive, MIG instances, MPS shares) to build the view with, else none used.

    Built without the dataclass's ``__init__`` (one dict, no per-field frozen setattr): gossip turns every
    document that changed into a view on the leader, which is this function per GPU."""
    profs = mig_profiles_from_list(d.get("mig_profiles", ())) if profiles is None else profiles
    links = d.get("links")
    new = object.__new__(GpuView)
    new.__dict__.update({
        "uuid": d["uuid"], "index": int(d["index"]), "name": d["name"], "mode": d["mode"],
        "mem_total": int(d["mem_total"]), "cores_total": int(d["cores_total"]), "shares_total": _shares_total(d),
        "numa": d.get("numa"), "healthy": bool(d.get("healthy", True)), "filtered": bool(d.get("filtered", False)),
        "mig_profiles": profs, "compute_slices": int(d.get("compute_slices", 0)),
        "memory_slices": int(d.get("memory_slices", 0)),
        "mem_used": 0, "cores_used": 0, "shares_used": 0, "exclusive": False, "mig_used": (),
        "cordoned": bool(d.get("cordoned", False)), "mig_capable": bool(d.get("mig_capable", False)),
        "links": tuple(sorted((str(u), int(s)) for u, s in links.items())) if links else (),
        "serves": _serves(d.get("serves")), "mps_used": 0, "mps_missing": bool(d.get("mps_missing", False)),
        "dra": _dra(d.get("dra", False))})
    if use is not None:
        u = new.__dict__
        u["mem_used"], u["cores_used"], u["shares_used"], u["exclusive"], u["mig_used"], u["mps_used"] = use
    return new


def _dra(v) -> bool:
    # absent (a document from a node older than the flag): no DRA GPUs
    if type(v) is not bool:
        raise ValueError(f"dra={v!r}: expected true or false")
    return v


def _serves(v) -> tuple[str, ...]:
    if v is None:
        return DEFAULT_SERVES
    if (not isinstance(v, list) or not v or any(m not in (MODE_SHIM, SHARE_MPS) for m in v)
            or len(set(v)) != len(v)):
        raise ValueError(f"serves={v!r}: expected a list of distinct share modes from hami-core, mps")
    return tuple(v)
