"""A Docker container's OCI bundle made ready for runc: admitted, edited, or left alone.

One function, :func:`prepare_bundle`, serves both ways a create reaches hamid:
the daemon's Docker face (``POST /v1/create`` on ``docker.sock``, called by
the compiled ``hamid-runtime``) and the Python runtime
(``hamid-runtime-py``, the fallback where no daemon answers). Steps: read
``config.json``; a container that sets neither ``HAMI_*`` variable is left
alone; otherwise admit it (``admit``: the node core, here or in the daemon),
refuse it if any path the edits mount over is a symbolic link in its rootfs,
write the edits and the poststop hook, save atomically; release the
admission if anything fails. Nothing is written into the container's rootfs.
Imports stay light: the Python runtime starts on every container create.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import HamidError
from ..node.released import check_id
from ..request.docker import ENV_PREFIXES
from . import rootfs
from . import spec as ocispec
from .names import docker_name


# admit(container id, its HAMI_* env, (uid, gid), details) -> {"ours": bool, "reservation": ..., "edits": ...}
Admit = Callable[[str, list, tuple, dict], dict]


def prepare_bundle(bundle: str, cid: str, *, runc_root: str, hook: str, state_dir: str, admit: Admit,
                   release: Callable[[str], object]) -> bool:
    """Edit the bundle for hamid; False when the container asks nothing of it."""
    spec = ocispec.load(bundle)
    env = [e for e in ocispec.env_list(spec) if e.startswith(ENV_PREFIXES)]
    if not env:
        return False  # not ours: runc gets the spec untouched
    check_id(cid)
    details = {"id": cid, "runc_root": runc_root, "bundle": bundle}
    name = docker_name(spec, cid)
    if name:
        details["name"] = name  # `docker run --name`, for display
    try:
        got = admit(cid, env, ocispec.user(spec), details)
    except HamidError as e:
        from ..node.service import LedgerConflict
        from ..request.docker import whole_card_note

        note = whole_card_note(env) if isinstance(e, LedgerConflict) else None
        if note and isinstance(e, LedgerConflict):  # "no room" for a container that asked no memory: say why it wanted a whole card
            raise LedgerConflict(f"{e}\n{note}", e.reasons) from None
        raise
    if not got.get("ours"):
        return False
    try:
        (edits,) = got["edits"].values()  # CDI containerEdits, as a dict
        root = ocispec.rootfs(spec, bundle)
        for m in edits.get("mounts") or ():
            rootfs.check_path(root, m["containerPath"])
        ocispec.apply_edits(spec, edits)
        ocispec.add_poststop(spec, hook, ["hamid-runtime", "--state-dir", state_dir, "hook", "poststop", cid])
        ocispec.save(bundle, spec)
    except BaseException as e:
        try:
            release(got["reservation"]["owner"])
        except Exception as err:  # keep the first error; reconciliation releases it later
            raise HamidError(f"{e} (and its rollback failed: {err})") from e
        raise
    return True
