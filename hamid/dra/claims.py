"""A ResourceClaim's allocation, as this node's driver must honour it: typed and checked.

Kubelet's prepare call names a claim (namespace, name, UID) and nothing
more; the allocation is read from the claim's ``status.allocation`` as the
scheduler wrote it. Only results of driver ``gpu.hamid.io`` concern hamid;
each must be in this node's pool. The opaque config (from the DeviceClass
and from the claim, in that order, the later winning field by field) of
driver ``gpu.hamid.io`` says the share's priority and compute policy::

    {"apiVersion": "gpu.hamid.io/v1alpha1", "kind": "GpuConfig",
     "priority": 0 | 1, "corePolicy": "default" | "force"}

Anything else there is refused with the accepted forms: a claim whose
config cannot be honoured fails prepare rather than run with other limits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import HamidError
from ..request.model import CONTAINER_POLICIES
from ..request.quantity import quantity
from . import names

MIB = 1 << 20
CONFIG_KEYS = ("apiVersion", "kind", "priority", "corePolicy")


class ClaimError(HamidError):
    """A claim this node cannot prepare as allocated; the message names the bad part."""


@dataclass(frozen=True)
class ShareConfig:
    priority: int | None = None
    core_policy: str | None = None


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of this driver: a device of this node's pool, and what the claim consumes of it."""

    request: str  # the claim's request (``req`` or ``req/subrequest``)
    device: str  # the device's name in the pool
    share_id: str | None
    memory_bytes: int | None  # consumedCapacity, where the device has consumable capacity
    cores: int | None
    config: ShareConfig


@dataclass(frozen=True)
class ClaimAllocation:
    namespace: str
    name: str
    uid: str
    devices: tuple[AllocatedDevice, ...]


def _config(params: Any, where: str) -> dict[str, Any]:
    if not isinstance(params, dict):
        raise ClaimError(f"{where}: expected an object, got {type(params).__name__}")
    if params.get("apiVersion") != names.CONFIG_API_VERSION or params.get("kind") != names.CONFIG_KIND:
        raise ClaimError(f"{where}: apiVersion {params.get('apiVersion')!r}, kind {params.get('kind')!r}; "
                         f"accepted: apiVersion {names.CONFIG_API_VERSION}, kind {names.CONFIG_KIND}")
    bad = sorted(set(params) - set(CONFIG_KEYS))
    if bad:
        raise ClaimError(f"{where}: unknown field {bad[0]!r}; accepted: {', '.join(CONFIG_KEYS)}")
    out: dict[str, Any] = {}
    if "priority" in params:
        p = params["priority"]
        if isinstance(p, bool) or p not in (0, 1):
            raise ClaimError(f"{where}.priority: bad value {p!r}; accepted: 0 (high) or 1 (low)")
        out["priority"] = p
    if "corePolicy" in params:
        c = params["corePolicy"]
        if c not in CONTAINER_POLICIES:
            raise ClaimError(f"{where}.corePolicy: bad value {c!r}; accepted: {', '.join(CONTAINER_POLICIES)}")
        out["core_policy"] = c
    return out


def _configs(allocation: dict[str, Any]) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    """(requests it applies to, empty: all; the settings) for each config of this driver, class first."""
    items = allocation.get("devices", {}).get("config") or []
    if not isinstance(items, list):
        raise ClaimError("status.allocation.devices.config: expected a list")
    ordered = [c for c in items if isinstance(c, dict) and c.get("source") == "FromClass"] + \
              [c for c in items if isinstance(c, dict) and c.get("source") != "FromClass"]
    out = []
    for i, c in enumerate(ordered):
        opaque = c.get("opaque") or {}
        if opaque.get("driver") != names.DRIVER:
            continue
        reqs = c.get("requests") or []
        out.append((tuple(str(r) for r in reqs), _config(opaque.get("parameters"), f"config[{i}].parameters")))
    return out


def _whole(value: Any, what: str) -> int:
    try:
        q = quantity(value)
    except (ValueError, TypeError):
        raise ClaimError(f"{what}: bad quantity {value!r}") from None
    if q < 0 or q.denominator != 1:
        raise ClaimError(f"{what}: expected a whole number >= 0, got {value!r}")
    return int(q)


def _applies(reqs: tuple[str, ...], request: str) -> bool:
    return not reqs or request in reqs or request.split("/", 1)[0] in reqs


def parse_claim(claim: dict[str, Any], *, node: str, uid: str) -> ClaimAllocation:
    """The allocation of ``claim`` for this node's pool (:class:`ClaimError` naming what is wrong)."""
    meta = claim.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    if meta.get("uid") != uid:
        raise ClaimError(f"claim {ns}/{name} has UID {meta.get('uid')!r} at the API server, kubelet asked for "
                         f"{uid!r}: it was deleted and made again")
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, dict):
        raise ClaimError(f"claim {ns}/{name} is not allocated")
    configs = _configs(allocation)
    results = (allocation.get("devices") or {}).get("results") or []
    out = []
    for i, r in enumerate(results):
        if not isinstance(r, dict) or r.get("driver") != names.DRIVER:
            continue
        where = f"claim {ns}/{name} status.allocation.devices.results[{i}]"
        if r.get("pool") != node:
            raise ClaimError(f"{where}: pool {r.get('pool')!r} is not this node's ({node!r})")
        if r.get("adminAccess"):
            raise ClaimError(f"{where}: adminAccess is not supported by {names.DRIVER} (it would bypass the "
                             "ledger's limits)")
        request, device = r.get("request"), r.get("device")
        if not isinstance(request, str) or not isinstance(device, str) or not device:
            raise ClaimError(f"{where}: request and device must be strings")
        consumed = r.get("consumedCapacity") or {}
        if not isinstance(consumed, dict):
            raise ClaimError(f"{where}.consumedCapacity: expected a map of capacity names to quantities")
        mem = _whole(consumed[names.CAP_MEMORY], f"{where}.consumedCapacity.memory") \
            if names.CAP_MEMORY in consumed else None
        cores = _whole(consumed[names.CAP_CORES], f"{where}.consumedCapacity.cores") \
            if names.CAP_CORES in consumed else None
        if cores is not None and cores > 100:
            raise ClaimError(f"{where}.consumedCapacity.cores: {cores} is more than 100 (percent of one GPU)")
        settings: dict[str, Any] = {}
        for reqs, s in configs:
            if _applies(reqs, request):
                settings.update(s)
        share = r.get("shareID")
        out.append(AllocatedDevice(request=request, device=device, share_id=share if isinstance(share, str) else None,
                                   memory_bytes=mem, cores=cores, config=ShareConfig(**settings)))
    return ClaimAllocation(namespace=ns, name=name, uid=uid, devices=tuple(out))
