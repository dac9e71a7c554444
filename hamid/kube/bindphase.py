"""HAMi's bind phase of a pod: ``hami.io/bind-phase`` and the allocation it tracks.

The leader writes ``allocating`` when it places a pod (with the devices in
``hami.io/vgpu-devices-to-allocate``, :mod:`hamid.placement.hamiannotations`); the
pod's node writes ``success`` once every GPU container of the pod has been
allocated, and erases the consumed entries of ``vgpu-devices-to-allocate``
(each container's part left empty, its ``;`` kept), as HAMi's device plugin
does. Tools built for HAMi (its scheduler's own counts, HAMi-WebUI) count only
``success`` pods. A pod without a bind phase (not placed by a leader) gets
none written.
"""

from __future__ import annotations

from collections.abc import Mapping

BIND_PHASE = "hami.io/bind-phase"
DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
ALLOCATING, SUCCESS = "allocating", "success"


def success_patch(annotations: Mapping[str, str]) -> dict[str, str] | None:
    """The annotations to write once the pod's GPU containers are all allocated; None when
    there is nothing to write (no bind phase, or already ``success``)."""
    phase = annotations.get(BIND_PHASE)
    if phase is None or phase == SUCCESS:
        return None
    out = {BIND_PHASE: SUCCESS}
    todo = annotations.get(DEVICES_TO_ALLOCATE)
    if todo is not None:
        out[DEVICES_TO_ALLOCATE] = ";" * todo.count(";")
    return out
