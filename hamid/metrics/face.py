"""The metrics face: ``/metrics`` on the metrics port (or on ``frontDir``'s socket), over the daemon's registry."""

from __future__ import annotations

import trio
from prometheus_client import CollectorRegistry

from ..serving import ListenError, serve_asgi
from .exporter import metrics_app


class MetricsFace:
    name = "metrics"

    def __init__(self, registry: CollectorRegistry, bind: str, *, unix_group: int | None = None) -> None:
        """``bind``: ``HOST:PORT``, or ``unix:PATH`` for ``hamid front`` to serve
        (then ``unix_group`` may connect)."""
        self.registry = registry
        self.bind = bind
        self.unix_group = unix_group

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(lambda task_status: serve_asgi(metrics_app(self.registry), self.bind,
                                                                   what="the metrics port", unix_group=self.unix_group,
                                                                   task_status=task_status))
            except* ListenError as group:  # most often another exporter (HAMi's vGPU monitor) on 9394
                raise ListenError(f"{group.exceptions[0]}; pick another port with --metrics-port PORT (metricsPort in the config "
                                  "file), or 0 to serve no metrics") from None
            task_status.started()
