"""The what-if box: pasted text in, ``hamid plan``'s answer on the live view out.

Accepted text (what a user has at hand):

- Kubernetes Pods and Docker entries as YAML (``kind: Pod`` /
  ``kind: Docker``, several documents allowed): the workload file of
  ``hamid plan``;
- a Docker container's variables, one ``NAME=value`` a line
  (``HAMI_VGPU_SPEC=mem=4g,cores=30``, ``HAMI_VISIBLE_DEVICES=0``);
- a bare ``HAMI_VGPU_SPEC`` value (``mem=20g,cores=30``).

It is placed with :func:`hamid.cluster.plan.plan` on the same nodes
``hamid plan --live`` uses (every alive or suspect member of the gossiped
view, with this daemon's node settings), so the two agree by construction;
the answer is plan's JSON (per item: the node and GPUs, or every node's
reasons, and each node's GPUs with their scores or why they cannot take it).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from ..errors import HamidError

MAX_TEXT = 64 * 1024  # a pod manifest is a few KiB; this bounds what a click can make the daemon parse
MAX_ITEMS = 20  # the box is for a few what-ifs, not a batch plan
_ENV_LINE = re.compile(r"^(HAMI_[A-Z_]+)=(.*)$", re.ASCII)


class WhatIfError(HamidError):
    """The pasted text is none of the accepted forms."""


FORMS = ("a Pod or Docker entry as YAML (kind: Pod | kind: Docker), HAMI_* variables one NAME=value a line, "
         "or a bare HAMI_VGPU_SPEC value such as mem=20g,cores=30")


def workload(text: str) -> list[dict]:
    """The pasted text as ``hamid plan`` workload items."""
    if len(text.encode()) > MAX_TEXT:
        raise WhatIfError(f"the text is over {MAX_TEXT} bytes")
    text = text.strip()
    if not text:
        raise WhatIfError(f"nothing to place: paste {FORMS}")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    env = [m for m in (_ENV_LINE.match(ln) for ln in lines) if m]
    if len(env) == len(lines):
        return [{"kind": "Docker", "name": "what-if", "env": {m.group(1): m.group(2) for m in env}}]
    if len(lines) == 1 and ":" not in lines[0]:
        return [{"kind": "Docker", "name": "what-if", "env": {"HAMI_VGPU_SPEC": lines[0]}}]
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        raise WhatIfError(f"not valid YAML ({str(e).splitlines()[0]}); paste {FORMS}") from None
    if not docs:
        raise WhatIfError(f"nothing to place: paste {FORMS}")
    if len(docs) > MAX_ITEMS:
        raise WhatIfError(f"{len(docs)} documents; at most {MAX_ITEMS} at a time")
    for i, d in enumerate(docs):
        if not isinstance(d, dict) or d.get("kind") not in ("Pod", "Docker"):
            got = d.get("kind") if isinstance(d, dict) else type(d).__name__
            raise WhatIfError(f"document {i + 1}: kind {got!r}; accepted: Pod, Docker ({FORMS})")
    return docs


def answer(text: str, views: list, settings) -> list[dict[str, Any]]:
    """Plan the pasted items on ``views`` (NodeViews of the live members) with
    this node's ``settings``, as ``hamid plan --live`` does. Blocking (CPU)."""
    from ..cluster.plan import plan
    from ..cluster.report import LiveNode

    items = workload(text)
    if not views:
        raise WhatIfError("the live view has no member with capacity yet")
    return plan([LiveNode(v, settings) for v in views], items, source="the live view")
