"""``hamid front``: the node's faces for callers outside the node, in a process with no rights.

Five listeners take calls from outside the node's trust: the admission
webhook (the API server sends it every pod of the cluster), the scheduler
extender (kube-scheduler's ``filter``/``prioritize``/``bind``),
``/metrics`` (whoever can reach the pod network), the peer API (other
daemons; anyone on the pod network can send it bytes: :mod:`hamid.peer.relay`
opens and decodes them here and hands the daemon its own encoding over
``frontDir/peer.sock``) and gossip (:mod:`hamid.gossip.frontface`: the
listener and the links to the peers, every frame opened and checked here;
the daemon's membership gets them over ``frontDir/gossip.sock``). They are where untrusted
bytes arrive, so in the chart they run in a container of their own beside the
privileged daemon: not root, no capabilities, no privilege escalation, a
read-only root file system, RuntimeDefault seccomp, and nothing mounted but
the config file, the certificates, the gossip key and ``frontDir``.

- The webhook needs nothing of the node (no state directory, GPUs or ledger):
  it is served here whole.
- The extender and the metrics need the daemon's state. This process does
  the parts exposed to the caller (TLS and the client certificate check,
  header and body deadlines, connection caps, body size limits, JSON
  parsing) and hands the daemon a parsed, re-encoded body over
  ``frontDir/extender.sock``; ``/metrics`` is read from
  ``frontDir/metrics.sock`` for each scrape. The daemon serves those sockets
  only to ``frontGroup`` (see :mod:`hamid.config.schema`).

A certificate (``webhookCertFile``) is required for the webhook and the
extender: with no state directory there is nowhere to keep a CA of its own.
"""

from __future__ import annotations

import json
import os
import signal

import httpx
import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..config import Config, NodeSettings
from ..errors import HamidError
from ..logs import get_logger
from ..keyring import Keyring, watch_key_file
from ..serving import BodyTooLarge, ConnectionCount, read_body, serve_asgi
from .supervise import FaceHealth, supervised

log = get_logger("front")

EXTENDER_SOCKET = "extender.sock"
METRICS_SOCKET = "metrics.sock"
VERBS = ("filter", "prioritize", "bind")
FORWARDED = "x-hamid-forwarded"  # the extender's own header (a follower's call the leader must not forward)
EXTENDER_MAX_BODY = 8 * 1024 * 1024  # the extender's own limit (a NodeList of thousands of nodes)
UPSTREAM_TIMEOUT_S = 25.0  # under the listener's 30 s request deadline: a bind's own calls take up to ~20 s
DRAIN_S = 3.0  # at SIGTERM, how long gossip waits for the daemon's leave notice (it sends it within 1 s)
METRICS_TIMEOUT_S = 10.0  # a scrape of the daemon's registry takes milliseconds; Prometheus' default timeout is 10 s


def socket_path(front_dir: str, name: str) -> str:
    return os.path.join(front_dir, name)


def _unix_client(path: str, timeout: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=path), base_url="http://hamid",
                             timeout=httpx.Timeout(timeout), trust_env=False)


def extender_app(daemon_socket: str) -> Starlette:
    """kube-scheduler's extender verbs, checked here and answered by the daemon."""
    client = _unix_client(daemon_socket, UPSTREAM_TIMEOUT_S)

    async def handle(req: Request):
        verb = req.path_params["verb"]
        if verb not in VERBS:
            return JSONResponse({"Error": f"unknown verb {verb!r}; accepted: {', '.join(VERBS)}"}, 404)
        try:
            body = await read_body(req, EXTENDER_MAX_BODY)
        except BodyTooLarge as e:
            return JSONResponse({"Error": str(e)}, 413)
        try:  # parsed here, as nobody, off the event loop; the daemon gets our own encoding of it
            args = await trio.to_thread.run_sync(json.loads, body)
        except (ValueError, RecursionError):
            return JSONResponse({"Error": "request body is not JSON"}, 400)
        if not isinstance(args, dict):
            return JSONResponse({"Error": f"request body must be a JSON object (kube-scheduler's "
                                          f"ExtenderArgs / ExtenderBindingArgs), not {type(args).__name__}"}, 400)
        headers = {"content-type": "application/json"}
        if req.headers.get(FORWARDED) is not None:
            headers[FORWARDED] = "1"
        try:
            r = await client.post(f"/{verb}", content=json.dumps(args, separators=(",", ":")), headers=headers)
            return JSONResponse(r.json(), status_code=r.status_code)
        except (httpx.HTTPError, ValueError) as e:
            log.warning("the daemon did not answer the extender call", verb=verb, error=str(e)[:200])
            return JSONResponse({"Error": f"hamid: this node's daemon is not answering ({daemon_socket})"}, 503)

    return Starlette(routes=[Route("/{verb}", handle, methods=["POST"])])


def metrics_app(daemon_socket: str) -> Starlette:
    """``/metrics``, read from the daemon's registry for each scrape."""
    client = _unix_client(daemon_socket, METRICS_TIMEOUT_S)

    async def scrape(req: Request):
        try:
            r = await client.get("/metrics", params=req.query_params.multi_items())
        except httpx.HTTPError as e:
            log.warning("the daemon did not answer a scrape", error=str(e)[:200])
            return PlainTextResponse(f"this node's daemon is not answering ({daemon_socket})\n", 503)
        return Response(r.content, status_code=r.status_code,
                        media_type=r.headers.get("content-type", "text/plain; version=0.0.4"))

    return Starlette(routes=[Route("/metrics", scrape, methods=["GET"])])


class ProxyFace:
    """One listener of this process: an app served on a TCP address."""

    def __init__(self, name: str, app, listen: str, *, certfile: str | None = None, keyfile: str | None = None,
                 client_ca: str | None = None, counts: ConnectionCount | None = None) -> None:
        self.name = name
        self.app = app
        self.listen = listen
        self.certfile, self.keyfile, self.client_ca = certfile, keyfile, client_ca
        self.counts = counts

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await serve_asgi(self.app, self.listen, what=self.name, certfile=self.certfile, keyfile=self.keyfile,
                         client_ca=self.client_ca, counts=self.counts, task_status=task_status)


class KeyWatch:
    """The gossip keyring the peer and gossip listeners open frames with, reread from its file as the daemon
    rereads its own (a rotated Secret reaches both)."""

    name = "keys"

    def __init__(self, keyring: Keyring, path: str) -> None:
        self.keyring, self.path = keyring, path

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await watch_key_file(self.keyring, self.path)


def peer_face(c: Config, keyring: Keyring | None) -> ProxyFace:
    """The peer API's listener."""
    from ..peer.relay import SOCKET, relay_app

    if keyring is None and c.peerInsecure:
        log.warning("peer API without a key: requests are neither encrypted nor authenticated",
                    listen=c.peerListen)
    elif keyring is None:
        raise HamidError("the peer API needs the gossip keyring to authenticate peers: set gossipKeyFile (readable "
                         "by hamid front), or peerInsecure: true to run it unauthenticated")
    counts = ConnectionCount()
    return ProxyFace("peer", relay_app(socket_path(c.frontDir, SOCKET), keyring, max_body_bytes=c.peerMaxBodyBytes,
                                       connections=counts), c.peerListen, counts=counts)


def gossip_face(c: Config, keyring: Keyring | None):
    """Gossip's listener and links (:mod:`hamid.gossip.frontface`), relayed to the daemon's membership."""
    from ..gossip.frontface import GossipFront
    from ..gossip.params import GossipParams
    from ..gossip.relaywire import SOCKET
    from ..gossip.service import FAULTS_ENV
    from ..gossip.transport import Faults

    if keyring is None:
        log.warning("gossip without a key: frames are neither encrypted nor authenticated (gossipKeyFile)")
    try:
        faults = Faults.parse(os.environ.get(FAULTS_ENV))
        return GossipFront(c.gossipListen, socket_path(c.frontDir, SOCKET), keyring, GossipParams.from_config(c),
                           faults=faults)
    except ValueError as e:
        raise HamidError(f"gossip: {e}") from None


def front_faces(config: Config, settings: NodeSettings) -> list:
    """What this process serves, by configuration; a config it cannot serve is refused here."""
    from dataclasses import replace

    from ..webhook.face import WebhookFace
    from ..request.model import Defaults, ResourceNames

    c = config
    faces: list = []
    if c.controlMode != "none":
        if not c.webhookCertFile:
            raise HamidError("hamid front needs webhookCertFile and webhookKeyFile (it keeps no state directory, "
                             "so it cannot make a CA of its own)")
        defaults = replace(Defaults.from_settings(settings), names=ResourceNames.from_settings(config))
        faces.append(WebhookFace.from_config(config, defaults=defaults))
    if c.controlMode == "extender" or c.metricsPort or c.peerListen or c.gossipListen:
        if not c.frontDir:
            raise HamidError("hamid front serves the extender, the metrics, the peer API and gossip from the "
                             "daemon's frontDir sockets: set frontDir (the same directory for hamid run and hamid "
                             "front), or metricsPort: 0, no peerListen, no gossipListen and a controlMode other "
                             "than extender")
    if c.controlMode == "extender":
        if c.extenderClientCAFile:
            tls = {"certfile": c.webhookCertFile, "keyfile": c.webhookKeyFile, "client_ca": c.extenderClientCAFile}
        elif c.extenderInsecure:
            log.warning("extender on plain HTTP without authentication (extenderInsecure): anyone who reaches "
                        "it can bind pods", listen=c.extenderListen)
            tls = {}
        else:
            raise HamidError("the extender needs extenderClientCAFile (only kube-scheduler's certificate may call "
                             "it), or extenderInsecure: true for a test cluster on one machine")
        faces.append(ProxyFace("extender", extender_app(socket_path(c.frontDir, EXTENDER_SOCKET)),
                               c.extenderListen, **tls))
    if c.metricsPort:
        faces.append(ProxyFace("metrics", metrics_app(socket_path(c.frontDir, METRICS_SOCKET)),
                               f"{c.metricsAddress}:{c.metricsPort}"))
    # one keyring for the peer API and gossip, reread from its file as the daemon rereads its own
    keyring = Keyring.load(c.gossipKeyFile) if c.gossipKeyFile and (c.peerListen or c.gossipListen) else None
    if c.peerListen:
        faces.append(peer_face(c, keyring))
    if c.gossipListen:
        faces.append(gossip_face(c, keyring))
    if keyring is not None:
        faces.append(KeyWatch(keyring, c.gossipKeyFile))
    if not faces:
        raise HamidError("hamid front has nothing to serve: controlMode is none, metricsPort is 0, no peerListen "
                         "and no gossipListen")
    return faces


async def run(config: Config, settings: NodeSettings, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve until SIGINT or SIGTERM."""
    faces = front_faces(config, settings)
    async with trio.open_nursery() as nursery:
        for face in faces:
            await nursery.start(supervised, face, FaceHealth())

        async def stop_on_signal() -> None:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    log.info("shutting down", signal=signal.Signals(signum).name)
                    with trio.move_on_after(DRAIN_S):  # the daemon, stopping too, leaves gossip through us
                        for face in faces:
                            drain = getattr(face, "drain", None)
                            if drain is not None:
                                await drain()
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(stop_on_signal)
        log.info("front serving", faces=[f.name for f in faces])
        task_status.started()
