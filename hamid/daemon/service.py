"""``hamid run``: the parts as tasks in one trio nursery.

Start-up order: read the devices (the first log line says NVML or simulated),
take the state directory's lock, open the ledger and record the inventory,
reconcile once, then serve the local API and the metrics and reconcile
periodically until SIGINT or SIGTERM. Blocking calls (NVML, SQLite) run in
worker threads.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve

from .. import __version__
from ..config import Config, NodeSettings
from ..devices import DeviceBackend, open_backend
from ..errors import HamidError
from ..ledger import Ledger
from ..localapi import SOCKET_NAME
from ..localapi.server import build_app
from ..logs import get_logger
from ..metrics.exporter import LedgerCollector, metrics_app, new_registry
from .dirwatch import DirWatch
from .inventory import capacity_views
from .nodefacts import write_facts
from ..runtime.liveness import docker_alive
from ..runtime import released
from ..runtime.layout import CONTAINERS_DIR, RELEASED_DIR
from ..shimregion import register_collector
from .reconcile import Reconciler, destroy_mig_of

log = get_logger("daemon")

LEDGER_NAME = "ledger.db"
LOCK_NAME = "hamid.lock"


@dataclass
class Daemon:
    config: Config
    settings: NodeSettings
    node: str
    state_dir: Path
    backend: DeviceBackend
    ledger: Ledger
    reconciler: Reconciler

    @property
    def backend_label(self) -> str:
        return f"{self.backend.kind} ({self.backend.description})"


def _take_lock(state_dir: Path) -> int:
    fd = os.open(state_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise HamidError(f"another hamid daemon is running on state dir {state_dir}") from None
        raise
    return fd


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


def prepare(config: Config, settings: NodeSettings, node: str) -> Daemon:
    """Everything before serving; raises HamidError with a message for the user."""
    os.umask(0o077)  # every file and socket the daemon makes is private
    backend = open_backend(simulate=settings.simulate, node_name=node,
                           mig_enabled=settings.operatingMode == "mig", state_dir=Path(config.stateDir))
    gpus = backend.gpus()
    log.info("hamid starting", devices=backend.kind, inventory=backend.description, node=node,
             gpus=len(gpus), version=__version__, state_dir=config.stateDir, mode=settings.operatingMode)
    state_dir = Path(config.stateDir)
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise HamidError(f"cannot create state dir {state_dir}: {e.strerror}") from None
    for g in gpus:
        if g.mig_capable and (g.mig_enabled != (settings.operatingMode == "mig")):
            log.warning("GPU MIG mode differs from operatingMode; the GPU's real mode wins",
                        gpu=g.index, mig_enabled=g.mig_enabled, operating_mode=settings.operatingMode)
    ledger = Ledger(state_dir / LEDGER_NAME)
    ledger.set_inventory(node, capacity_views(gpus, settings), settings.gpuSchedulerPolicy)
    shim = install_shim_for(config, state_dir)
    write_facts(state_dir, {
        "devices": {"kind": backend.kind, "node": node, "mig_enabled": settings.operatingMode == "mig",
                    "simulate": backend.description if backend.kind == "simulated" else None},
        "defaults": {"memory_mib": settings.defaultMemory, "cores": settings.defaultCores,
                     "gpu_num": settings.defaultGPUNum},
        "node_policy": settings.nodeSchedulerPolicy,
        "gpu_minors": {g.uuid: g.minor for g in gpus if g.minor is not None},
        "dev_root": config.devRoot, "caps_root": config.migCapsRoot,
        "shim": shim,
    })
    reconciler = Reconciler(ledger, backend)
    reconciler.register("docker", docker_alive(config.dockerStartGrace))
    return Daemon(config, settings, node, state_dir, backend, ledger, reconciler)


def install_shim_for(config: Config, state_dir: Path) -> dict:
    """Install the shim (versioned, atomic) and the ld.so.preload file next to it."""
    from ..shiminstall import ShimInstallError, install_shim

    candidates = [config.shimLibrary] if config.shimLibrary else [
        str(Path(__file__).resolve().parents[2] / "shim" / "build" / "libvgpu.so"), "/usr/lib/hamid/libvgpu.so"]
    src = next((c for c in candidates if Path(c).exists()), None)
    if src is None:
        if config.shimLibrary:
            raise HamidError(f"shimLibrary {config.shimLibrary} does not exist")
        log.warning("no shim found; containers asking for memory or compute limits will be refused",
                    looked_in=candidates)
        return {"library": None, "preload": None}
    dest = state_dir / "shim"
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


async def _serve_app(app, bind: str, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    cfg = HyperConfig()
    cfg.bind = [bind]
    cfg.accesslog = None
    cfg.errorlog = None
    cfg.graceful_timeout = 1.0
    await serve(app, cfg, task_status=task_status)


def gossip_service(d: Daemon):
    """The gossip service when ``gossipListen`` is set, else None. Its capacity
    document is read from the ledger in a worker thread."""
    c = d.config
    if not c.gossipListen:
        return None
    from ..gossip.keyring import Keyring
    from ..gossip.params import GossipParams
    from ..gossip.service import GossipService

    keyring = Keyring.load(c.gossipKeyFile) if c.gossipKeyFile else None
    if keyring is None:
        log.warning("gossip without a key: frames are neither encrypted nor authenticated (gossipKeyFile)")
    return GossipService(d.node, c.gossipListen, params=GossipParams.from_config(c), seeds=tuple(c.gossipJoin),
                         advertise=c.gossipAdvertise, keyring=keyring, read_view=d.ledger.view,
                         read_stamp=d.ledger.change_stamp)


def _committed(commits, gossip, result: str) -> None:
    commits.labels(result).inc()
    if gossip is not None and result == "ok":
        gossip.poke()


def drain_released(d: Daemon) -> list[str]:
    """Finish the releases that poststop hooks left as markers (blocking)."""
    def release(owner: str) -> dict | None:
        r = d.ledger.release(owner)
        return r.to_dict() if r else None

    done = released.drain(str(d.state_dir), release, lambda res: destroy_mig_of(d.backend, res))
    for cid in done:
        log.info("released", owner=f"docker:{cid}", by="poststop")
    return done


async def _drain_loop(d: Daemon) -> None:
    """Drain poststop markers as they appear: an inotify watch on the markers'
    directory wakes the loop (an idle daemon does not wake at all); where no
    watch can be had, it polls every ``releasePollInterval``. With a watch it
    still looks every ``reconcileInterval``, a net for anything a watch missed."""
    rdir = d.state_dir / RELEASED_DIR
    watch: DirWatch | None = None
    polling = False
    try:
        while True:
            if polling:
                await trio.sleep(d.config.releasePollInterval)
            elif watch is None or watch.broken:  # (re)open, then look at once: a marker may predate the watch
                if watch is not None:
                    watch.close()
                try:
                    rdir.mkdir(mode=0o700, exist_ok=True)
                except OSError as e:  # the state dir itself is gone or unwritable: look again later
                    log.warning("cannot create the release markers' directory", path=str(rdir), error=e.strerror)
                    watch = None
                    await trio.sleep(d.config.reconcileInterval)
                    continue
                watch = DirWatch.open(str(rdir))
                polling = watch is None
            else:
                with trio.move_on_after(d.config.reconcileInterval):
                    await watch.wait()
            if released.pending(str(d.state_dir)):
                await trio.to_thread.run_sync(drain_released, d)
    finally:
        if watch is not None:
            watch.close()


async def _reconcile_loop(d: Daemon) -> None:
    while True:
        await trio.sleep(d.config.reconcileInterval)
        await trio.to_thread.run_sync(d.reconciler.run_once)


async def run(d: Daemon, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve until cancelled or signalled."""
    lock_fd = _take_lock(d.state_dir)
    sock = d.state_dir / SOCKET_NAME
    try:
        _clear_stale_socket(sock)
        await trio.to_thread.run_sync(drain_released, d)
        await trio.to_thread.run_sync(d.reconciler.run_once)
        registry, commits = new_registry()
        registry.register(LedgerCollector(d.ledger, lambda: d.backend_label))
        # What the shim measures inside each Docker container (its region file).
        register_collector(registry, d.state_dir / CONTAINERS_DIR, lambda name: ("docker", name, "main"))
        gossip = gossip_service(d)
        if gossip is not None:
            registry.register(gossip.collector())
        api = build_app(d.ledger, d.backend_label, d.settings.nodeSchedulerPolicy,
                        on_commit=lambda result: _committed(commits, gossip, result),
                        cluster=gossip.cluster_document if gossip is not None else None)
        async with trio.open_nursery() as nursery:
            await nursery.start(_serve_app, api, f"unix:{sock}")
            os.chmod(sock, 0o600)
            if d.config.metricsPort:
                await nursery.start(_serve_app, metrics_app(registry),
                                    f"{d.config.metricsAddress}:{d.config.metricsPort}")
            if gossip is not None:
                await nursery.start(gossip.run)
            nursery.start_soon(_reconcile_loop, d)
            nursery.start_soon(_drain_loop, d)
            nursery.start_soon(_wait_for_signal, nursery.cancel_scope)
            log.info("serving", socket=str(sock), metrics_port=d.config.metricsPort or None)
            task_status.started()
    finally:
        try:
            sock.unlink()
        except FileNotFoundError:
            pass
        d.ledger.close()
        d.backend.close()
        os.close(lock_fd)
        log.info("stopped")


async def _wait_for_signal(scope: trio.CancelScope) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("shutting down", signal=signal.Signals(signum).name)
            scope.cancel()
            return
