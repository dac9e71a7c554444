"""Replays the live passes a GPU run recorded through the current code's LivePass, on this machine (no GPU).

limits_bench.py records what each pass of the daemon's live pass saw (NVML's busy share and busy pids, each
tenant's host pids and region charge): replaying them through hamid.shimlimits.live as it is now answers how
a change to the pass would have judged the same GPU readings, e.g. how many honest tenants' regions it would
count untrusted (hamid_vgpu_region_untrusted_total).

  python3 bench/gpu/replay_passes.py RESULT.json [...]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hamid.shimlimits import ContainerLimits, DeviceLimits, write_limits_file  # noqa: E402
from hamid.shimlimits.live import GpuReading, LivePass, Tenant  # noqa: E402

GPU = "GPU-replay"


def recorded_passes(doc) -> list[dict]:
    """Every recorded pass in a result document (with host pids: runs since 2026-11-29), once each, in time
    order. Passes recorded before they said which tenants had a compute limit ("limited") get it from their
    case: the priority cases' tenants have none, every other case's have one."""
    found: dict[float, dict] = {}

    def walk(o, case):
        if isinstance(o, dict):
            for k, v in o.items():
                if k == "passes" and isinstance(v, list):
                    for p in v:
                        if isinstance(p, dict) and "charged" in p and "pids" in p:
                            p.setdefault("limited", [not case.startswith("priority")] * len(p["charged"]))
                            found[p["t"]] = p
                else:
                    walk(v, case or str(k))
        elif isinstance(o, list):
            for v in o:
                walk(v, case)
    walk(doc, "")
    return [found[t] for t in sorted(found)]


def recorded_limits(doc) -> dict[int, tuple[int, str]]:
    """Each file-mode run's host pid -> (its compute limit, its policy): the policy the call ran with
    ("policy" in the document, default before it was recorded), force for the GEMM held alone as the isolation
    case's reference."""
    found: dict[int, tuple[int, str]] = {}
    forced = {r["run"]["pid"] for r in (doc.get("iso_reference") or {}).values() if "run" in r}

    def walk(o):
        if isinstance(o, dict):
            if o.get("mode") == "file" and isinstance(o.get("pid"), int) and o.get("limit") is not None:
                pol = "force" if o["pid"] in forced else doc.get("policy", "default")
                found.setdefault(o["pid"], (int(o["limit"]), pol))
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
    walk(doc)
    return found


def replay(passes: list[dict], files: Path, limits: dict[int, tuple[int, str]] | None = None) -> LivePass:
    """The passes through a LivePass of the current code; ``limits`` (recorded_limits) gives each tenant, by its
    first host pid, its limit and policy (else 30 %, default)."""
    live = LivePass()
    limits = limits or {}
    of: dict[str, tuple[int, str]] = {}
    for p in passes:
        tenants = []
        # all in the pass's tenant order
        for (name, pids), charged, limited in zip(p["pids"].items(), p["charged"], p["limited"]):
            if name not in of and pids:
                of[name] = limits.get(pids[0], (30, "default"))
            lim, pol = of.get(name, (30, "default"))
            f = files / f"{name}.limits"
            if not f.exists():
                write_limits_file(f, ContainerLimits(devices=(DeviceLimits(GPU, sm_percent=lim),), region_path="/r",
                                                     sm_policy=pol))
            tenants.append(Tenant(str(f), 0, 1, tuple(pids), charged, charged=limited, limit_pct=lim if limited else 0,
                                  policy=pol))
        reading = GpuReading(p["busy"], None if p["busy_pids"] is None else frozenset(p["busy_pids"]))
        live.run(p["t"], {GPU: (reading, tenants)}, wall=p["t"])
    return live


def main() -> None:
    for arg in sys.argv[1:]:
        passes = recorded_passes(json.loads(Path(arg).read_text()))
        if not passes:
            print(f"{arg}: no recorded passes")
            continue
        doc = json.loads(Path(arg).read_text())
        live = replay(passes, Path(tempfile.mkdtemp(prefix="replay-")), recorded_limits(doc))
        print(f"{arg}: {len(passes)} passes; untrusted now {dict(live.untrusted)}, "
              f"when run {passes[-1].get('untrusted')}; unaccounted now {dict(live.unaccounted)}")


if __name__ == "__main__":
    main()
