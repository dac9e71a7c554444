"""``hamid run``: the node service and its faces, in one trio nursery.

Start-up order: take the state directory's lock (before anything is
written, so a second daemon on the same directory changes nothing), read the
devices (the first log line says NVML or simulated), open the ledger and
record the inventory, install the shim, write the node's facts, finish
pending releases, reconcile once and restore the live reservations' limits
files from the ledger (they are written without fsync); then start every face (local API,
Docker, metrics, gossip, peer API, web view as configured) and reconcile periodically
until SIGINT or SIGTERM. Faces are built by :func:`build_faces`: a new face
is one more entry there, and the loop that runs them does not change.
"""

from __future__ import annotations

import errno
import fcntl
import gc
import os
import signal
import socket
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path

import trio

from .. import __version__
from ..config import Config, NodeSettings
from ..devices import DeviceBackend, open_backend
from ..errors import HamidError
from ..ledger import Ledger
from ..logs import get_logger
from .supervise import FaceHealth, supervised
from ..node import devnodes
from ..node.capacity import capacity_views, unlisted_mig_gpus
from ..node.mps import find_programs as find_mps_programs
from ..node.core import NodeCore
from ..node.face import Face, collector_of, liveness_of
from ..node.facts import NodeFacts, write_facts
from .front import EXTENDER_SOCKET, METRICS_SOCKET
from .front import socket_path as front_socket
from ..node.layout import CONTAINERS_DIR, DOCKER_SOCKET_NAME, LEDGER_NAME, LOCK_NAME, SHIM_DIR, SOCKET_NAME
from ..node.service import NodeService
from ..request.model import Defaults, ResourceNames

log = get_logger("daemon")


@dataclass
class Daemon:
    config: Config
    settings: NodeSettings
    node: str
    state_dir: Path
    backend: DeviceBackend
    ledger: Ledger
    core: NodeCore
    lock_fd: int
    service: NodeService = field(init=False)
    face_health: FaceHealth = field(init=False)

    def __post_init__(self) -> None:
        self.service = NodeService(self.core, self.backend_label)
        self.face_health = FaceHealth()

    @property
    def backend_label(self) -> str:
        return f"{self.backend.kind} ({self.backend.description})"

    def close(self) -> None:
        self.core.close()
        self.ledger.close()
        self.backend.close()
        os.close(self.lock_fd)


def _take_lock(state_dir: Path) -> int:
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.lstat(state_dir)
        if not stat.S_ISDIR(st.st_mode):
            raise HamidError(f"state dir {state_dir} is not a directory (a symbolic link?); remove it or pick another")
        if stat.S_IMODE(st.st_mode) & 0o077:  # ledger, limits, keys: root's alone
            os.chmod(state_dir, 0o700)
            log.warning("state dir was open to others; made it 0700", path=str(state_dir),
                        was=oct(stat.S_IMODE(st.st_mode)))
        fd = os.open(state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        raise HamidError(f"cannot use state dir {state_dir}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise HamidError(f"another hamid daemon is running on state dir {state_dir}") from None
        raise
    return fd


def _front_dir(path: Path, group: int) -> None:
    """``frontDir``: a real directory (never a link) that ``frontGroup`` may enter
    and root alone may write; made so when it is not."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o750)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise HamidError(f"frontDir {path} is not a directory (a symbolic link?); remove it or pick another")
        if st.st_uid != 0 and os.geteuid() == 0:
            raise HamidError(f"frontDir {path} belongs to uid {st.st_uid}, not root: its owner could replace the "
                             "daemon's sockets; remove it or pick another")
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if os.geteuid() == 0:
                os.fchown(fd, 0, group)
            os.fchmod(fd, 0o750)
        finally:
            os.close(fd)
    except OSError as e:
        raise HamidError(f"cannot use frontDir {path}: {e.strerror}") from None
    from ..gossip.relaywire import SOCKET as GOSSIP_SOCKET
    from ..peer.relay import SOCKET as PEER_SOCKET

    for name in (EXTENDER_SOCKET, METRICS_SOCKET, PEER_SOCKET, GOSSIP_SOCKET):
        _clear_stale_socket(path / name)


def _clear_stale_socket(path: Path) -> None:
    if not path.exists():
        return
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(str(path))
    except OSError:
        path.unlink()  # nobody listens: a crashed daemon's leftover
    else:
        raise HamidError(f"a daemon already answers on {path}")
    finally:
        s.close()


FD_LIMIT = 65536  # every listener's connection cap (hamid.serving) and gossip's inbound cap fit under it


def raise_fd_limit() -> None:
    """The soft file-descriptor limit up to :data:`FD_LIMIT` (or the hard limit,
    if lower): the default soft limit of 1024 is below what the listeners'
    caps add up to, and a daemon out of descriptors cannot serve kubelet."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FD_LIMIT if hard == resource.RLIM_INFINITY else min(FD_LIMIT, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def prepare(config: Config, settings: NodeSettings, node: str) -> Daemon:
    """Everything before serving; raises HamidError with a message for the user."""
    os.umask(0o077)  # every file and socket the daemon makes is private unless chmod-ed on purpose
    raise_fd_limit()
    state_dir = Path(config.stateDir)
    lock_fd = _take_lock(state_dir)  # first: a refused second daemon must not touch anything
    try:
        backend = open_backend(simulate=settings.simulate, node_name=node,
                               mig_enabled=settings.operatingMode == "mig", state_dir=state_dir)
        gpus = backend.gpus()
        log.info("hamid starting", devices=backend.kind, inventory=backend.description, node=node,
                 gpus=len(gpus), version=__version__, state_dir=config.stateDir, mode=settings.operatingMode)
        for g in gpus:
            if g.mig_capable and (g.mig_enabled != (settings.operatingMode == "mig")):
                log.warning("GPU MIG mode differs from operatingMode; the GPU's real mode wins",
                            gpu=g.index, mig_enabled=g.mig_enabled, operating_mode=settings.operatingMode)
        _clear_stale_socket(state_dir / SOCKET_NAME)
        _clear_stale_socket(state_dir / DOCKER_SOCKET_NAME)
        if config.frontDir:
            _front_dir(Path(config.frontDir), config.frontGroup)
        ledger = Ledger(state_dir / LEDGER_NAME)
        mps_control = mps_missing = None
        if any("mps" in settings.share_modes(g.index, g.uuid) for g in gpus if not g.mig_enabled):
            mps_control, mps_missing = find_mps_programs(settings.mpsControl)
            if mps_missing:
                log.error("some GPUs serve MPS but NVIDIA's MPS programs are missing: those GPUs refuse MPS shares "
                          "until they are there", why=mps_missing, path=os.environ.get("PATH", ""))
        views = capacity_views(gpus, settings, mps_missing=mps_missing is not None)
        for g in unlisted_mig_gpus(gpus, settings.migProfileAllowlist):
            log.warning("migProfileAllowlist names no model of this GPU: every MIG profile of its table is allowed",
                        gpu=g.index, name=g.name, memory_mib=g.memory_mib,
                        models=sorted({m for e in settings.migProfileAllowlist for m in e.models}),
                        fix="add an entry whose models name this GPU (its name as reported, or HAMi's form "
                            "such as H100-SXM5-80GB)")
        try:
            _refuse_mode_change_with_tenants(ledger, views, settings.operatingMode, state_dir)
        except BaseException:
            ledger.close()
            raise
        ledger.set_inventory(node, views, settings.gpuSchedulerPolicy)
        _log_stranded(ledger, {g.uuid for g in views}, node)
        shim = install_shim_for(config, state_dir)
        real = backend.kind == "nvml"
        gpu_nodes = {}
        for g in gpus:
            if g.minor is not None and (n := devnodes.gpu_node(config.devRoot, g.minor)) is not None:
                gpu_nodes[g.uuid] = n
        facts = NodeFacts(
            node=node, state_dir=str(state_dir),
            backend={"kind": backend.kind, "mig_enabled": settings.operatingMode == "mig",
                     "simulate": backend.description if not real else None},
            gpu_minors={g.uuid: g.minor for g in gpus if g.minor is not None},
            gpu_nodes=gpu_nodes, control_nodes=tuple(devnodes.control_nodes(config.devRoot)),
            dev_root=config.devRoot, caps_root=config.migCapsRoot,
            shim_library=shim["library"], shim_preload=shim["preload"],
            defaults={"memory_mib": settings.defaultMemory, "cores": settings.defaultCores,
                      "gpu_num": settings.defaultGPUNum},
            node_policy=settings.nodeSchedulerPolicy, region_tmpfs=config.regionTmpfs,
            core_policy=settings.gpuCorePolicy, compute_bypass=settings.computeBypass,
            memory_bypass=settings.memoryBypass, mps_control=mps_control, mps_dir=settings.mpsDir,
            mps_missing=mps_missing)
        write_facts(state_dir, facts)
        (state_dir / CONTAINERS_DIR).mkdir(mode=0o700, exist_ok=True)
        core = NodeCore(ledger, facts, lambda: backend)
        return Daemon(config, settings, node, state_dir, backend, ledger, core, lock_fd)
    except BaseException:
        os.close(lock_fd)
        raise


def _refuse_mode_change_with_tenants(ledger: Ledger, views: list, operating_mode: str, state_dir: Path) -> None:
    """A GPU whose sharing mode (shim or MIG) changed since the ledger last saw
    it cannot keep its tenants: their shares are of the other kind (a MIG
    instance is no shim share, and would drop out of the GPU's use). Start-up
    is refused until they leave, naming them; with no tenant the change is
    taken as is. A Docker container whose poststop marker waits is gone
    already (the first drain releases it) and holds nothing."""
    from ..ledger import LedgerError
    from ..node import released

    try:
        old = {g.uuid: g.mode for g in ledger.view().gpus}
    except LedgerError:
        return  # a new ledger: nothing booked yet
    changed = {g.uuid: (old[g.uuid], g.mode, g.index) for g in views if g.uuid in old and old[g.uuid] != g.mode}
    if not changed:
        return
    held: dict[str, list[str]] = {}
    leaving = {f"docker:{cid}" for cid in released.pending(str(state_dir))}
    for r in ledger.list():
        if r.owner in leaving:
            continue
        for c in r.decision.containers:
            for d in c.devices:
                who = f"{r.name} ({r.owner})" if r.name and r.name not in r.owner else r.owner
                if d.uuid in changed and who not in held.setdefault(d.uuid, []):
                    held[d.uuid].append(who)
    busy = {u: owners for u, owners in held.items() if owners}
    if busy:
        parts = [f"GPU {changed[u][2]} from {changed[u][0]} to {changed[u][1]} (held by {', '.join(owners)})"
                 for u, owners in busy.items()]
        raise HamidError(f"operatingMode {operating_mode} changes the sharing mode of {'; '.join(parts)}; "
                         "refused while tenants hold these GPUs. Start hamid with operatingMode as it was, "
                         "stop those containers or pods (the daemon releases them as they go), then change it")


def _log_stranded(ledger: Ledger, uuids: set[str], node: str) -> None:
    """Say at start which reservations hold a GPU this node does not have: their
    shares count on none of its GPUs (status and inspect show them so) until
    they are released or the node comes back with those GPUs."""
    from ..ledger.report import missing_gpus

    for r in ledger.list():
        if not (gone := missing_gpus(r, uuids)):
            continue
        log.warning("reservation holds a GPU this node does not have; its share counts on none of this node's GPUs",
                    owner=r.owner, name=r.name, missing_gpus=gone, node=node,
                    fix="simulated GPU UUIDs derive from --node-name: start with the name the node had; with "
                        "real GPUs, put the GPU back or stop the container or pod (its release frees the row)")


def install_shim_for(config: Config, state_dir: Path) -> dict:
    """Install the shim (versioned, atomic) and the ld.so.preload file next to it."""
    from ..shiminstall import ShimInstallError, install_shim

    candidates = [config.shimLibrary] if config.shimLibrary else [
        str(Path(__file__).resolve().parents[2] / "shim" / "build" / "libvgpu.so"),
        str(Path(sys.prefix) / "shim" / "libvgpu.so"), "/usr/lib/hamid/libvgpu.so"]
    src = next((c for c in candidates if Path(c).exists()), None)
    if src is None:
        if config.shimLibrary:
            raise HamidError(f"shimLibrary {config.shimLibrary} does not exist")
        log.warning("no shim found; containers asking for memory or compute limits will be refused",
                    looked_in=candidates)
        return {"library": None, "preload": None}
    dest = state_dir / SHIM_DIR
    try:
        lib = install_shim(src, dest)
    except ShimInstallError as e:
        raise HamidError(f"cannot install the shim from {src}: {e}") from None
    os.chmod(dest, 0o755)
    preload = dest / "ld.so.preload"
    want = "/usr/local/vgpu/libvgpu.so\n"
    if not preload.exists() or preload.read_text() != want:
        tmp = dest / ".ld.so.preload.tmp"
        tmp.write_text(want)
        os.chmod(tmp, 0o644)
        os.replace(tmp, preload)
    log.info("shim installed", library=str(lib))
    return {"library": str(lib), "preload": str(preload)}


def _keyring(c: Config):
    if not c.gossipKeyFile:
        return None
    from ..keyring import Keyring

    return Keyring.load(c.gossipKeyFile)


def request_defaults(d: Daemon) -> Defaults:
    """What requests get for what they leave out, and the resource names they
    use: the node's settings plus the cluster-wide names (``resourceCountName``...)."""
    from dataclasses import replace

    return replace(Defaults.from_settings(d.settings), names=ResourceNames.from_settings(d.config))


async def build_faces(d: Daemon):
    """The faces this daemon runs, by configuration, and the metrics registry
    their collectors are registered with. The metrics face comes last, so
    every other face's collector is in its registry before it serves."""
    from ..docker.face import DockerFace
    from ..localapi.server import LocalApiFace
    from ..metrics.exporter import HostCollector, LedgerCollector, SlotLabeler, new_registry
    from ..metrics.face import MetricsFace
    from ..shimregion import register_collector

    c = d.config
    registry, commits = new_registry()
    registry.register(LedgerCollector(d.service.door(), lambda: d.backend_label, legacy=c.legacyMetrics))
    registry.register(HostCollector(d.node, d.backend.readings, legacy=c.legacyMetrics))
    # what the shim measures inside each container (its region file)
    register_collector(registry, d.state_dir / CONTAINERS_DIR, SlotLabeler(d.service.door()), legacy=c.legacyMetrics,
                       live=d.service.core.live_counts)
    d.service.subscribe(lambda event, key: commits.labels("conflict" if event == "conflict" else "ok").inc()
                        if event in ("admitted", "committed", "conflict") else None)
    faces: list[Face] = []
    api = kube_api(c) if (c.kubernetes or c.kubeconfig) else None
    gossip = None
    keyring = _keyring(c)  # one keyring for gossip and the peer API: a reload reaches both at once
    identity = None
    if c.peerListen or c.gossipListen:  # signs this node's peer requests and its gossip statements
        from ..nodekey import NodeIdentity

        identity = NodeIdentity.load_or_create(d.state_dir)
    if keyring is not None:
        from ..keyring import watch_key_file

        faces.append(_Task("keys", lambda: watch_key_file(keyring, c.gossipKeyFile)))
    if c.gossipListen:
        from ..gossip.params import GossipParams
        from ..gossip.service import GossipService

        if keyring is None:
            log.warning("gossip without a key: frames are neither encrypted nor authenticated (gossipKeyFile)")
        peer_address = None
        if c.peerListen:
            from ..peer.server import advertised

            peer_address = advertised(c.peerListen, c.peerAdvertise)
        seeds = tuple(c.gossipJoin)
        if not seeds and api is not None and (c.gossipSeedsFromPods or c.gossipSeedsService):
            from ..kube.seeds import kubernetes_seeds

            seeds = tuple(await kubernetes_seeds(c, api))  # the other DaemonSet pods: no address by hand
            log.info("gossip seeds from Kubernetes", seeds=list(seeds))
        extender_address = None
        if (c.kubernetes or c.kubeconfig) and c.controlMode == "extender":
            host, port = c.extenderListen.rsplit(":", 1)
            if host in ("0.0.0.0", "::", "[::]", ""):  # peers dial the address they reach this node on
                host = (peer_address or c.gossipAdvertise or c.gossipListen).rsplit(":", 1)[0]
            scheme = "http" if c.extenderInsecure and not c.extenderClientCAFile else "https"
            extender_address = f"{scheme}://{host}:{port}"
        admit, admit_ready = None, None
        if api is not None:  # under Kubernetes only a Node's name may be a member
            from ..kube.nodes import NodeNames

            nodes = NodeNames(api)
            faces.append(nodes)
            admit, admit_ready = nodes.is_node, nodes.informer.synced
        relay = None
        if c.frontDir:  # hamid front serves gossipListen, dials the peers and opens every frame, as nobody
            from ..gossip.relaywire import SOCKET as GOSSIP_SOCKET

            relay = (front_socket(c.frontDir, GOSSIP_SOCKET), c.frontGroup)
        gossip = GossipService(d.node, c.gossipListen, params=GossipParams.from_config(c), seeds=seeds,
                               advertise=c.gossipAdvertise, keyring=keyring, read_view=d.ledger.view,
                               read_stamp=d.ledger.change_stamp, peer_address=peer_address,
                               extender_address=extender_address, identity=identity,
                               state_dir=d.state_dir, admit=admit, admit_ready=admit_ready, relay=relay)
        d.service.subscribe(lambda event, key: gossip.poke() if event != "conflict" else None)
    faces.append(LocalApiFace(d.service, str(d.state_dir / SOCKET_NAME), defaults=request_defaults(d),
                              cluster=gossip.cluster_document if gossip is not None else None,
                              elsewhere=elsewhere_hint(d.node, gossip) if gossip is not None else None))
    faces.append(DockerFace(d.service, poll_interval=c.releasePollInterval, net_interval=c.reconcileInterval,
                            start_grace=c.dockerStartGrace, socket_path=str(d.state_dir / DOCKER_SOCKET_NAME),
                            defaults=request_defaults(d),
                            elsewhere=elsewhere_hint(d.node, gossip) if gossip is not None else None))
    control: list = []
    if (c.kubernetes or c.kubeconfig) and c.controlMode != "none" and api is not None:
        control = control_faces(d, api, gossip, keyring, identity)
    if c.peerListen:
        from ..peer.server import PeerFace

        # with gossip and a key: every request signed by its sender's gossiped identity; in a cluster with
        # a control plane, commits only from the node the current leader runs on
        leading = next((f for f in control if hasattr(f, "leader_node")), None)
        identities = gossip.identity_of if gossip is not None and keyring is not None else None
        leader = (lambda: leading.leader_node) if leading is not None else None
        confirm_leader = leading.confirm_leader if leading is not None else None
        if c.frontDir:  # hamid front serves peerListen and opens the frames; they arrive here plain, from it alone
            from ..peer.relay import SOCKET as PEER_SOCKET

            faces.append(PeerFace(d.service, None, "unix:" + front_socket(c.frontDir, PEER_SOCKET), insecure=True,
                                  window_s=c.peerReplayWindow, max_body_bytes=c.peerMaxBodyBytes,
                                  max_ids=c.peerReplayCacheSize, identities=identities, leader=leader,
                                  confirm_leader=confirm_leader, unix_group=c.frontGroup))
        else:
            faces.append(PeerFace.from_config(d.service, c, keyring, identities=identities, leader=leader,
                                              confirm_leader=confirm_leader))
    if d.settings.draDevices.strip() and not (c.kubernetes or c.kubeconfig):
        raise HamidError("draDevices is set, but DRA needs Kubernetes (kubernetes: true or kubeconfig): the "
                         "slices are published through the API server; unset draDevices on a Docker-only host")
    if c.kubernetes or c.kubeconfig:
        faces.append(kubelet_face(d, api))
        if d.settings.draDevices.strip():
            faces.append(dra_face(d, api))
        faces.extend(control)
    registry.register(d.face_health.collector())
    if c.webListen:
        faces.append(web_face(d, gossip, faces, keyring, identity))
    for f in faces:
        col = collector_of(f)
        if col is not None:
            registry.register(col)
    if c.metricsPort and c.frontDir:  # hamid front serves the port, as nobody
        faces.append(MetricsFace(registry, "unix:" + front_socket(c.frontDir, METRICS_SOCKET), unix_group=c.frontGroup))
    elif c.metricsPort:
        faces.append(MetricsFace(registry, f"{c.metricsAddress}:{c.metricsPort}"))
    if gossip is not None:  # last: it joins the group once every other listener is bound, so a port that
        registry.register(gossip.collector())  # fails leaves no member behind (it would leave as "left")
        faces.append(gossip)
    return faces


def web_face(d: Daemon, gossip, faces: list, keyring=None, identity=None):
    """The web view (``webListen``): this node's service, the gossiped view, and
    the leader as the scheduling face's elector last saw it (Kubernetes only)."""
    from ..cluster.report import live_views
    from ..web.face import WebFace
    from ..web.guard import load_token

    c = d.config
    elector = next((f.elector for f in faces if getattr(f, "elector", None) is not None), None)
    leader = (lambda: {"mode": c.controlMode, "holder": elector.leader_identity}) if elector is not None else None

    def marks():
        """Cheap marks that move when the page's document may have changed."""
        members = ()
        if gossip is not None:
            m = gossip.membership
            members = tuple((x.name, x.state, x.inc, (m.docs.get(x.name) or {}).get("version"))
                            for x in m.members.values())
        return d.ledger.change_stamp(), members, leader() if leader is not None else None

    return WebFace(d.service, c.webListen, settings=d.settings,
                   cluster=gossip.cluster_document if gossip is not None else None, marks=marks, leader=leader,
                   containers_root=str(d.state_dir / CONTAINERS_DIR),
                   token=load_token(c.webTokenFile) if c.webTokenFile else None,
                   max_connections=c.webMaxConnections, request_timeout=c.webRequestTimeout,
                   live_views=(lambda: live_views(gossip.cluster_document())) if gossip is not None else None,
                   remote_status=_peer_status(c, d.node, keyring, identity) if gossip is not None else None)


def _peer_status(c: Config, node: str, keyring=None, identity=None):
    """Another node's status through the peer API (for the web view's tenants), or
    None where this daemon cannot ask (no keyring and not ``peerInsecure``). Signed
    with this node's identity: peers answer only members they can tell apart."""
    if keyring is None and not c.peerInsecure:
        return None
    from ..peer.client import PeerClient

    client = PeerClient.from_config(c, keyring, name=node, identity=identity)
    return lambda peer_node, address: client.status(address, node=peer_node)


def elsewhere_hint(node: str, gossip):
    """For a refusal (called in a worker thread): where else in the gossiped view
    the same request fits now, in one line (:mod:`hamid.placement.elsewhere`)."""
    from ..cluster.capacity import view_from_doc
    from ..placement.elsewhere import hint

    def elsewhere(request) -> str:
        docs = trio.from_thread.run_sync(gossip.membership.live_docs)  # the membership lives in trio's thread
        return hint(request, [view_from_doc(doc) for doc in docs.values()], exclude=[node])
    return elsewhere


def kube_api(c: Config):
    """The API server's client: ``kubeconfig``, else the pod's service account; None (with a
    warning) when neither is there."""
    from ..kube.client import api_client

    if c.kubeconfig or os.environ.get("KUBERNETES_SERVICE_HOST"):
        return api_client(c.kubeconfig)  # configured: a bad config stops start-up
    log.warning("no API server configured (no --kubeconfig, not in a pod): the device plugin registers and "
                "lists devices, but cannot tie a container to its pod, so every container start is refused")
    return None


def kubelet_face(d: Daemon, api):
    """The device plugin and the pods of this node (``kubernetes``, ``kubeconfig``)."""
    from ..kubelet.face import KubeletFace

    c = d.config
    return KubeletFace(d.service, kubelet_dir=c.kubeletDir, resource=c.resourceCountName,
                       strategy=c.deviceListStrategy, cdi_dir=c.cdiSpecDir, defaults=request_defaults(d),
                       api=api, health_interval=c.healthCheckInterval)


def dra_face(d: Daemon, api):
    """The DRA driver ``gpu.hamid.io`` for the GPUs of ``draDevices``."""
    from ..dra.face import DraFace
    from ..node.dragpus import dra_gpus

    c = d.config
    dra_gpus(d.settings.draDevices, d.ledger.view().gpus)  # names only GPUs of this node, or the daemon stops here
    return DraFace(d.service, kubelet_dir=c.kubeletDir, cdi_dir=c.cdiSpecDir, api=api, devices=d.settings.draDevices,
                   defaults=request_defaults(d), health_interval=c.healthCheckInterval,
                   driver_version=d.backend.description if d.backend.kind == "nvml" else None)


class _Task:
    """A background task of the daemon's, run and supervised like a face."""

    def __init__(self, name: str, work) -> None:
        self.name = name
        self._work = work

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await self._work()


def control_faces(d: Daemon, api, gossip, keyring=None, identity=None) -> list:
    """The webhook (every daemon) and the scheduling face (the leader's work, the extender)."""
    from ..scheduling.face import SchedulingFace
    from ..kube.election import LeaderElector
    from ..scheduling.placer import ClusterView
    from ..cluster.capacity import view_from_doc
    from ..peer.client import PeerClient

    c = d.config
    if gossip is None or not c.peerListen:
        raise HamidError(f"controlMode {c.controlMode} needs gossipListen and peerListen: the leader places pods "
                         "on the gossiped view of every node and commits on the chosen node through the peer API "
                         "(or set controlMode: none)")
    names = request_defaults(d).names
    ignored = {names.count, names.memory, names.memory_percentage, names.cores, names.priority}
    elector = LeaderElector.from_config(c, api, d.node)
    cluster = ClusterView(gossip.membership, view_from_doc, freeze_gc=True)
    peer = PeerClient.from_config(c, keyring, name=d.node, identity=identity)
    def extender_of(node: str) -> str | None:
        """A node's extender URL, from its gossiped document."""
        return (gossip.membership.live_docs().get(node) or {}).get("extender")

    faces: list = []
    from ..webhook.face import WebhookFace
    if not c.frontDir:  # else `hamid front` serves it, unprivileged
        faces.append(WebhookFace.from_config(c, defaults=request_defaults(d)))
    def serving_files() -> tuple[str, str]:
        """The extender serves the webhook's certificate (the chart's, or the self-made one)."""
        if c.webhookCertFile:
            return c.webhookCertFile, c.webhookKeyFile
        from ..webhook.certs import ensure

        files = ensure(os.path.join(c.stateDir, "webhook-tls"), ["localhost", "127.0.0.1", *c.webhookNames])
        return str(files.cert), str(files.key)

    forward_tls = None
    if c.controlMode == "extender" and c.extenderClientCAFile:
        if c.extenderClientCertFile:
            forward_tls = (c.extenderClientCertFile, c.extenderClientKeyFile,
                           c.extenderServerCAFile or c.extenderClientCAFile)
    if c.frontDir:  # hamid front serves extenderListen (TLS, client certificates) and hands us the calls
        listen, tls, client_ca = "unix:" + front_socket(c.frontDir, EXTENDER_SOCKET), None, None
    else:
        listen, tls, client_ca = (c.extenderListen, serving_files if c.extenderClientCAFile else None,
                                  c.extenderClientCAFile)
    faces.append(SchedulingFace(api=api, peer=peer, cluster=cluster, elector=elector, mode=c.controlMode,
                             defaults=request_defaults(d), node_policy=d.settings.nodeSchedulerPolicy,
                             ignored=ignored, extender_listen=listen, extender_of=extender_of,
                             extender_tls=tls, extender_client_ca=client_ca, extender_group=c.frontGroup,
                             extender_forward_tls=forward_tls,
                             scheduler_names=tuple(c.extenderSchedulerNames), legacy_metrics=c.legacyMetrics))
    return faces


async def _reconcile_loop(d: Daemon, liveness) -> None:
    while True:
        await trio.sleep(d.config.reconcileInterval)
        try:
            await d.service.reconcile(liveness)
        except Exception as e:  # a pass that failed (the ledger busy, a disk error): the next one retries
            log.error("reconcile pass failed", error=repr(e)[:500])


# How often the priority hold lists are brought up to date: a new high-priority process is held behind
# within about this long (its NVML pid is in its region once it has a context); NVML itself shows a busy
# neighbour about once a second, so a shorter pass would gain little.
PRIORITY_PASS_S = 1.0


async def _guard_watchdog(d: Daemon) -> None:
    """Every second, outside the pass's thread: a stuck pass (NVML not answering) must not keep a container
    the bypass guard stopped stopped (hamid/shimlimits/bypass.py STALE_S)."""
    while True:
        await trio.sleep(PRIORITY_PASS_S)
        d.service.core.resume_if_stale()


async def _priority_loop(d: Daemon) -> None:
    try:
        while True:
            await trio.sleep(PRIORITY_PASS_S)
            try:
                await d.service.priority_pass()
            except Exception as e:  # the next pass retries
                log.error("priority pass failed", error=repr(e)[:500])
    finally:  # a container the bypass guard stopped must not stay stopped after the daemon
        d.service.resume_stopped()


async def _mps_loop(d: Daemon) -> None:
    """Health of the GPUs' MPS control daemons, every ``mpsCheckInterval``."""
    while True:
        await trio.sleep(d.config.mpsCheckInterval)
        try:
            await d.service.mps_check()
        except Exception as e:  # a check that failed (the ledger busy): the next one retries
            log.error("MPS check failed", error=repr(e)[:500])


async def run(d: Daemon, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled or signalled."""
    sock = d.state_dir / SOCKET_NAME
    try:
        faces = await build_faces(d)
        liveness = {}
        for f in faces:
            liveness.update(liveness_of(f))
        await d.service.drain_released()
        await d.service.reconcile(liveness)
        # before any face serves: the limits files are written without fsync (NodeCore._container_files)
        await d.service.restore_limits_files()
        # What is made by now lives as long as the daemon (modules, the Kubernetes client, gRPC, the
        # faces): out of the collector's sight, a full collection walks only what came after. Measured
        # with bench/allocate.py (issue 25): full collections under kubelet's calls 45-48 ms -> 4 ms.
        gc.collect()
        gc.freeze()
        health = d.face_health
        async with trio.open_nursery() as nursery:
            for f in faces:
                await nursery.start(supervised, f, health)
            try:
                await d.service.mps_check()  # adopt running control daemons (after the faces subscribed)
            except Exception as e:
                log.error("MPS check failed", error=repr(e)[:500])
            nursery.start_soon(_reconcile_loop, d, liveness)
            nursery.start_soon(_priority_loop, d)
            nursery.start_soon(_guard_watchdog, d)
            if d.core.facts.mps_control:
                nursery.start_soon(_mps_loop, d)
            nursery.start_soon(_wait_for_signal, nursery.cancel_scope)
            log.info("serving", socket=str(sock), faces=[f.name for f in faces],
                     metrics_port=d.config.metricsPort or None)
            task_status.started()
    finally:
        for path in (sock, d.state_dir / DOCKER_SOCKET_NAME):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        d.close()
        log.info("stopped")


async def _wait_for_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("shutting down", signal=signal.Signals(signum).name)
            scope.cancel()
            return
