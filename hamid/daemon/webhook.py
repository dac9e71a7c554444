"""``hamid webhook``: the admission webhook alone, for an unprivileged container.

The webhook is the port the API server calls with every pod of the cluster,
and the face that parses the most untrusted input (whole pods). In the chart
it therefore runs in a container of its own beside the privileged daemon:
not root, no capabilities, no privilege escalation, a read-only root file
system, RuntimeDefault seccomp, and nothing mounted but the config file and
its certificate. It needs none of the node: no state directory, no GPUs, no
ledger. The daemon's own container then does not serve the webhook
(``webhookSeparate``). A certificate (``webhookCertFile``) is required: with
no state directory there is nowhere to keep a CA of its own.
"""

from __future__ import annotations

import signal

import trio

from ..config import Config, NodeSettings
from ..errors import HamidError
from ..logs import get_logger
from .supervise import FaceHealth, supervised

log = get_logger("webhook")


def webhook_face(config: Config, settings: NodeSettings):
    from dataclasses import replace

    from ..control.webhook import WebhookFace
    from ..request.model import Defaults, ResourceNames

    if config.controlMode == "none":
        raise HamidError("hamid webhook: controlMode is none, so there is no webhook to serve")
    if not config.webhookCertFile:
        raise HamidError("hamid webhook needs webhookCertFile and webhookKeyFile (it keeps no state directory, "
                         "so it cannot make a CA of its own)")
    defaults = replace(Defaults.from_settings(settings), names=ResourceNames.from_settings(config))
    return WebhookFace.from_config(config, defaults=defaults)


async def run(config: Config, settings: NodeSettings, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve the webhook until SIGINT or SIGTERM."""
    face = webhook_face(config, settings)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervised, face, FaceHealth())

        async def stop_on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    log.info("shutting down", signal=signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(stop_on_signal)
        log.info("webhook serving alone", listen=config.webhookListen)
        task_status.started()
