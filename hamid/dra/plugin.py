"""The gRPC services a DRA driver serves kubelet: Registration and DRAPlugin.

Two unix sockets, both made by the daemon, mode 0600 in root's directories
(kubelet runs as root; nobody else may call):

- ``<kubelet>/plugins_registry/gpu.hamid.io-reg.sock``: kubelet's plugin
  watcher finds it, calls ``GetInfo`` (type ``DRAPlugin``, the driver's name,
  the service socket, the services ``v1.DRAPlugin`` and ``v1beta1.DRAPlugin``)
  and then ``NotifyRegistrationStatus``. Kubelet re-reads the directory when
  it restarts, so nothing is registered again by hand.
- ``<kubelet>/plugins/gpu.hamid.io/dra.sock``: ``NodePrepareResources`` and
  ``NodeUnprepareResources``, the same handlers under both of kubelet's
  services (``/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/...`` and its
  ``v1beta1`` twin: the messages are the same; v1beta1 ignores ``share_id``),
  and ``NodeWatchResources`` (``v1.DRAResourceHealth`` and
  ``v1alpha1.DRAResourceHealth``): the devices' health (:mod:`.health`).

Calls carry at most :data:`MAX_MESSAGE` bytes, and a call is answered within
:data:`CLAIM_DEADLINE_S` (kubelet gives a call 45 s): claims not done by then
get an error of their own; every claim asked for has an entry in the answer,
its error saying why it failed. Only root reaches the sockets.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import trio

from ..logs import get_logger
from .health import HealthBoard
from . import names
from .api import dra_pb2 as pb
from .api import drahealth_pb2 as hpb
from .api import pluginregistration_pb2 as reg_pb
from .api import pluginregistration_pb2_grpc as reg_grpc

log = get_logger("dra")

MAX_MESSAGE = 4 << 20  # a prepare call names claims (uid, namespace, name): a few KiB; kubelet's own limit is 16 MiB
CLAIM_DEADLINE_S = 40.0  # a whole call, under kubelet's 45 s

PrepareFn = Callable[[list[pb.Claim]], Awaitable[pb.NodePrepareResourcesResponse]]
UnprepareFn = Callable[[list[pb.Claim]], Awaitable[pb.NodeUnprepareResourcesResponse]]


class RegistrationService(reg_grpc.RegistrationServicer):
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.status: reg_pb.RegistrationStatus | None = None  # the last kubelet sent

    def GetInfo(self, request, context):
        return reg_pb.PluginInfo(type=names.PLUGIN_TYPE, name=names.DRIVER, endpoint=self.endpoint,
                                 supported_versions=[*names.SERVICES, *names.HEALTH_SERVICES])

    def NotifyRegistrationStatus(self, request, context):
        self.status = request
        if request.plugin_registered:
            log.info("registered with kubelet as a DRA driver", driver=names.DRIVER)
        else:
            log.error("kubelet refused the DRA driver's registration", error=request.error[:500])
        return reg_pb.RegistrationStatusResponse()


def _dra_handlers(service: str, prepare: Callable, unprepare: Callable) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(service, {
        "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
            prepare, request_deserializer=pb.NodePrepareResourcesRequest.FromString,
            response_serializer=pb.NodePrepareResourcesResponse.SerializeToString),
        "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
            unprepare, request_deserializer=pb.NodeUnprepareResourcesRequest.FromString,
            response_serializer=pb.NodeUnprepareResourcesResponse.SerializeToString),
    })


def _health_handler(service: str, watch: Callable) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(service, {
        "NodeWatchResources": grpc.unary_stream_rpc_method_handler(
            watch, request_deserializer=hpb.NodeWatchResourcesRequest.FromString,
            response_serializer=hpb.NodeWatchResourcesResponse.SerializeToString)})


class PluginServers:
    """Both servers, started and stopped together (blocking calls: run them in a thread)."""

    def __init__(self, kubelet_dir: str, token: trio.lowlevel.TrioToken, prepare: PrepareFn,
                 unprepare: UnprepareFn, health: HealthBoard) -> None:
        self.registry_dir = os.path.join(kubelet_dir, names.REGISTRY_DIR)
        self.plugin_dir = os.path.join(kubelet_dir, names.PLUGINS_DIR, names.DRIVER)
        self.reg_path = os.path.join(self.registry_dir, names.REG_SOCKET)
        self.dra_path = os.path.join(self.plugin_dir, names.DRA_SOCKET)
        self.registration = RegistrationService(self.dra_path)
        self._token = token
        self._prepare = prepare
        self._unprepare = unprepare
        self.health = health
        self._servers: list[grpc.Server] = []

    def _on_loop(self, fn, claims, context):
        try:
            return trio.from_thread.run(fn, list(claims), trio_token=self._token)
        except trio.RunFinishedError:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the daemon is stopping")

    def _prepare_rpc(self, request, context):
        return self._on_loop(self._prepare, request.claims, context)

    def _unprepare_rpc(self, request, context):
        return self._on_loop(self._unprepare, request.claims, context)

    def _watch_rpc(self, request, context):
        return self.health.stream(context.is_active)

    def _serve(self, path: str, add: Callable[[grpc.Server], None]) -> grpc.Server:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = os.path.join(os.path.dirname(path), ".hamid-dra.tmp")  # short: a socket path fits in 107 bytes
        for p in (tmp,):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        server = grpc.server(ThreadPoolExecutor(max_workers=8, thread_name_prefix="hamid-dra"),
                             options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                                      ("grpc.max_send_message_length", MAX_MESSAGE)])
        add(server)
        try:
            server.add_insecure_port(f"unix:{tmp}")
        except RuntimeError:
            raise OSError(f"cannot serve on {path} (a unix socket path is at most 107 bytes; this one is "
                          f"{len(path)})") from None
        server.start()
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)  # appears whole: the plugin watcher never sees a socket nobody answers
        return server

    def start(self) -> None:
        """The service socket first, then the registration socket kubelet's watcher reacts to."""
        self._stop_servers()

        def dra(server: grpc.Server) -> None:
            server.add_generic_rpc_handlers([_dra_handlers(names.GRPC_SERVICES[s], self._prepare_rpc,
                                                           self._unprepare_rpc) for s in names.SERVICES]
                                            + [_health_handler(s, self._watch_rpc) for s in names.HEALTH_SERVICES])

        self._servers.append(self._serve(self.dra_path, dra))
        self._servers.append(self._serve(self.reg_path, lambda s: reg_grpc.add_RegistrationServicer_to_server(
            self.registration, s)))

    def stop(self) -> None:
        self.health.close()  # its streams end, so the servers stop at once
        self._stop_servers()

    def _stop_servers(self) -> None:
        for s in self._servers:
            s.stop(grace=0.5).wait(2)
        self._servers = []
        for p in (self.reg_path, self.dra_path):
            try:
                os.unlink(p)  # the watcher deregisters the driver when its socket goes
            except FileNotFoundError:
                pass
