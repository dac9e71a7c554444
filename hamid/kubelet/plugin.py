"""The device plugin's gRPC service, served on grpcio's own threads.

Each RPC runs on a grpcio worker thread (at most 16 at once), which does the
face's blocking work itself through the node service's door
(:class:`~hamid.node.service.NodeDoor`: the same node service every other face
uses) and hands what changed to the daemon's trio loop without waiting for it
(``TrioToken.run_sync_soon``): no hop into the loop and out to another thread
per call, and a busy loop (gossip, a leader's placements) never delays
kubelet's calls. ``ListAndWatch`` is a
long-lived stream per kubelet connection: it sends the whole device list at
once and again whenever the face changes it (health), until kubelet hangs up
or the server stops.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
import trio

from ..errors import HamidError
from ..logs import get_logger
from .api import deviceplugin_pb2 as pb
from .api import deviceplugin_pb2_grpc as pb_grpc

log = get_logger("kubelet")


class DeviceBoard:
    """The device list kubelet is sent, shared between the face (trio) and the
    ListAndWatch streams (grpcio threads)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._devices: list[pb.Device] = []
        self._version = 0
        self.closed = False

    def set(self, devices: list[pb.Device]) -> bool:
        """Replace the list; True if it changed (streams then send it)."""
        with self._cond:
            if [d.SerializeToString() for d in devices] == [d.SerializeToString() for d in self._devices]:
                return False
            self._devices = list(devices)
            self._version += 1
            self._cond.notify_all()
            return True

    def get(self) -> list[pb.Device]:
        with self._cond:
            return list(self._devices)

    def wait_newer(self, seen: int, timeout: float) -> tuple[int, list[pb.Device]] | None:
        with self._cond:
            if self._version == seen and not self.closed:
                self._cond.wait(timeout)
            if self._version == seen:
                return None
            return self._version, list(self._devices)

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()


class DevicePluginService(pb_grpc.DevicePluginServicer):
    """``allocate(ids)``, ``prestart(ids)`` and ``prefer(...)`` are blocking callables of the face,
    run on the RPC's own thread; ``token`` is the trio loop's (for what they announce)."""

    def __init__(self, board: DeviceBoard, token: trio.lowlevel.TrioToken, *,
                 allocate: Callable, prestart: Callable, prefer: Callable) -> None:
        self.board = board
        self.token = token
        self._allocate = allocate
        self._prestart = prestart
        self._prefer = prefer

    def _call(self, fn, *args) -> Any:
        return fn(*args)

    def GetDevicePluginOptions(self, request, context):
        return pb.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)

    def ListAndWatch(self, request, context):
        seen = -1
        while context.is_active() and not self.board.closed:
            got = self.board.wait_newer(seen, 1.0)
            if got is None:
                continue
            seen, devices = got
            yield pb.ListAndWatchResponse(devices=devices)

    def GetPreferredAllocation(self, request, context):
        out = pb.PreferredAllocationResponse()
        for r in request.container_requests:
            ids = self._call(self._prefer, tuple(r.available_deviceIDs), tuple(r.must_include_deviceIDs),
                             int(r.allocation_size))
            out.container_responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return out

    def Allocate(self, request, context):
        out = pb.AllocateResponse()
        for r in request.container_requests:
            try:
                out.container_responses.append(self._call(self._allocate, tuple(r.devices_ids)))
            except HamidError as e:
                log.warning("Allocate refused", devices=list(r.devices_ids), error=str(e))
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"hamid: {e}")
        return out

    def PreStartContainer(self, request, context):
        try:
            self._call(self._prestart, tuple(request.devices_ids))
        except HamidError as e:
            log.warning("PreStartContainer refused", devices=list(request.devices_ids), error=str(e))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"hamid: {e}")
        return pb.PreStartContainerResponse()
