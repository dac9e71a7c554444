"""``hamid inspect CONTAINER|POD``: what one container or pod was given, and what it uses now.

The reservation comes from the daemon (``GET /v1/reservations``) or, with no
daemon, from the ledger itself. It is found by, in this order: its owner key
(``docker:<id>``, ``pod:<uid>``), a Docker container's name, a pod's
``namespace/name`` or bare name, or a prefix of at least 4 characters of a
container id or pod UID (as ``docker`` takes one). A name or prefix that
matches two reservations is refused, naming them.

For each container it prints the GPUs with memory, cores, MIG profile and
placement; then the container's limits file decoded
(what the shim enforces, whatever the environment says) and its shared
region's live use (memory used and peak, OOM refusals, GPU time, throttling,
processes), both read from the state directory.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from ..errors import HamidError

MIN_PREFIX = 4  # shorter prefixes match too much to be meant


def find(reservations: list[dict], what: str) -> dict:
    """The one reservation ``what`` names (see the module docstring)."""
    tests = (
        lambda r: r["owner"] == what,
        lambda r: r.get("name") == what,
        lambda r: r["kind"] == "pod" and (r.get("name") or "").partition("/")[2] == what,
        lambda r: len(what) >= MIN_PREFIX and r["owner"].partition(":")[2].startswith(what),
    )
    for test in tests:
        hits = [r for r in reservations if test(r)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            names = ", ".join(f"{r['owner']} ({r.get('name') or '-'})" for r in hits)
            raise HamidError(f"{what!r} matches {len(hits)} reservations: {names}; give the owner key or a "
                             "longer prefix")
    known = ", ".join(r.get("name") or r["owner"] for r in reservations) or "none"
    raise HamidError(f"no reservation matches {what!r} (by owner key, name, or id/UID prefix of at least "
                     f"{MIN_PREFIX} characters); reservations on this node: {known}")


def describe(res: dict, state: Path, gpus: Collection[str] | None = None) -> dict[str, Any]:
    """The reservation with each container's limits file and region read from ``state``;
    ``gpus``: the node's GPU UUIDs, to name those it holds that the node does not have."""
    from ..ledger import Reservation
    from ..ledger.report import missing_gpus
    from ..node import layout
    from ..node.realize import slot_name

    r = Reservation.from_dict(res)
    out: dict[str, Any] = {"owner": r.owner, "name": r.name, "kind": r.kind, "state": r.state,
                           "node": r.decision.node, "created": r.created, "containers": [],
                           "missing_gpus": missing_gpus(r, gpus) if gpus is not None else []}
    for c in r.decision.containers:
        if not c.devices:
            continue
        slot = slot_name(r, c.name)
        entry: dict[str, Any] = {"name": c.name, "init": c.init, "slot": slot, "devices": []}
        for d in c.devices:
            dev = d.to_dict()
            dev["mode"] = "mig" if d.mig_profile else "hami-core"
            entry["devices"].append(dev)
        entry["limits_file"] = _limits(layout.limits_file(state, slot))
        entry["region"] = _region(Path(layout.region_dir(state, slot)) / Path(layout.REGION_FILE_IN_CONTAINER).name)
        out["containers"].append(entry)
    return out


def _limits(path: str) -> dict[str, Any]:
    from ..shimlimits.codec import decode

    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except FileNotFoundError:
        return {"path": path, "error": "not written (yet): the shim refuses CUDA until it is"}
    except OSError as e:
        return {"path": path, "error": e.strerror or str(e)}
    if not data:
        return {"path": path, "error": "empty: the shim refuses CUDA until the daemon writes it"}
    try:
        lim = decode(data)
    except HamidError as e:
        return {"path": path, "error": str(e)}
    return {"path": path, "region_path": lim.region_path, "priority": lim.priority, "sm_mode": lim.sm_mode,
            "sm_policy": lim.sm_policy,
            "sm_period_us": lim.sm_period_us,
            "devices": [{"uuid": d.uuid, "memory_bytes": d.memory_bytes, "sm_percent": d.sm_percent,
                         "slots": [list(s) for s in d.slots]} for d in lim.devices]}


def _region(path: Path) -> dict[str, Any]:
    from ..shimregion.reader import RegionError, read_region

    if not path.exists():
        return {"path": str(path), "error": "no region yet: no CUDA process has started in the container"}
    try:
        snap = read_region(path)
    except RegionError as e:
        return {"path": str(path), "error": str(e)}
    return {"path": str(path), "processes": [p.pid for p in snap.processes],
            "devices": [{"index": d.index, "uuid": d.uuid, "limit_bytes": d.limit_bytes, "used_bytes": d.used_bytes,
                         "peak_used_bytes": d.peak_used_bytes, "oom_count": d.oom_count,
                         "sm_limit_percent": d.sm_limit_percent, "gpu_time_ns": d.gpu_time_ns,
                         "throttle_ns": d.throttle_ns, "launches": d.launches} for d in snap.devices]}


def _mib(b: int) -> str:
    return f"{b >> 20} MiB" if b else "unlimited"


def render(doc: dict[str, Any]) -> str:
    state = doc["state"]
    if doc.get("missing_gpus"):
        state += (f" (holds {', '.join(doc['missing_gpus'])}, not on this node: its share counts on none of the "
                  "node's GPUs)")
    lines = [f"{doc['kind']} {doc['name'] or '-'}  ({doc['owner']})", f"  state: {state}  node: {doc['node']}"]
    for c in doc["containers"]:
        lines.append(f"  container {c['name']}{' (init)' if c['init'] else ''}:")
        for d in c["devices"]:
            if d["mig_profile"]:
                p = d["mig_placement"]
                what = f"MIG {d['mig_profile']} at {p['start']}:{p['size']}"
            else:
                what = f"{d['mem_mib']} MiB, {d['cores']}% cores"
            lines.append(f"    GPU {d['index']} {d['uuid']}  {d['mode']}: {what}")
        lim = c["limits_file"]
        if "error" in lim:
            lines.append(f"    limits file {lim['path']}: {lim['error']}")
        else:
            lines.append(f"    limits file {lim['path']} (the shim enforces it; priority "
                         f"{'-' if lim['priority'] is None else lim['priority']}, compute {lim['sm_mode']}, "
                         f"policy {lim['sm_policy']}):")
            for d in lim["devices"]:
                slots = " ".join(f"{a}-{b}%" for a, b in d["slots"]) or "-"
                lines.append(f"      {d['uuid']}  memory {_mib(d['memory_bytes'])}, compute "
                             f"{d['sm_percent'] or 'unlimited'}{'%' if d['sm_percent'] else ''}, slots {slots}")
        reg = c["region"]
        if "error" in reg:
            lines.append(f"    region: {reg['error']}")
        else:
            lines.append(f"    region {reg['path']}: {len(reg['processes'])} process(es)")
            for d in reg["devices"]:
                lines.append(f"      GPU {d['index']}: used {d['used_bytes'] >> 20} MiB (peak "
                             f"{d['peak_used_bytes'] >> 20}) of {_mib(d['limit_bytes'])}, {d['oom_count']} refused "
                             f"allocations, GPU time {d['gpu_time_ns'] / 1e9:.1f} s, throttled "
                             f"{d['throttle_ns'] / 1e9:.1f} s")
    return "\n".join(lines)
