"""The devices' health as kubelet's DRAResourceHealth stream tells it.

One board per face: the pool loop puts the pool's devices and their health
on it (:meth:`HealthBoard.set`) after every reading; each of kubelet's
``NodeWatchResources`` streams (grpcio's threads) sends the whole list at
once, then again at every change and at least every ``refresh_s`` (kubelet
marks a device Unknown when it hears nothing of it for
``health_check_timeout_seconds``). A stream ends when kubelet goes or the
board closes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

from .api import drahealth_pb2 as hpb

MESSAGE_MAX = 1024  # kubelet cuts longer messages


class HealthBoard:
    def __init__(self, pool: str, *, refresh_s: float, timeout_s: int) -> None:
        self.pool = pool
        self.refresh_s = refresh_s
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._devices: dict[str, str] = {}  # device name -> "" when healthy, else why not
        self._version = 0
        self._closed = False

    def set(self, devices: dict[str, str]) -> bool:
        """The pool's devices now (name -> why unhealthy, "" when healthy); True when it changed."""
        with self._cond:
            if devices == self._devices:
                return False
            self._devices = dict(devices)
            self._version += 1
            self._cond.notify_all()
            return True

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _message(self) -> hpb.NodeWatchResourcesResponse:
        now = int(time.time())
        out = hpb.NodeWatchResourcesResponse()
        for name, why in sorted(self._devices.items()):
            out.devices.add(device=hpb.DeviceIdentifier(pool_name=self.pool, device_name=name),
                            health=hpb.UNHEALTHY if why else hpb.HEALTHY, last_updated_time=now,
                            health_check_timeout_seconds=self.timeout_s, message=why[:MESSAGE_MAX])
        return out

    def _moved(self, seen: int) -> Callable[[], bool]:
        return lambda: self._closed or self._version != seen

    def stream(self, active: Callable[[], bool]) -> Iterator[hpb.NodeWatchResourcesResponse]:
        """The messages of one stream; ``active()`` false when kubelet is gone."""
        with self._cond:
            seen = self._version
            first = self._message()
        yield first
        while True:
            with self._cond:
                self._cond.wait_for(self._moved(seen), timeout=self.refresh_s)
                if self._closed or not active():
                    return
                seen = self._version
                msg = self._message()
            yield msg
