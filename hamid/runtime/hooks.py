"""OCI hooks runc runs for our containers (Python side).

The sh launcher handles ``hook poststop ID`` itself (it only drops a marker,
see :mod:`.released`); this module is the same hook for a runtime started
without the launcher, and accepts the id from runc's state on stdin too.
"""

from __future__ import annotations

import json
import sys

from ..errors import HamidError
from .argv import Invocation
from ..node.released import mark


def _container_id(inv: Invocation) -> str:
    args = inv.verb_args()
    if len(args) >= 2:
        return args[1]
    try:
        return json.load(sys.stdin)["id"]  # the OCI state runc passes to hooks
    except (ValueError, KeyError, TypeError):
        raise HamidError("poststop: no container id in the arguments or the state on stdin") from None


def run_hook(inv: Invocation) -> int:
    args = inv.verb_args()
    if not args or args[0] != "poststop":
        raise HamidError(f"hook: unknown hook {args[:1]}; accepted: poststop")
    mark(inv.state_dir, _container_id(inv))
    return 0
