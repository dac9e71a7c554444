"""kube-scheduler's ``0/N nodes are available: ...`` message for a pod no node takes, as a pure function.

:func:`summarize` counts each distinct reason over the nodes (the ``"<count>
<reason>"`` strings sorted bytewise as ``FitError.Error`` sorts them), with
the placement engine's per-GPU reasons folded into reasons of the same
style ("3 GPU memory (4096 MiB requested, at most 2048 free on any GPU)").
"""

from __future__ import annotations

from collections.abc import Iterable

from ..placement.reasons import Reason
from .kubefit import PREFILTER_REJECTIONS


# The placement engine's per-GPU reasons (hamid/placement), folded into one reason per kind and node.
# Each pattern gives a kind, the requested amount where there is one (the key: a pod's containers may
# ask different amounts) and the amount free (its largest over the nodes is shown).
def _gpu_reason(kind: str, req: str | None, free: int | None, what: str | None) -> str:
    if kind == "mem":
        return f"GPU memory ({req} MiB requested, at most {max(free, 0)} free on any GPU)"
    if kind == "cores":
        return f"GPU cores ({req}% requested, at most {max(free, 0)}% free on any GPU)"
    return {
        "nocores": "GPU cores (none left on any GPU)",
        "shares": "GPU shares (all in use: deviceSplitCount)",
        "exclusive": "GPU held exclusively (cores=100)",
        "idle": "GPU in use (an idle GPU is needed)",
        "unhealthy": "GPU unhealthy",
        "cordoned": "GPU cordoned (hami.io/device-cordon)",
        "filtered": "GPU excluded by filterDevices",
        "dra": "GPU serves DRA (draDevices)",
        "devices": f"GPU not among the requested devices {req}",
        "usetype": f"GPU type (not use-gputype {req})",
        "nousetype": f"GPU type (nouse-gputype {req})",
        "useuuid": "GPU not in use-gpuuuid",
        "nouseuuid": "GPU in nouse-gpuuuid",
        "notmig": "GPU mode (MIG requested, GPU not in MIG mode)",
        "mig": f"GPU mode ({req} requested, GPU in MIG mode)",
        "serves": f"GPU mode ({req} not served: set operatingMode or deviceModes to {req} or any)",
        "onemode": f"GPU mode ({req} requested, GPU busy with {what} tenants)",
        "mpsmissing": "GPU mode (mps: the node lacks NVIDIA's MPS programs, nvidia-cuda-mps-control)",
        "migcreate": f"GPU MIG ({what} on {req} GPU(s) requested, at most {free} can create it)",
        "migprofile": f"GPU MIG (no profile {what})",
        "migsize": f"GPU MIG (no profile holds {req} MiB)",
        "migplace": "GPU MIG (no free placement)",
        "count": f"GPU count ({req} requested, at most {free} fit on any node)",
        "quota": f"GPU quota of the namespace ({what}; the pod adds {req}, at most {free} left)",
    }[kind]


def _node_reasons(reasons: Iterable[str]) -> dict[tuple, int | None]:
    """One node's reasons as keys (a plain reason, or a GPU kind with its request) and the amount free
    where the kind has one (the largest on the node). The placement engine's reasons are values
    (:class:`hamid.placement.reasons.Reason`): their kind and numbers are read, never their words. A
    plain string is kube-scheduler's own reason or the placer's ("no hamid daemon publishes this
    node's GPUs"), counted as it is."""
    out: dict[tuple, int | None] = {}
    gpu_kinds: set[str] = set()
    for r in reasons:
        if not isinstance(r, Reason):
            out[("plain", r)] = None
            continue
        asked = None if r.asked is None else str(r.asked)
        free = r.free if r.kind in _HAS_FREE else None
        key = ("gpu", r.kind, asked if r.kind in _HAS_ASKED else None, r.what if r.kind in _HAS_WHAT else None)
        if key in out and free is not None:
            free = max(free, out[key])  # type: ignore[arg-type]
        out[key] = free
        gpu_kinds.add(r.kind)
    if gpu_kinds - {"count"}:  # "needs 1 GPU(s), 0 fit" only repeats what the per-GPU reasons say
        for key in [k for k in out if k[0] == "gpu" and k[1] == "count" and k[2] == "1"]:
            del out[key]
    return out


# which fields of a kind the summary shows (and so tells reasons apart by)
_HAS_ASKED = {"mem", "cores", "devices", "usetype", "nousetype", "migcreate", "migsize", "count", "mig", "serves",
              "onemode", "quota"}
_HAS_FREE = {"mem", "cores", "migcreate", "count", "quota"}
_HAS_WHAT = {"migcreate", "migprofile", "onemode", "quota"}


def summarize(reasons_by_node: dict[str, list[str]], total: int) -> str:
    """kube-scheduler's message for a pod no node takes: ``0/5 nodes are available: 2 node(s) had
    untolerated taint {gpu: no}, 3 GPU memory (4096 MiB requested, at most 2048 free on any GPU).``

    Each distinct reason is counted once per node that gives it; the
    ``"<count> <reason>"`` parts are sorted as strings (``sort.Strings``, as
    ``FitError.Error`` does, so "10 ..." sorts before "2 ..."). The placement
    engine's per-GPU reasons are folded per node into one reason per kind
    (memory, cores, shares, ...) whose numbers are the request and the
    most free on any GPU of the nodes counted. A PreFilter rejection (every
    node) is said once, without a count, as kube-scheduler says it.
    """
    if total == 0:
        return "0/0 nodes are available: no nodes available to schedule pods."
    for why in reasons_by_node.values():
        for r in why:
            if r in PREFILTER_REJECTIONS:
                return f"0/{total} nodes are available: {r}."
    counts: dict[tuple, int] = {}
    free: dict[tuple, int | None] = {}
    for why in reasons_by_node.values():
        for key, f in _node_reasons(why).items():
            counts[key] = counts.get(key, 0) + 1
            if f is not None:
                free[key] = f if free.get(key) is None else max(f, free[key])  # type: ignore[type-var]
    parts = []
    for key, n in counts.items():
        text = key[1] if key[0] == "plain" else _gpu_reason(key[1], key[2], free.get(key), key[3])
        parts.append(f"{n} {text}")
    merged: dict[str, int] = {}
    for p in parts:  # two keys may read the same (e.g. one kind from two containers' prefixes)
        n, _, text = p.partition(" ")
        merged[text] = merged.get(text, 0) + int(n)
    out = sorted(f"{n} {text}" for text, n in merged.items())
    msg = f"0/{total} nodes are available:"
    return f"{msg} {', '.join(out)}." if out else msg
