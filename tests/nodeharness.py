"""A node core over a fresh state directory, as the daemon would set it up
(``hamid.daemon.service.prepare``: lock, inventory, shim, facts), for tests
that drive the node without starting a daemon process."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hamid.config import load_config, resolve_node
from hamid.daemon import service


def make_node(state: Path, simulate: str = "H100:2", mode: str = "hami-core", node: str = "node-t", **extra):
    """A prepared :class:`hamid.daemon.service.Daemon`; call ``.close()`` when done."""
    overrides = {"stateDir": str(state), "simulate": simulate, "operatingMode": mode, "nodeName": node,
                 **extra}
    config = load_config(None, overrides)
    settings = resolve_node(config, node)
    return service.prepare(config, settings, node)


def admit_docker(d, specs: dict[str, str], kind: str = "docker") -> tuple[dict[str, Path], str]:
    """Admits one Docker container per ``specs`` item (container id -> its HAMI_VGPU_SPEC) on GPU 0 of the
    prepared daemon ``d`` (``kind`` "pod": as pods ``ns/<id>`` with that uid); returns each one's limits file on
    the host and the GPU's UUID."""
    from hamid.node import layout
    from hamid.node.identity import Owner
    from hamid.node.realize import slot_assignment, slot_name
    from hamid.request import parse_docker_env

    got = {cid: d.core.admit(Owner(kind, cid, name=f"ns/{cid}" if kind == "pod" else ""),
                             parse_docker_env(["HAMI_VISIBLE_DEVICES=0", f"HAMI_VGPU_SPEC={spec}"], cid)).reservation
           for cid, spec in specs.items()}
    limits = {cid: Path(layout.limits_file(d.state_dir, slot_name(r, "main"))) for cid, r in got.items()}
    return limits, slot_assignment(next(iter(got.values())), "main").devices[0].uuid


# A process that maps a file (the shim the daemon installed, as its preload does) and waits: argv[1] the file
MAPPER = """
import mmap, sys
f = open(sys.argv[1], "rb")
m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
print("ok", flush=True)
sys.stdin.read()
"""


def limited_process(limits: Path, argv: list[str]) -> subprocess.Popen:
    """``argv`` in a mount namespace of its own that shows ``limits`` at the shim's fixed path, as a container
    of the daemon's does; it prints "ok" first."""
    from hamid.node.layout import LIMITS_IN_CONTAINER

    top = "/" + "/".join(LIMITS_IN_CONTAINER.strip("/").split("/")[:2])
    script = (f'mount -t tmpfs none {top} && mkdir -p "$(dirname {LIMITS_IN_CONTAINER})" && '
              f'touch {LIMITS_IN_CONTAINER} && mount --bind "$0" {LIMITS_IN_CONTAINER} && exec "$@"')
    p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script, str(limits), *argv],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ok"
    return p


def busy_gpu(d, uuid: str, pids) -> None:
    """NVML's stand-in: the GPU 100 % busy, each of ``pids`` read at that share (time-sliced)."""
    from hamid.devices.types import BusyReading

    d.core.backend.busy = lambda: {uuid: BusyReading(busy_pct=100.0, busy_pids=frozenset(pids), pids=frozenset(pids),
                                                     pid_busy={p: 100.0 for p in pids})}


def installed_shims(d, state: Path) -> list[Path]:
    from hamid.node import layout

    got = sorted((state / layout.SHIM_DIR).glob("libvgpu.so.*"))
    if not got:
        d.close()
        pytest.skip("no shim built (make shim)")
    return got
