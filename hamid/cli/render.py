"""Readable tables with bars for ``hamid status`` and ``hamid plan``."""

from __future__ import annotations

BAR = 20


def bar(used: float, total: float, width: int = BAR) -> str:
    frac = 0.0 if total <= 0 else max(0.0, min(1.0, used / total))
    full = int(round(frac * width))
    return "[" + "#" * full + "." * (width - full) + "]"


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    out = ["  ".join(str(h).ljust(w) for h, w in zip(header, widths)).rstrip()]
    for r in rows:
        out.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(out)


def short_owner(key: str) -> str:
    """``docker:<64 hex>`` as ``docker ps`` shows ids (12 characters); other owners whole."""
    kind, _, uid = key.partition(":")
    return f"{kind}:{uid[:12]}" if kind == "docker" else key


def mode_cell(g: dict) -> str:
    """A GPU's MODE column: ``mig``, or the share modes it serves (``hami-core|mps``),
    with the one its tenants use now in brackets when it serves several."""
    serves = g.get("serves") or []
    if g["mode"] == "mig" or not serves:
        return g["mode"]
    text = "|".join(serves)
    if len(serves) > 1 and g.get("share_mode"):
        text += f" [{g['share_mode']}]"
    return text


def status_table(doc: dict) -> str:
    lines = [f"node {doc['node']}  devices: {doc['backend']}  reservations: {len(doc['reservations'])}", ""]
    rows = []
    unaccounted = set(doc.get("unaccounted_gpus") or ())
    held = {(h["owner"], h["container"], h["gpu"]): h["reason"] for h in doc.get("compute_held") or ()}
    for g in doc["gpus"]:
        flags = []
        if g["uuid"] in unaccounted:
            flags.append("UNACCOUNTED")  # its sharing tenants charged far less than it ran (hamid_vgpu_unaccounted_passes_total)
        if g["filtered"]:
            flags.append("filtered")
        if not g["healthy"]:
            flags.append("UNHEALTHY")
        if g["exclusive"]:
            flags.append("exclusive")
        if g.get("mps_missing"):
            flags.append("NO-MPS-PROGRAMS")
        if g.get("dra"):
            flags.append("dra")  # served through DRA (draDevices): not the device plugin's
        if g["mode"] == "mig":
            mem = f"{bar(g['mig_slices_used'], g['mig_slices_total'])} {g['mig_slices_used']}/{g['mig_slices_total']} slices"
            cores = ", ".join(f"{m['profile']}@{m['start']}" for m in g["mig_instances"]) or "-"
        else:
            mem = f"{bar(g['memory_used_mib'], g['memory_total_mib'])} {g['memory_used_mib']}/{g['memory_total_mib']} MiB"
            cores = f"{bar(g['cores_used'], g['cores_total'], 10)} {g['cores_used']}/{g['cores_total']}%"
        rows.append([str(g["index"]), g["name"], mode_cell(g), mem, cores,
                     f"{g['shares_used']}/{g['shares_total']}", " ".join(flags)])
    lines.append(table(rows, ["GPU", "MODEL", "MODE", "MEMORY", "CORES / MIG", "SHARES", ""]))
    if doc.get("mps_missing"):
        lines += ["", f"MPS shares refused here: {doc['mps_missing']}"]
    if doc["reservations"]:
        lines.append("")
        rrows = []
        for r in doc["reservations"]:
            for c in r["decision"]["containers"]:
                for d in c["devices"]:
                    what = (f"{d['mig_profile']} @ {d['mig_placement']['start']}:{d['mig_placement']['size']}"
                            if d.get("mig_profile") else
                            f"mps: {d['mem_mib']} MiB pinned, {d['cores'] or 100}% threads" if d.get("mps") else
                            f"{d['mem_mib']} MiB, {d['cores']}% cores")
                    state = r["state"]
                    if d["uuid"] in (r.get("missing_gpus") or ()):
                        state += f" (GPU {d['uuid']} not on this node: counted on none)"
                    why = held.get((r["owner"], c["name"], d["uuid"]))
                    if why:
                        state += f" (HELD to its compute limit from outside: {why})"
                    failed = (r.get("details") or {}).get("mps_failure") if d.get("mps") else None
                    if failed:
                        state += {"client_fault": " (MPS client fault)",
                                  "server_wedged": " (MPS server wedged, killed)"}.get(failed.get("kind"),
                                                                                     " (MPS daemon failed, restarted)")
                    rrows.append([r.get("name") or "-", short_owner(r["owner"]), c["name"], str(d["index"]), what,
                                  state])
        lines.append(table(rrows, ["NAME", "OWNER", "CONTAINER", "GPU", "SHARE", "STATE"]))
    return "\n".join(lines)


def cluster_table(st: dict) -> str:
    counts = ", ".join(f"{n} {s}" for s, n in sorted(st["members_by_state"].items()))
    lines = [f"cluster seen from {st['node']} ({st['addr']}, incarnation {st['incarnation']}, "
             f"health {st['health']}, {'encrypted' if st['encrypted'] else 'NOT encrypted'}): {counts}", ""]
    rows = []
    for m in st["members"]:
        name = m["name"] + (" (this node)" if m["self"] else "")
        if not m["gpus"]:
            rows.append([name, m["state"], str(m["incarnation"]), m["addr"], "-", "-", "-", "-"])
            continue
        first = True
        for g in m["gpus"]:
            mem = f"{bar(g['memory_used_mib'], g['memory_total_mib'], 10)} {g['memory_used_mib']}/{g['memory_total_mib']} MiB"
            cores = f"{g['cores_used']}/{g['cores_total']}%"
            flags = "" if g["healthy"] else " UNHEALTHY"
            flags += " filtered" if g["filtered"] else ""
            flags += " exclusive" if g["exclusive"] else ""
            flags += " dra" if g.get("dra") else ""
            mig = f" mig:{len(g['mig_instances'])}" if g["mode"] == "mig" else ""
            rows.append([name if first else "", m["state"] if first else "", str(m["incarnation"]) if first else "",
                         m["addr"] if first else "", f"{g['index']} {g['name']}{flags}", mem, cores,
                         f"{g['shares_used']}/{g['shares_total']}{mig}"])
            first = False
    lines.append(table(rows, ["MEMBER", "STATE", "INC", "ADDRESS", "GPU", "MEMORY", "CORES", "SHARES"]))
    return "\n".join(lines)
