"""``create``: admit the container through the node, write its edits into the spec.

One call to the node (the daemon, or the node core itself when no daemon
answers) admits the container and returns its edits (:mod:`hamid.node.realize`);
this module only checks that every path the edits mount over is not a
symbolic link in the container's rootfs, applies the edits and the poststop
hook to ``config.json``, and releases the admission if anything fails before
runc is exec'd. Nothing is written into the container's rootfs.
"""

from __future__ import annotations

import os
import sys

from ..errors import HamidError
from ..node.released import check_id
from . import rootfs, spec as ocispec
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
    spec = ocispec.load(bundle)
    env = ocispec.env_list(spec)
    if not any(e.startswith(("HAMI_VISIBLE_DEVICES=", "HAMI_VGPU_SPEC=")) for e in env):
        return  # not ours: runc gets the spec untouched
    check_id(cid)
    node = NodeAccess(inv.state_dir)
    try:
        got = node.admit_container(cid, env, ocispec.user(spec), {"id": cid, "runc_root": inv.root,
                                                                  "bundle": bundle})
        if not got.get("ours"):
            return
        try:
            (edits,) = got["edits"].values()  # CDI containerEdits, as a dict (no dataclasses: start time)
            root = ocispec.rootfs(spec, bundle)
            for m in edits.get("mounts") or ():
                rootfs.check_path(root, m["containerPath"])
            ocispec.apply_edits(spec, edits)
            ocispec.add_poststop(spec, _hook_path(), ["hamid-runtime", "--state-dir", str(inv.state_dir),
                                                      "hook", "poststop", cid])
            ocispec.save(bundle, spec)
        except BaseException:
            try:
                node.release(got["reservation"]["owner"])
            except Exception as e:  # keep the first error; reconciliation releases it later
                print(f"hamid-runtime: rollback failed: {e}", file=sys.stderr)
            raise
    finally:
        node.close()
