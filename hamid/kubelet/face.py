"""The kubelet face: hamid as kubelet's device plugin, and pods in the node's ledger.

What runs (one trio task each, in the face's own nursery):

- **serving and registering**: the gRPC server on
  ``<kubelet dir>/device-plugins/hamid-nvidia.sock`` (grpcio threads), then
  ``Register`` on kubelet's ``kubelet.sock``. Kubelet deletes plugin sockets
  when it restarts and listens on a new ``kubelet.sock``: the face notices
  (an inotify watch on the directory, a look every ``kubeletCheckInterval``
  at most) that the socket is new or its own is gone, serves again and
  registers again, within a couple of seconds. It registers as soon as the
  daemon starts, with or without an API server.
- **health**: the devices' health read from the backend every
  ``healthCheckInterval`` (NVML: ECC errors, a GPU that stops answering; the
  simulated backend: marks a test sets); a change is sent to kubelet at once.
- **node resources**: ``nvidia.com/gpumem`` (MiB), ``gpumem-percentage``,
  ``gpucores`` and ``priority`` (as renamed in the config) advertised in the
  node's status as node-level extended resources, so that kube-scheduler's
  resource fit and kubelet's admission, which know nothing of hamid, accept
  pods that ask for them: they see each as one sum per node (total MiB of the
  GPUs, 100 per GPU...), a coarse bound; the per-GPU fit is hamid's own.
- **pods**: the pods bound to this node, watched through the API server
  (resumed from the last resourceVersion, listed again on ``410 Gone``); a
  deleted, succeeded or failed pod's reservation is released at once, a
  running pod's reservation moves to ``running``.

Its liveness check for the reconciler: a pod reservation is gone when the API
server has no pod of that name with that UID, or the pod has ended; when the
API server cannot be asked, nothing is released.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote

import grpc
import trio

from ..dirwatch import DirWatch
from ..kube.informer import Informer
from ..kube.rest import AsyncKube, KubeApiError
from ..logs import get_logger
from ..node.service import NodeService, Reservation
from ..request.model import Defaults
from .admission import AdmissionError, PodAdmission
from .api import API_VERSION, DEVICE_PLUGINS_DIR, KUBELET_SOCKET
from .api import deviceplugin_pb2 as pb
from .api import deviceplugin_pb2_grpc as pb_grpc
from .devices import advertised, gpu_of
from .plugin import DeviceBoard, DevicePluginService
from .pods import TERMINAL, PodDirectory

log = get_logger("kubelet")

PLUGIN_SOCKET = "hamid-nvidia.sock"
STRATEGIC_MERGE = "application/strategic-merge-patch+json"  # how kubectl patches a Node


class KubeletFace:
    name = "kubelet"

    def __init__(self, node: NodeService, *, kubelet_dir: str, resource: str, strategy: str, cdi_dir: str,
                 defaults: Defaults, api: Any, health_interval: float = 5.0, check_interval: float = 1.0,
                 watch_timeout_s: int = 300) -> None:
        self.defaults = defaults
        self.node = node
        self.dir = os.path.join(kubelet_dir, DEVICE_PLUGINS_DIR)
        self.resource = resource
        self.pods = PodDirectory(node.name, kubelet_dir, resource, api)
        self.door = node.door()  # the node's verbs for this face's blocking work (gRPC handlers, threads)
        self.admission = PodAdmission(self.door, self.pods, strategy=strategy, cdi_dir=cdi_dir, defaults=defaults,
                                      cached_pod=self._cached_pod)
        self.health_interval = health_interval
        self.check_interval = check_interval
        self.watch_timeout_s = watch_timeout_s
        self.board = DeviceBoard()
        self.registered = trio.Event()  # set on every successful registration (tests wait on it)
        self.registrations = 0
        self.owner_liveness = {"pod": self._pod_alive} if api is not None else {}
        # this node's pods (the shared informer: list, then watch, spec.nodeName = this node), read by
        # the reconciler and GetPreferredAllocation instead of one GET per reservation; a miss (a pod
        # not bound here, or before the first list) still asks the API server
        self.pod_informer = None
        if api is not None:
            self.pod_informer = Informer(api, "/api/v1/pods", name="this node's pods",
                                         watch_timeout_s=watch_timeout_s,
                                         field_selector=f"spec.nodeName={node.name}")
        self._server: grpc.Server | None = None
        self._generation = 0
        self._kubelet_id: tuple[int, int] | None = None

    # --- the RPCs, on grpcio's threads ------------------------------------------------

    def _prestart(self, ids: tuple[str, ...]) -> None:
        self.door.announce("admitted", self.admission.prestart(ids))

    def _preferred(self, available: tuple[str, ...], must: tuple[str, ...], size: int) -> list[str]:
        """Kubelet asks which of ``available`` to give a container (the pod unknown):
        ``must`` first; then GPUs a reservation waiting for its devices was placed on
        with as many GPUs as asked; then one device per GPU, the least booked GPU first."""
        chosen = list(must)
        by_gpu: dict[str, list[str]] = {}
        for i in available:
            if i not in chosen:
                by_gpu.setdefault(gpu_of(i), []).append(i)
        view = self.door.view()
        free = {g.uuid: g.mem_total - g.mem_used for g in view.gpus}
        candidates: list[tuple[Reservation, tuple[str, ...]]] = []
        for r in self.door.in_state("reserved", kind="pod"):  # a few, not every reservation of the node
            keyed = r.details.container_slots
            for c in r.decision.containers:
                if c.name not in keyed and len(c.devices) == size - len(must):
                    candidates.append((r, tuple(d.uuid for d in c.devices)))
        waiting = self._admissible(candidates) if len(candidates) > 1 else [g for _, g in candidates]
        order = sorted(by_gpu, key=lambda g: -free.get(g, 0))
        for gset in waiting:
            if all(g in by_gpu for g in gset):
                order = list(gset) + [g for g in order if g not in gset]
                break
        while len(chosen) < size and any(by_gpu.values()):
            for g in order:
                if len(chosen) < size and by_gpu[g]:
                    chosen.append(by_gpu[g].pop(0))
        return chosen[:size]

    def _admissible(self, candidates: list[tuple[Reservation, tuple[str, ...]]]) -> list[tuple[str, ...]]:
        """Of several waiting reservations, the GPUs of those kubelet may be admitting now: their
        pod bound to this node (kubelet admits no other), the oldest first (kubelet admits pods in
        creation order). A pod the API cannot be asked about stays a candidate, after the others;
        one placed but not yet bound here is left out, so it cannot steer another pod's devices."""
        bound: list[tuple[str, tuple[str, ...]]] = []
        unknown: list[tuple[str, ...]] = []
        for r, gset in candidates:
            ns, sep, name = r.name.partition("/")
            if not sep or self.pods.api is None:
                unknown.append(gset)
                continue
            try:
                pod = self._pod(ns, name)
            except Exception:  # the API server cannot answer: no reason to drop it
                unknown.append(gset)
                continue
            if pod is not None and (pod.get("metadata") or {}).get("uid") == r.uid and \
                    (pod.get("spec") or {}).get("nodeName") == self.node.name:
                bound.append(((pod.get("metadata") or {}).get("creationTimestamp") or "", gset))
        bound.sort(key=lambda t: t[0])  # RFC 3339 UTC timestamps sort as strings
        return [g for _, g in bound] + unknown

    def _cached_pod(self, ns: str, name: str) -> dict | None:
        """The pod from the informer's cache of this node's pods, None on a miss. A pod being deleted
        is a miss: a pod of the same name made again (a StatefulSet's) is asked of the API server,
        never taken for the old one still cached."""
        inf = self.pod_informer
        if inf is None or not inf.synced.is_set():
            return None
        got = inf.get(f"{ns}/{name}")
        if got is None or (got.get("metadata") or {}).get("deletionTimestamp") or \
                (got.get("spec") or {}).get("nodeName") != self.node.name:
            return None
        return got

    def _pod(self, ns: str, name: str) -> dict | None:
        """The pod from the informer's cache of this node's pods, else from the API server (blocking)."""
        inf = self.pod_informer
        if inf is not None and inf.synced.is_set():
            got = inf.get(f"{ns}/{name}")
            if got is not None:
                return got
        return self.pods.get_pod(ns, name)

    # --- liveness, for the reconciler (a worker thread) -------------------------------------

    def _pod_alive(self, r: Reservation) -> bool:
        ns, sep, name = r.name.partition("/")
        if not sep:
            return True  # no name recorded: cannot prove it gone
        pod = self._pod(ns, name)  # raises when the API server cannot answer: kept
        if pod is None:
            return False
        meta, status, spec = pod.get("metadata") or {}, pod.get("status") or {}, pod.get("spec") or {}
        if meta.get("uid") != r.uid or status.get("phase") in TERMINAL:
            return False
        # placed or bound elsewhere (a leader that died between its commit here and the pod's update,
        # and another that placed the pod again): this node's reservation is a leftover
        elsewhere = spec.get("nodeName") or (meta.get("annotations") or {}).get("hami.io/vgpu-node")
        return not elsewhere or elsewhere == self.node.name

    # --- serving and registering ---------------------------------------------------------

    def _serve(self, token: trio.lowlevel.TrioToken) -> None:
        """(Re)start the gRPC server on our socket (blocking; a worker thread).

        grpcio unlinks a unix socket's path when its server shuts down, so a
        server bound straight to ``hamid-nvidia.sock`` would, when replaced,
        delete its successor's socket. Each server binds a name of its own and
        the socket is renamed onto ``hamid-nvidia.sock``; the old server is
        stopped afterwards and removes only its own, already renamed, name."""
        from concurrent.futures import ThreadPoolExecutor

        os.makedirs(self.dir, exist_ok=True)
        path = os.path.join(self.dir, PLUGIN_SOCKET)
        self._generation += 1
        tmp = os.path.join(self.dir, f".hd{self._generation}")  # short: a socket path fits in 107 bytes
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        server = grpc.server(ThreadPoolExecutor(max_workers=16, thread_name_prefix="hamid-dp"))
        pb_grpc.add_DevicePluginServicer_to_server(
            DevicePluginService(self.board, token, allocate=self.admission.allocate, prestart=self._prestart,
                                prefer=self._preferred), server)
        try:
            server.add_insecure_port(f"unix:{tmp}")
        except RuntimeError:
            raise OSError(f"cannot serve the device plugin on {path} (a unix socket path is at most 107 "
                          f"bytes; this one is {len(path)})") from None
        server.start()
        os.replace(tmp, path)
        self._stop_server()
        self._server = server

    def _stop_server(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait(2)
            self._server = None

    def _register(self) -> None:
        """``Register`` on kubelet's socket (blocking; kubelet dials back inside the call)."""
        kubelet = os.path.join(self.dir, KUBELET_SOCKET)
        with grpc.insecure_channel(f"unix:{kubelet}") as ch:
            pb_grpc.RegistrationStub(ch).Register(pb.RegisterRequest(
                version=API_VERSION, endpoint=PLUGIN_SOCKET, resource_name=self.resource,
                options=pb.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)),
                timeout=15)

    def _kubelet_socket_id(self) -> tuple[int, int] | None:
        try:
            st = os.stat(os.path.join(self.dir, KUBELET_SOCKET))
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_ctime_ns

    async def _keep_registered(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        token = trio.lowlevel.current_trio_token()
        self.door.use_loop(token)  # before the gRPC server runs: its threads use the door
        started = False
        watch = None
        try:
            while True:
                kid = self._kubelet_socket_id()
                ours = os.path.exists(os.path.join(self.dir, PLUGIN_SOCKET))
                if kid is not None and (kid != self._kubelet_id or not ours or self._server is None):
                    try:
                        await trio.to_thread.run_sync(self._serve, token)
                        await trio.to_thread.run_sync(self._register)
                    except grpc.RpcError as e:
                        log.warning("registration with kubelet failed; trying again", error=e.details(),
                                    code=e.code().name)
                    except OSError as e:
                        log.error("the device plugin cannot serve; trying again", error=str(e))
                    else:
                        self._kubelet_id = kid
                        self.registrations += 1
                        log.info("registered with kubelet", resource=self.resource, socket=PLUGIN_SOCKET,
                                 times=self.registrations)
                        self.registered.set()
                        self.registered = trio.Event()
                elif kid is None and self._kubelet_id is not None:
                    log.info("kubelet's socket is gone (kubelet restarting); waiting for the new one")
                    self._kubelet_id = None
                if not started:
                    started = True
                    task_status.started()
                if watch is None or watch.broken:
                    if watch is not None:
                        watch.close()
                    os.makedirs(self.dir, exist_ok=True)
                    watch = DirWatch.open(self.dir)
                with trio.move_on_after(self.check_interval):
                    if watch is not None:
                        await watch.wait()
                    else:
                        await trio.sleep_forever()
        finally:
            if watch is not None:
                watch.close()
            self.board.close()
            await trio.to_thread.run_sync(self._stop_server)

    # --- health --------------------------------------------------------------------------

    def _read_devices(self) -> list[pb.Device]:
        view = self.door.view()
        health = {g.uuid: g.healthy for g in self.door.gpus()}
        return advertised([g for g in view.gpus if not g.dra], health)  # draDevices: the DRA face's, not ours

    async def _watch_health(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        events = self.node.health_events()
        if events is not None:  # NVML: critical XID and ECC events, between readings too
            await self.node.run_blocking(events)
        first = True
        while True:
            try:
                devices = await self.node.run_blocking(self._read_devices)
            except Exception as e:  # a backend that cannot be read: say so, keep the last list
                log.error("cannot read the devices' health", error=str(e))
            else:
                if self.board.set(devices) and not first:
                    bad = sorted({gpu_of(d.ID) for d in devices if d.health != "Healthy"})
                    log.warning("device health changed", unhealthy_gpus=bad)
            if first:
                first = False
                task_status.started()
            await trio.sleep(self.health_interval)

    # --- pods ------------------------------------------------------------------------------

    async def _follow_pods(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """This node's pods through the shared informer: each event acted on in order
        (a deleted pod's share released at once), the cache read by the reconciler."""
        informer = self.pod_informer
        if informer is None:
            raise RuntimeError("no API server: this face has no pods to follow")
        receive = informer.subscribe()
        async with trio.open_nursery() as nursery:
            await nursery.start(informer.run)
            task_status.started()
            async for kind, pod in receive:
                if pod is not None:
                    await self._on_pod(kind, pod)

    async def _on_pod(self, kind: str, pod: dict) -> None:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        uid = meta.get("uid")
        if not uid:
            return
        key = f"pod:{uid}"
        if kind == "DELETED" or status.get("phase") in TERMINAL:
            res = await self.node.release(key)
            if res is not None:
                log.info("pod ended; released", owner=key, pod=f"{meta.get('namespace')}/{meta.get('name')}",
                         why="deleted" if kind == "DELETED" else status.get("phase"))
        elif status.get("phase") == "Running":
            r = await self.node.get(key)
            if r is not None and r.state == "allocated":
                try:
                    await self.node.set_state(key, "running")
                except Exception as e:  # a race with a release: nothing to do
                    log.debug("state change skipped", owner=key, error=str(e))

    # --- node-level extended resources -----------------------------------------------------

    def node_resources(self) -> dict[str, str]:
        """What the node's status advertises besides the device plugin's own resource."""
        view = self.door.view()
        gpus = [g for g in view.gpus if not g.filtered]
        n = self.defaults.names
        return {n.memory: str(sum(g.mem_total for g in gpus) // max(1, self.defaults.memory_factor)),
                n.memory_percentage: str(100 * len(gpus)),
                n.cores: str(sum(g.cores_total for g in gpus)),
                n.priority: str(sum(g.shares_total for g in gpus))}

    async def _advertise(self, kube: AsyncKube, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """The node resources into the node's status: a patch on the event loop through ``kube`` (no
        worker thread, none of the official client's models: its first call built validators and
        imported over a hundred model modules, 40-90 ms of the interpreter in the daemon's first
        seconds, under kubelet's first PreStartContainer calls)."""
        task_status.started()
        delay = 1.0
        path = f"/api/v1/nodes/{quote(self.pods.node, safe='')}/status"
        while True:
            res = await self.node.run_blocking(self.node_resources)
            try:
                await kube.request("PATCH", path, {"status": {"capacity": res, "allocatable": res}},
                                   content_type=STRATEGIC_MERGE)
            except KubeApiError as e:  # the API server down, or RBAC: keep trying, slower
                log.warning("cannot advertise the node's GPU resources; trying again", error=str(e))
                await trio.sleep(delay)
                delay = min(delay * 2, 60.0)
                continue
            log.info("node resources advertised", resources=res)
            return

    # --- HAMi's node annotations (hamid/kubelet/register.py) ------------------------------------

    def hami_annotations(self) -> dict[str, str]:
        from .register import HANDSHAKE, REGISTER, handshake_value, register_annotation

        view = self.door.view()
        infos = {g.uuid: g for g in self.door.gpus()}
        return {REGISTER: register_annotation(view.gpus, infos), HANDSHAKE: handshake_value()}

    async def _register_with_hami(self, kube: AsyncKube, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Keep HAMi's register and handshake annotations on this node, every REFRESH_S (a patch on
        the event loop, as :meth:`_advertise`)."""
        from .register import REFRESH_S, REGISTER

        task_status.started()
        last = None
        path = f"/api/v1/nodes/{quote(self.pods.node, safe='')}"
        while True:
            try:
                ann = await self.node.run_blocking(self.hami_annotations)
                await kube.request("PATCH", path, {"metadata": {"annotations": ann}}, content_type=STRATEGIC_MERGE)
                if ann[REGISTER] != last:
                    log.info("HAMi node annotations written", gpus=ann[REGISTER].count('"id"'))
                    last = ann[REGISTER]
            except Exception as e:  # the API server down, or RBAC: try again at the next refresh
                log.warning("cannot write HAMi's node annotations; trying again", error=str(e))
            await trio.sleep(REFRESH_S)

    # --- the face ---------------------------------------------------------------------------

    async def _tell_pods(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """An Event on each pod the node has news of: its GPU's MPS control daemon failed (and was restarted),
        or a container of it began to be held to its compute limit from outside, or had processes killed for
        its GPU memory."""
        send, receive = trio.open_memory_channel(1024)
        tell = {"mps_failed": self._mps_event, "compute_held": self._held_event, "memory_killed": self._killed_event}

        def on_change(event: str, key: str) -> None:
            if event in tell and key.startswith("pod:"):
                try:
                    send.send_nowait((event, key))
                except trio.WouldBlock:
                    log.warning("too many pod events queued; one not told", owner=key, news=event)

        self.node.subscribe(on_change)
        task_status.started()
        async for event, key in receive:
            await self.node.run_blocking(tell[event], key)

    def _pod_of(self, key: str) -> tuple[Reservation, dict[str, Any]] | None:
        """The reservation of pod ``key`` and the pod as an Event names it; None when it is gone."""
        res = self.door.get(key)
        if res is None:
            return None
        ns, _, name = (res.name or "").partition("/")
        return res, {"metadata": {"namespace": ns, "name": name, "uid": res.uid}}

    def _killed_event(self, key: str) -> None:
        if (got := self._pod_of(key)) is None:
            return
        _, pod = got
        for h in self.door.take_memory_kills(key):
            self.pods.event(pod, "HamidMemoryKilled", f"container {h['container']} on GPU {h['gpu']}: {h['says']}.")

    def _held_event(self, key: str) -> None:
        if (got := self._pod_of(key)) is None:
            return
        _, pod = got
        for h in self.door.held_containers():
            if h["owner"] == key:
                self.pods.event(pod, "HamidComputeHeld",
                                f"container {h['container']} on GPU {h['gpu']} ({h['reason']}): {h['says']}. Its processes "
                                "are stopped (SIGSTOP) while the GPU time NVML gives them is over its compute limit, "
                                "and continued once back under; it may look hung meanwhile.")

    def _mps_event(self, key: str) -> None:
        if (got := self._pod_of(key)) is None:
            return
        res, pod = got
        note = res.details.mps_failure
        if note.get("kind") == "client_fault":
            text = (f"on GPU {note.get('gpu')}, {note.get('reason')}. This pod's CUDA work running then failed with it "
                    "and must be restarted; its reservation is kept.")
        elif note.get("kind") == "server_wedged":
            text = (f"on GPU {note.get('gpu')}, {note.get('reason')}. This pod's CUDA processes lost their MPS server "
                    "and must be restarted; its reservation is kept.")
        else:
            text = (f"the MPS control daemon of GPU {note.get('gpu')} failed ({note.get('reason')}); hamid restarted "
                    "it. This pod's CUDA processes lost their MPS server and must be restarted; its reservation is "
                    "kept.")
        self.pods.event(pod, "HamidMpsFailed", text)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self._run(task_status)
        finally:
            self.pods.close()

    async def _run(self, task_status) -> None:
        kube = AsyncKube.of(self.pods.api) if self.pods.api is not None else None
        try:
            async with trio.open_nursery() as nursery:
                if kube is not None:
                    await nursery.start(self._tell_pods)
                await nursery.start(self._watch_health)
                await nursery.start(self._keep_registered)
                if kube is not None:
                    await nursery.start(self._follow_pods)
                    await nursery.start(self._advertise, kube)
                    await nursery.start(self._register_with_hami, kube)
                task_status.started()
        finally:
            if kube is not None:
                with trio.CancelScope(shield=True):
                    await kube.aclose()


__all__ = ["KubeletFace", "AdmissionError", "PLUGIN_SOCKET"]
