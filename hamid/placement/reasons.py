"""Why a request does not fit, as values.

A :class:`Reason` is the placement engine's answer for one GPU or one node:
its ``kind`` (one of :data:`KINDS`), the GPU it is about, what was asked and
what is free, and whatever detail names the rest. It *is* its sentence (a
``str`` subclass), so the CLI, the extender's FailedNodes and Events print it
as they always did, while the code that aggregates reasons (kube-scheduler's
"0/N nodes are available" summary in :mod:`hamid.scheduling.fitsummary`) reads the
fields and never the words: rewording a sentence cannot change a summary.
"""

from __future__ import annotations

KINDS = (
    "mem",        # not enough memory on a GPU (gpu, asked MiB, free MiB), or on enough GPUs (asked, free: most free)
    "cores",      # not enough cores on a GPU (gpu, asked %, free %)
    "nocores",    # a GPU with every core reserved, for a request of no cores
    "shares",     # no free share: all of a GPU's deviceSplitCount in use (on a GPU, or on enough GPUs);
                  # HAMi's CardTimeSlicingExhausted
    "exclusive",  # a GPU held exclusively
    "idle",       # an idle GPU is needed (exclusive use, the mutex policy)
    "unhealthy", "cordoned", "filtered",
    "dra",        # the GPU serves DRA (draDevices) and the request does not name it
    "devices",    # not among the GPUs the request names (asked: the list)
    "usetype", "nousetype", "useuuid", "nouseuuid",  # the type and UUID selectors (asked: what they say)
    "notmig",     # a MIG request on a GPU not in MIG mode (what: "mode" when it can be put in MIG mode, else
                  # "hardware")
    "mig",        # a hami-core or MPS request on a GPU in MIG mode (asked: the mode)
    "serves",     # the GPU does not serve the share mode asked (asked: the mode) under operatingMode/deviceModes
    "onemode",    # the GPU's tenants use the other share mode (asked: the mode, what: theirs)
    "mpsmissing", # the GPU is set to serve mps but its node lacks NVIDIA's MPS programs (what: how to get them,
                  # said once per refusal by NoFit.message)
    "migcreate",  # too few GPUs that can still create the profile (asked: count, free: how many can, what)
    "migprofile", # the GPU has no such profile (what)
    "migsize",    # no profile holds the memory (asked MiB)
    "migplace",   # no free placement
    "count",      # fewer GPUs fit than asked (asked, free: how many fit)
    "quota",      # the pod's namespace GPU quota (asked: the pod's total, free: what the quota leaves, what: the
                  # namespace, the ResourceQuota and the resource); HAMi's ResourceQuotaNotFit
)


# A refusal's headline says which of three things it is: room that frees as tenants leave, a setting of
# this node that leaves the request out, or what the node's GPUs cannot do whatever is set.
NO_ROOM = "no room for this container"
NOT_CONFIGURED = "not configured on this node for this container"
NOT_POSSIBLE = "not possible on this node"
_CONFIGURED = {"serves", "mpsmissing", "filtered", "cordoned", "mig", "dra"}
_IMPOSSIBLE = {"unhealthy", "devices", "usetype", "nousetype", "useuuid", "nouseuuid", "migprofile", "migsize"}


def refusal_headline(reasons) -> str:
    """The headline of a refusal whose per-GPU reasons are ``reasons``: "no
    room" when any GPU lacks only room (or a reason is not a :class:`Reason`),
    else "not configured" when a setting of the node leaves a GPU out, else
    "not possible on this node"."""
    configured = seen = False
    for r in reasons:
        kind = getattr(r, "kind", None)
        if kind == "count":  # "needs 2 GPU(s), 1 fit": a sum of the GPUs' own reasons
            continue
        seen = True
        if kind == "notmig":
            kind = "mig" if r.what == "mode" else "migprofile"
        if kind in _CONFIGURED:
            configured = True
        elif kind not in _IMPOSSIBLE:
            return NO_ROOM
    if not seen:
        return NO_ROOM
    return NOT_CONFIGURED if configured else NOT_POSSIBLE


class Reason(str):
    """One reason, as its sentence with its fields beside it."""

    kind: str
    gpu: int | None
    asked: int | str | None
    free: int | None
    what: str | None
    container: str | None

    def __new__(cls, kind: str, text: str, *, gpu: int | None = None, asked: int | str | None = None,
                free: int | None = None, what: str | None = None, container: str | None = None) -> "Reason":
        if kind not in KINDS:
            raise ValueError(f"reason kind {kind!r}; known: {', '.join(KINDS)}")
        self = super().__new__(cls, text)
        self.kind, self.gpu, self.asked, self.free, self.what = kind, gpu, asked, free, what
        self.container = container
        return self

    def fields(self) -> dict:
        return {"gpu": self.gpu, "asked": self.asked, "free": self.free, "what": self.what,
                "container": self.container}

    def __reduce__(self):  # pickled (worker threads and processes) with its fields
        return (_rebuild, (self.kind, str(self), self.fields()))


def _rebuild(kind, text, fields) -> Reason:
    return Reason(kind, text, **fields)


def in_container(reason: str, container: str) -> str:
    """``reason`` said of one container of a request with several ("container NAME: ..."),
    keeping its fields when it is a :class:`Reason`."""
    text = f"container {container}: {reason}"
    if isinstance(reason, Reason):
        return Reason(reason.kind, text, **{**reason.fields(), "container": container})
    return text
