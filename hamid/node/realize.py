"""``realize``: from a reservation to what one container gets. A pure function.

Every face delivers the same edits: the Docker runtime writes them into the
bundle's ``config.json``, the device plugin answers ``Allocate`` with them.
The inputs are the reservation (the committed decision, the MIG instances made for it with their capability nodes) and
the node's facts (device nodes, the shim's installed files, the state
directory); nothing here reads the host, so two faces can never disagree
about what a reservation means.

A shim share (hami-core mode) gets: the reserved GPUs' device nodes and the
driver's control nodes; ``NVIDIA_VISIBLE_DEVICES`` with their UUIDs (so an
installed NVIDIA toolkit still injects the driver); the shim and
``/etc/ld.so.preload`` read-only; its limits file read-only (the shim's only
source of limits when present); its own region directory; and HAMi-core's
variables (``CUDA_DEVICE_MEMORY_LIMIT_<i>``, ``CUDA_DEVICE_SM_LIMIT[_<i>]``,
``CUDA_DEVICE_MEMORY_SHARED_CACHE``) for tools that read them. An MPS share
(one GPU) gets the same, without the time-slice variables, plus its GPU's
MPS pipe directory at ``/run/hamid-mps`` and ``CUDA_MPS_PIPE_DIRECTORY``,
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
(informative: the shim sets them from the limits file). A MIG share
gets the parent GPU's node, the instance's two capability nodes and
``NVIDIA_VISIBLE_DEVICES=MIG-<uuid>``.
"""

from __future__ import annotations

from dataclasses import replace
from collections.abc import Sequence
from typing import Any

from ..errors import HamidError
from ..ledger import Reservation
from ..placement.result import ContainerAssignment, DeviceAssignment
from ..request.model import GpuRequest, effective_core_policy
from . import layout, mps
from .edits import ContainerEdits, DeviceNode, Mount
from .facts import NodeFacts

RO = ("rbind", "nosuid", "nodev", "ro")
RW = ("rbind", "nosuid", "nodev", "rw")


class RealizeError(HamidError):
    """A reservation cannot be turned into container edits on this node."""


def container_of(res: Reservation, container: str | None) -> ContainerAssignment:
    """The named container's assignment (the only one when ``container`` is None)."""
    conts = res.decision.containers
    if container is None:
        if len(conts) != 1:
            raise RealizeError(f"{res.owner} has {len(conts)} containers; name one")
        return conts[0]
    for c in conts:
        if c.name == container:
            return c
    names = ", ".join(c.name for c in conts) or "none"
    raise RealizeError(f"{res.owner} has no container {container!r} (it has: {names})")


def gpu_asked(res: Reservation, container: str) -> GpuRequest | None:
    """What ``container`` of ``res`` asked of GPUs, as its request says (None without one)."""
    return res.request.gpu_of(container) if res.request is not None else None


def priority_of(res: Reservation, container: str) -> int | None:
    """The task priority ``container`` asked for (``CUDA_TASK_PRIORITY``), None when it asked none."""
    g = gpu_asked(res, container)
    return g.priority if g is not None else None


def limits_of(res: Reservation, container: str, node_core_policy: str):
    """What ``container``'s limits file says (:class:`hamid.shimlimits.ContainerLimits`): its
    GPUs' memory and compute shares from the decision, its priority and compute policy from its
    request, the node's ``gpuCorePolicy`` where it asked none."""
    from ..shimlimits import ContainerLimits, DeviceLimits

    c = slot_assignment(res, container)
    asked = gpu_asked(res, container)
    # No time slots in the file: slots are not work-conserving (measured on an H200,
    # bench/gpu/results/limits/README.md, issue 22: a launch-bound tenant got 3 % of a 30 % share); the
    # shim's rate limiter holds each container to its share with the policy below.
    return ContainerLimits(
        devices=tuple(DeviceLimits(uuid=d.uuid, memory_bytes=d.mem_mib << 20, sm_percent=d.sm_limit)
                      for d in c.devices),
        region_path=layout.REGION_FILE_IN_CONTAINER, priority=asked.priority if asked else None,
        sm_policy=effective_core_policy(node_core_policy, asked.core_policy if asked else None),  # type: ignore[arg-type]
        mps=any(d.mps for d in c.devices))


def _gpu_node(facts: NodeFacts, uuid: str) -> DeviceNode | None:
    node = facts.gpu_nodes.get(uuid)
    if node is None and facts.real:
        raise RealizeError(f"GPU {uuid} has no device node under {facts.dev_root}: is the NVIDIA driver loaded?")
    return node


def gpu_device_nodes(facts: NodeFacts, uuids: Sequence[str]) -> list[DeviceNode]:
    """The device nodes a shim share of these GPUs gets: theirs, then the driver's control nodes.
    :class:`RealizeError` for a GPU of a real node without one."""
    return _with_control(facts, [n for u in uuids if (n := _gpu_node(facts, u)) is not None])


def shim_files(facts: NodeFacts) -> tuple[str, str]:
    """The installed shim and its preload list; :class:`RealizeError` when the shim is not
    installed: no share is handed out unenforced."""
    if not facts.shim_library or not facts.shim_preload:
        raise RealizeError("the shim is not installed on this node (the daemon found no libvgpu.so to "
                           "install); memory and compute limits cannot be enforced, so the container is refused")
    return facts.shim_library, facts.shim_preload


def shim_mounts(facts: NodeFacts, slot: str) -> list[Mount]:
    """What a shim share mounts: the shim and its preload list, and its slot's region directory
    and limits file (:class:`RealizeError` without a shim)."""
    library, preload = shim_files(facts)
    return [
        Mount(library, layout.SHIM_IN_CONTAINER, RO),
        Mount(preload, layout.PRELOAD_IN_CONTAINER, RO),
        Mount(layout.region_dir(facts.state_dir, slot), layout.REGION_DIR_IN_CONTAINER, RW),
        Mount(layout.limits_file(facts.state_dir, slot), layout.LIMITS_IN_CONTAINER, RO),
    ]


def _with_control(facts: NodeFacts, nodes: list[DeviceNode]) -> list[DeviceNode]:
    # Control nodes come with GPU nodes (a simulated node without any has none).
    return nodes + list(facts.control_nodes) if (nodes or facts.real) else nodes


def slot_name(res: Reservation, container: str) -> str:
    """The name of a container's region directory and limits file: the one a
    face recorded (``details.container_slots``: the device plugin keys it by
    the devices kubelet gave), else the layout's default."""
    given = res.details.container_slots.get(container)
    if given:
        return layout.component(given, "container slot")
    kind, _, uid = res.owner.partition(":")
    return layout.slot(kind, uid, container)


def slot_assignment(res: Reservation, container: str) -> ContainerAssignment:
    """What the container's slot carries. Kubelet hands an init container's
    devices on to a later container of the same pod (they never run at once),
    so several containers may share a slot; the slot then carries, per GPU, the
    larger of their shares, which stays within what the pod books there (the
    larger of its init peak and its app sum)."""
    c = container_of(res, container)
    slot = slot_name(res, c.name)
    sharing = [x for x in res.decision.containers if x.devices and slot_name(res, x.name) == slot]
    if len(sharing) <= 1:
        return c
    merged: dict[str, DeviceAssignment] = {}
    for x in sharing:
        for d in x.devices:
            m = merged.get(d.uuid)
            merged[d.uuid] = d if m is None else replace(m, mem_mib=max(m.mem_mib, d.mem_mib),
                                                         cores=max(m.cores, d.cores))
    return ContainerAssignment(c.name, c.init, tuple(merged.values()))


def realize(res: Reservation, facts: NodeFacts, container: str | None = None) -> ContainerEdits:
    """The edits for ``container`` of ``res`` (its only container when None)."""
    c = slot_assignment(res, container_of(res, container).name)
    # In the host's order (NVML's index, PCI bus order), which is how CUDA numbers the container's GPUs:
    # NVIDIA_VISIBLE_DEVICES and CUDA_DEVICE_MEMORY_LIMIT_<i> then name GPU i alike whatever order placement
    # chose (HAMI_VISIBLE_DEVICES=0,2 placed on 2 first). The limits file names GPUs by UUID.
    c = replace(c, devices=tuple(sorted(c.devices, key=lambda d: d.index)))
    env: dict[str, str] = {}
    nodes: list[DeviceNode] = []
    mounts: list[Mount] = []
    if any(d.mig_profile for d in c.devices):
        visible = []
        for d in c.devices:
            inst: dict[str, Any] | None = (res.mig or {}).get(d.uuid)
            if not inst or not inst.get("uuid"):
                raise RealizeError(f"{res.owner}: no MIG instance recorded on GPU {d.uuid} yet")
            visible.append(inst["uuid"])
            gpu = _gpu_node(facts, d.uuid)
            if gpu is not None:
                nodes.append(gpu)
            nodes += [DeviceNode.from_cdi(n) for n in inst.get("caps") or ()]
        # the parent's node first, then the control nodes, then the capabilities (as runc expects them)
        gpu_nodes = [n for n in nodes if not n.path.startswith("/dev/nvidia-caps/")]
        caps = [n for n in nodes if n.path.startswith("/dev/nvidia-caps/")]
        nodes = _with_control(facts, gpu_nodes) + caps
    else:
        shim_files(facts)  # before anything else is built: the refusal says what is missing
        is_mps = any(d.mps for d in c.devices)
        for i, d in enumerate(c.devices):
            env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] = f"{d.mem_mib}m"
            if d.sm_limit and not is_mps:
                env[f"CUDA_DEVICE_SM_LIMIT_{i}"] = str(d.sm_limit)
        if c.devices and c.devices[0].sm_limit and not is_mps:
            env["CUDA_DEVICE_SM_LIMIT"] = str(c.devices[0].sm_limit)
        if is_mps:
            if len(c.devices) != 1:
                raise RealizeError(f"{res.owner}: an MPS share has one GPU, this one has {len(c.devices)}")
            d = c.devices[0]
            # For tools that read them; the shim sets all three from the limits file before the driver starts.
            env["CUDA_MPS_PIPE_DIRECTORY"] = mps.PIPE_IN_CONTAINER
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(d.sm_limit or 100)
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={d.mem_mib}M"
        env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = layout.REGION_FILE_IN_CONTAINER
        prio = priority_of(res, c.name)
        if prio is not None:
            env["CUDA_TASK_PRIORITY"] = str(prio)
        visible = [d.uuid for d in c.devices]
        nodes = gpu_device_nodes(facts, visible)
        mounts = shim_mounts(facts, slot_name(res, c.name))
        if is_mps:  # the GPU's control daemon's pipe directory (its clients connect there)
            mounts.append(Mount(mps.pipe_dir(facts.state_dir, c.devices[0].uuid, facts.mps_dir),
                                mps.PIPE_IN_CONTAINER, RW))
    env["NVIDIA_VISIBLE_DEVICES"] = ",".join(visible)
    env["HAMI_RESERVATION"] = res.owner
    return ContainerEdits(env=tuple(f"{k}={v}" for k, v in env.items()), device_nodes=tuple(nodes),
                          mounts=tuple(mounts))
