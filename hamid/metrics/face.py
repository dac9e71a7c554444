"""The metrics face: ``/metrics`` on the metrics port, over the daemon's registry."""

from __future__ import annotations

import trio
from prometheus_client import CollectorRegistry

from ..serving import ListenError, serve_asgi
from .exporter import metrics_app


class MetricsFace:
    name = "metrics"

    def __init__(self, registry: CollectorRegistry, bind: str) -> None:
        self.registry = registry
        self.bind = bind

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(lambda task_status: serve_asgi(metrics_app(self.registry), self.bind,
                                                                   what="the metrics port", task_status=task_status))
            except* ListenError as group:  # most often another exporter (HAMi's vGPU monitor) on 9394
                raise ListenError(f"{group.exceptions[0]}; pick another port with --metrics-port PORT (metricsPort in the config "
                                  "file), or 0 to serve no metrics") from None
            task_status.started()
