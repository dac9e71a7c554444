"""``create``: turn a container's request into a reservation and a spec.

Steps, each undone in reverse if a later one fails: reserve on the node,
create MIG instances, make the container's region directory, rewrite
``config.json``. Nothing is written into the container's rootfs.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from ..errors import HamidError
from ..request import parse_docker_env
from . import devnodes, rootfs, spec as ocispec
from .argv import Invocation
from .layout import CONTAINERS_DIR as CONTAINERS
from .layout import PRELOAD_IN_CONTAINER as PRELOAD
from .layout import REGION_DIR_IN_CONTAINER as REGION_DIR
from .layout import REGION_FILE_IN_CONTAINER as REGION_FILE
from .layout import SHIM_IN_CONTAINER as SHIM
from .node import NodeAccess
from .released import check_id


def _hook_path() -> str:
    """The sh launcher beside this Python runtime: it runs the poststop hook."""
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    launcher = os.path.join(here, "hamid-runtime")
    if os.access(launcher, os.X_OK):
        return launcher
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
        request = parse_docker_env(env, cid, node.defaults())
        if request is None:
            return
        _apply(inv, node, request, spec, bundle, cid)
    finally:
        node.close()


def _apply(inv: Invocation, node: NodeAccess, request, spec: dict, bundle: str, cid: str) -> None:
    meta = node.meta()
    root = ocispec.rootfs(spec, bundle)
    wants_mig = request.containers[0].gpu.wants_mig
    shim = meta.get("shim") or {}
    if not wants_mig:
        if not shim.get("library"):
            raise HamidError("the shim is not installed on this node (the daemon found no libvgpu.so to "
                             "install); memory and compute limits cannot be enforced, so the container is refused")
        for path in (PRELOAD, SHIM, REGION_DIR):
            rootfs.check_path(root, path)

    undo: list = []
    try:
        details = {"id": cid, "runc_root": inv.root, "bundle": bundle}
        res = node.reserve(request, details)
        owner = res["owner"]
        undo.append(lambda: node.release(owner))
        devices = res["decision"]["containers"][0]["devices"]
        minors = meta.get("gpu_minors") or {}
        dev_root = meta.get("dev_root", "/dev")
        caps_root = meta.get("caps_root", "/proc/driver/nvidia/capabilities")
        real = meta["devices"]["kind"] == "nvml"
        nodes: list[devnodes.Node] = []
        env: dict[str, str] = {}
        visible: list[str] = []
        if wants_mig:
            backend = node.backend()
            undo.append(backend.close)
            from ..devices.types import MigPlacement

            for d in devices:
                pl = d["mig_placement"]
                inst = backend.create_mig_instance(d["uuid"], d["mig_profile"], MigPlacement(pl["start"], pl["size"]))
                undo.append(lambda u=d["uuid"], gi=inst.gi_id: backend.destroy_mig_instance(u, gi))
                node.update(owner, mig={d["uuid"]: {"gi": inst.gi_id, "ci": inst.ci_id, "uuid": inst.uuid}})
                visible.append(inst.uuid)
                minor = minors.get(d["uuid"])
                if minor is not None:
                    nodes += devnodes.gpu_nodes(dev_root, [minor], required=real)
                    nodes += devnodes.mig_cap_nodes(dev_root, caps_root, minor, inst.gi_id, inst.ci_id, required=real)
        else:
            gpu_minors = [minors[d["uuid"]] for d in devices if d["uuid"] in minors]
            nodes += devnodes.gpu_nodes(dev_root, gpu_minors, required=real)
            visible = [d["uuid"] for d in devices]
            cname = res["decision"]["containers"][0]["name"]
            slots = res.get("details", {}).get("slots", {}).get(cname, {})
            for i, d in enumerate(devices):
                env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{d['mem_mib']}m"
                if 0 < d["cores"] < 100:
                    env[f"CUDA_DEVICE_SM_LIMIT_{i}"] = str(d["cores"])
                    if d["uuid"] in slots:
                        # the GPU time slots the ledger gave this share (hamid/placement/timeslots.py)
                        env[f"HAMID_SM_SLOTS_{i}"] = ",".join(f"{a}-{b}" for a, b in slots[d["uuid"]])
            if devices and 0 < devices[0]["cores"] < 100:
                env["CUDA_DEVICE_SM_LIMIT"] = str(devices[0]["cores"])
            env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = REGION_FILE
            prio = request.containers[0].gpu.priority
            if prio is not None:
                env["CUDA_TASK_PRIORITY"] = str(prio)
            cdir = Path(inv.state_dir) / CONTAINERS / cid
            cdir.mkdir(parents=True, mode=0o700, exist_ok=True)
            undo.append(lambda: shutil.rmtree(cdir, ignore_errors=True))
            uid, gid = ocispec.user(spec)
            os.chown(cdir, uid, gid)
            ocispec.add_mount(spec, SHIM, shim["library"], readonly=True)
            ocispec.add_mount(spec, PRELOAD, shim["preload"], readonly=True)
            ocispec.add_mount(spec, REGION_DIR, str(cdir), readonly=False)
            node.update(owner, details={"region_dir": str(cdir)})
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(visible)
        env["HAMI_RESERVATION"] = owner
        ocispec.set_env(spec, env)
        ocispec.add_devices(spec, nodes)
        ocispec.add_poststop(spec, _hook_path(), ["hamid-runtime", "--state-dir", str(inv.state_dir),
                                                  "hook", "poststop", cid])
        ocispec.save(bundle, spec)
    except BaseException:
        for step in reversed(undo):
            try:
                step()
            except Exception as e:  # keep undoing; report the first error
                print(f"hamid-runtime: rollback step failed: {e}", file=sys.stderr)
        raise
