"""``create`` in Python: the fallback of the compiled client, and the runtime where it is absent.

One call to the node (the daemon's local API, or the node core itself when
no daemon answers) admits the container and returns its edits;
:func:`hamid.docker.bundle.prepare_bundle` writes them into ``config.json``.
"""

from __future__ import annotations

import os
import sys

from ..docker.bundle import prepare_bundle
from ..errors import HamidError
from .access import NodeAccess
from .argv import Invocation


def _hook_path() -> str:
    """The sh launcher beside this Python runtime: it runs the poststop hook."""
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    launcher = os.path.join(here, "hamid-runtime")
    if os.access(launcher, os.X_OK):
        return launcher
    import shutil

    found = shutil.which("hamid-runtime")
    if not found:
        raise HamidError("cannot find the hamid-runtime launcher for the poststop hook")
    return os.path.abspath(found)


def prepare(inv: Invocation) -> None:
    bundle, cid = inv.bundle_and_id()
    bundle = bundle or os.getcwd()
    if not cid:
        raise HamidError("create: no container id on the command line")
    node = NodeAccess(inv.state_dir)
    try:
        prepare_bundle(bundle, cid, runc_root=inv.root, hook=_hook_path(), state_dir=str(inv.state_dir),
                       admit=node.admit_container, release=node.release)
    finally:
        node.close()
