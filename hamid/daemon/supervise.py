"""Faces kept running: one face's failure is logged and the face restarted, never the daemon torn down.

Every face runs under :func:`supervised`. A face that fails to *start* still
stops the daemon (a port in use, a bad certificate: the operator must see it
at once); a face that fails after it started (a listener's accept loop out of
file descriptors, a watch that breaks) is logged with its error, counted in
``hamid_face_restarts_total{face}``, shown as ``hamid_face_up{face} 0`` while
down, and started again after a back-off that doubles from
:data:`FIRST_BACKOFF_S` to :data:`MAX_BACKOFF_S` and returns to the start
once the face has run :data:`STABLE_S` without failing. The other faces keep
serving meanwhile: in particular kubelet's and Docker's, which pods and
containers wait on.
"""

from __future__ import annotations

import trio

from ..logs import get_logger

log = get_logger("daemon")

FIRST_BACKOFF_S = 1.0  # a transient error (EMFILE under a connection flood) clears within seconds
MAX_BACKOFF_S = 60.0  # a face failing for good still retries each minute, without flooding the log
STABLE_S = 60.0  # a face that ran this long without failing starts its next back-off from the beginning


class FaceHealth:
    """Which faces are up and how often each was restarted (for /metrics)."""

    def __init__(self) -> None:
        self.up: dict[str, bool] = {}
        self.restarts: dict[str, int] = {}

    def collector(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        health = self

        class _Collector:
            def collect(self):
                up = GaugeMetricFamily("hamid_face_up", "1 while the face serves, 0 while it waits to restart",
                                       labels=["face"])
                restarts = CounterMetricFamily("hamid_face_restarts", "times the face failed and was restarted",
                                               labels=["face"])
                for name in sorted(health.up):
                    up.add_metric([name], 1 if health.up[name] else 0)
                    restarts.add_metric([name], health.restarts.get(name, 0))
                yield up
                yield restarts

        return _Collector()


async def supervised(face, health: FaceHealth, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run ``face.run`` until cancelled, restarting it after a failure (see the module)."""
    name = face.name
    started = False
    backoff = FIRST_BACKOFF_S
    while True:
        since = trio.current_time()
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(face.run)
                health.up[name] = True
                if not started:
                    started = True
                    task_status.started()
            return  # the face finished by itself: nothing to keep running
        except Exception as e:  # not Cancelled (a BaseException): the daemon stopping is not a failure
            if not started:  # the face's own error, not the nursery's group around it: the CLI prints it
                if isinstance(e, ExceptionGroup) and len(e.exceptions) == 1:
                    raise e.exceptions[0] from None
                raise
            health.up[name] = False
            health.restarts[name] = health.restarts.get(name, 0) + 1
            if trio.current_time() - since >= STABLE_S:
                backoff = FIRST_BACKOFF_S
            log.error("face failed; restarting it", face=name, error=repr(e)[:500], in_s=backoff,
                      restarts=health.restarts[name])
            await trio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
